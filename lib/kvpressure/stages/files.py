"""A stage's result in its file, ``analysis/<stage>.json``, and back.

The JSON is written with sorted keys, plain Python numbers and ``null`` for what is not finite,
holding only the fields the producer set: identical inputs give identical bytes. Reading
validates the file against the stage's type, so a hand-edited or stale file is refused naming
the file and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kvpressure.errors import InputError
from kvpressure.stages.results import (
    STAGE_TYPES,
    CollectInfo,
    ComparisonResult,
    InterferenceResult,
    KneeResult,
    RecomputeResult,
    RunStages,
    StageResult,
    VerdictResult,
)

ANALYSIS_DIR = "analysis"

# Each stage and the notebook that writes it, in stage order.
STAGES: dict[str, str] = {t.STAGE: t.NOTEBOOK for t in STAGE_TYPES}

R = TypeVar("R", bound=StageResult)


def stage_path(run_dir: str | os.PathLike[str], stage: str) -> Path:
    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return Path(run_dir) / ANALYSIS_DIR / f"{stage}.json"


def has_stage(run_dir: str | os.PathLike[str], kind: type[StageResult]) -> bool:
    return stage_path(run_dir, kind.STAGE).is_file()


def plain(value: Any, where: str) -> Any:
    """numpy/pandas scalars and arrays as Python values, tuples as lists, non-finite floats as
    None; TypeError naming ``where`` for anything JSON cannot hold. A typed part (a model the
    analysis returned) is kept as it is: it is made plain when its file is written."""
    if isinstance(value, BaseModel):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return plain(value.tolist(), where)
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{where}: cannot store {type(value).__name__} in a stage result")


def as_result(kind: type[R], values: Mapping[str, Any]) -> R:
    """A stage's result from the mapping its analysis built (numpy values made plain first, so
    that an integer count stays an integer)."""
    return kind.model_validate(plain(values, kind.STAGE))


def stage_text(result: StageResult) -> str:
    """The file's text: the fields the producer set, sorted, two-space indented."""
    data = plain(result.model_dump(exclude_unset=True), result.STAGE)
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_stage(run_dir: str | os.PathLike[str], result: StageResult) -> Path:
    """Write ``result`` to ``run_dir/analysis/<stage>.json``."""
    path = stage_path(run_dir, result.STAGE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stage_text(result), encoding="utf-8")
    return path


def read_stage(run_dir: str | os.PathLike[str], kind: type[R]) -> R:
    """Read ``analysis/<stage>.json`` as ``kind``; InputError naming the notebook to run when it
    is absent, or the file and field when it does not hold a ``kind``."""
    path = stage_path(run_dir, kind.STAGE)
    if not path.is_file():
        raise InputError(
            f"{path}: missing; run notebooks/{kind.NOTEBOOK}.ipynb (or `kvpressure report`)"
            " first"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}, line {exc.lineno}: not valid JSON: {exc.msg}") from None
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path}: not a {kind.STAGE} result ({_fields(exc)}); re-run "
                         f"notebooks/{kind.NOTEBOOK}.ipynb or `kvpressure report`") from None


# What pydantic appends to a location for each member of a union (``t0.float``, ``t0.int``).
_TYPE_TAGS = {"float", "int", "bool", "str", "none"}


def _fields(exc: ValidationError) -> str:
    """The first complaint about each field, by its dotted path (union members folded)."""
    first: dict[str, str] = {}
    for err in exc.errors():
        path = ".".join(str(x) for x in err["loc"]
                        if not (isinstance(x, str) and (x in _TYPE_TAGS or "[" in x)))
        first.setdefault(path, err["msg"])
    return "; ".join(f"field '{k}': {v}" if k else v for k, v in list(first.items())[:5])


def read_stages(run_dir: str | os.PathLike[str]) -> RunStages:
    """Every stage's result in ``run_dir`` (InputError naming the first missing or bad file)."""
    return RunStages(
        collect=read_stage(run_dir, CollectInfo),
        recompute=read_stage(run_dir, RecomputeResult),
        knee=read_stage(run_dir, KneeResult),
        compare=read_stage(run_dir, ComparisonResult),
        interference=read_stage(run_dir, InterferenceResult),
        verdict=read_stage(run_dir, VerdictResult),
    )
