"""Values made safe for JSON: one rule for every file kvpressure writes.

JSON has no NaN or infinity, and a missing measurement must never read as a number, so both
become ``null``. numpy scalars become Python numbers, tuples and sets become lists (sets sorted,
so the output is the same from run to run), dataclasses and models become dicts, enums their
values, paths become strings.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import PurePath
from typing import Any

import numpy as np


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or None when it is None, NaN, infinite or not a number."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def to_jsonable(obj: Any) -> Any:
    """``obj`` (a dataclass, dict, list, tuple, set, numpy value, ...) as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if hasattr(obj, "model_dump") and not isinstance(obj, type):  # a typed part (pydantic)
        obj = obj.model_dump()
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, enum.Enum):  # a kind written as its word (YAML has no enum)
        obj = obj.value
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        obj = sorted(obj)
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    return obj
