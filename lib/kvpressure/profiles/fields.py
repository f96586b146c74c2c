"""Typed, located reads of profile fields.

Profiles come from hand-edited YAML and from Hugging Face ``config.json`` files; a typo there
must produce a message naming the file, the line (YAML) and the field, not a ``KeyError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kvpressure.errors import InputError, nearest
from kvpressure.user_files import read_user_text

_MISSING = object()


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
    text = read_user_text(path, "profile")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{line}: not valid YAML: {exc}") from None
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            lines[str(key_node.value)] = key_node.start_mark.line + 1
    return data, lines


def read_json(path: Path) -> Any:
    text = read_user_text(path, "profile")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} line {exc.lineno}: not valid JSON: {exc.msg}") from exc


def load_sources(reader: FieldReader) -> dict[str, str]:
    sources = reader.mapping("sources")
    return {str(k): str(v) for k, v in sources.items()}
