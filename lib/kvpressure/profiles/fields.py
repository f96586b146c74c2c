"""Typed, located reads of profile fields.

Profiles come from hand-edited YAML and from Hugging Face ``config.json`` files; a typo there
must produce a message naming the file, the line (YAML) and the field, not a ``KeyError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError, nearest
from kvpressure.user_files import parse_user_json, parse_user_yaml_with_lines, read_user_text

_MISSING = object()

SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
# One accelerator card: 288 GB is the largest today; a size beyond this is a typo or a unit
# slip (1e30), never a card, and it would size a pool of more blocks than a simulation holds.
MAX_CARD_BYTES = 16 << 40
# Below this a bare number cannot be a size of weights, activations or KV memory in bytes:
# it is GiB or GB with the unit left off.
_SMALLEST_BARE_BYTES = 1 << 20
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: Any, where: str) -> int:
    """Bytes of a size with its unit (``14.96GiB``, ``512MiB``, ``80GB``, ``16e9B``) or a bare
    whole number of bytes (0, or at least 1 MiB); InputError naming ``where`` otherwise. A bare
    ``14.96`` is refused: it is GiB or GB, and the unit decides which."""
    shown = str(text)
    m = _SIZE.fullmatch(shown) if isinstance(text, str | int | float) and not isinstance(
        text, bool) else None
    unit = m.group(2).lower() if m else ""
    if not m or (unit and unit not in SIZE_UNITS):
        raise InputError(f"{where}: expected a size like 14.96GiB, 512MiB or 80GB, got "
                         f"{shown!r}")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise InputError(f"{where}: {shown!r} is not a finite size")
    if not unit and value != 0 and (not value.is_integer() or value < _SMALLEST_BARE_BYTES):
        raise InputError(f"{where}: a bare {shown!r} would be bytes; give the unit, e.g. "
                         f"{m.group(1)}GiB (2**30 bytes) or {m.group(1)}GB (10**9 bytes)")
    size = value * SIZE_UNITS[unit or "b"]
    if size > MAX_CARD_BYTES:
        raise InputError(f"{where}: {shown} is {size / (1 << 40):.3g} TiB, more than any card "
                         f"holds (at most {MAX_CARD_BYTES >> 40} TiB)")
    return int(round(size))


class FieldReader:
    """Reads fields of one mapping, raising ``InputError`` that names source, line and field."""

    def __init__(self, data: Any, source: str, lines: Mapping[str, int] | None = None):
        if not isinstance(data, Mapping):
            raise InputError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
        self.data = data
        self.source = source
        self.lines = dict(lines or {})

    def where(self, field: str) -> str:
        line = self.lines.get(field)
        return f"{self.source} line {line}" if line else self.source

    def error(self, field: str, message: str) -> InputError:
        return InputError(f"{self.where(field)}: field '{field}': {message}")

    def reject_unknown(self, allowed: set[str]) -> None:
        """A misspelt optional field would otherwise be silently ignored."""
        for key in self.data:
            if key not in allowed:
                guess = nearest(str(key), allowed)
                raise self.error(
                    str(key), f"unknown field; did you mean {guess!r}?" if guess else
                    f"unknown field; known fields: {', '.join(sorted(allowed))}"
                )
        for key in self.mapping("sources") if "sources" in allowed else {}:
            if key not in allowed:
                raise self.error("sources", f"source given for unknown field {key!r}")

    def has(self, field: str) -> bool:
        return self.data.get(field) is not None

    def raw(self, field: str, default: Any = _MISSING) -> Any:
        value = self.data.get(field)
        if value is None:
            if default is _MISSING:
                raise InputError(f"{self.source}: missing required field '{field}'")
            return default
        return value

    def string(self, field: str, default: Any = _MISSING) -> str:
        value = self.raw(field, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise self.error(field, f"expected a string, got {value!r}")
        return value

    def boolean(self, field: str, default: Any = _MISSING) -> bool:
        value = self.raw(field, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, bool):
            raise self.error(field, f"expected true or false, got {value!r}")
        return value

    def integer(self, field: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.raw(field, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.error(field, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(field, f"must be >= {minimum}, got {value}")
        return value

    def number(
        self,
        field: str,
        default: Any = _MISSING,
        *,
        positive: bool = True,
        maximum: float | None = None,
    ) -> float:
        value = self.raw(field, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(field, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(field, f"must be a finite number, got {value}")
        if positive and value <= 0:
            raise self.error(field, f"must be > 0, got {value:g}")
        if not positive and value < 0:
            raise self.error(field, f"must be >= 0, got {value:g}")
        if maximum is not None and value > maximum:
            raise self.error(field, f"must be <= {maximum:g}, got {value:g}")
        return value

    def mapping(self, field: str) -> dict[str, Any]:
        value = self.raw(field, {})
        if not isinstance(value, Mapping):
            raise self.error(field, f"expected a mapping, got {value!r}")
        return dict(value)


def read_yaml_with_lines(path: Path) -> tuple[Any, dict[str, int]]:
    """Parse a YAML file; also return the 1-based line of each top-level key."""
    return parse_user_yaml_with_lines(read_user_text(path, "profile"), path)


def read_json(path: Path) -> Any:
    return parse_user_json(read_user_text(path, "profile"), path)


def load_sources(reader: FieldReader) -> dict[str, str]:
    sources = reader.mapping("sources")
    return {str(k): str(v) for k, v in sources.items()}
