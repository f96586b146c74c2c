"""Validate, write and read ``record.yaml``.

A record is validated before it is written; an invalid one is refused with an
:class:`~kvpressure.errors.InputError` naming the first offending field (``scheduler.policy``),
and nothing is written, so an earlier valid ``record.yaml`` survives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvpressure.errors import InputError
from kvpressure.record.schema import Record
from kvpressure.user_files import parse_user_yaml, read_user_text

HEADER = (
    "# kvpressure investigation record (fields as in the workflow's record form).\n"
    "# Gauges are means over counters.window; counters are increases over it; times in seconds.\n"
)
NULL_NOTE = "# A null is a measurement the data could not give (never zero): 'missing' says why.\n"


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(record)"


def validation_message(exc: ValidationError, where: str = "record") -> str:
    """One line per problem, each naming the field: ``record: field scheduler.policy: ...``."""
    lines = []
    for err in exc.errors():
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        lines.append(f"{where}: field {_field_path(err['loc'])}: {err['msg']}{shown}")
    return "\n".join(lines)


def validate_record(data: Record | dict[str, Any], where: str = "record") -> Record:
    """Return a validated :class:`Record` from a record or a plain mapping; InputError if invalid."""
    payload = data.model_dump(mode="python") if isinstance(data, Record) else data
    if not isinstance(payload, dict):
        raise InputError(f"{where}: expected a mapping at the top level, got {type(payload).__name__}")
    try:
        return Record.model_validate(payload)
    except ValidationError as exc:
        raise InputError(validation_message(exc, where)) from None


def _drop_rate_fields(data: dict[str, Any]) -> None:
    """A concurrency sweep's record reads as it always has: no request-rate fields."""
    from kvpressure.record.schema import RATE_FIELDS

    if data["workload"].get("level_axis") != "concurrency":
        return
    for section, keys in RATE_FIELDS.items():
        if isinstance(keys, dict):
            for sub, names in keys.items():
                for k in names:
                    data[section][sub].pop(k, None)
        else:
            for k in keys:
                data[section].pop(k, None)


def record_to_yaml(record: Record) -> str:
    data = record.model_dump(mode="json")
    _drop_rate_fields(data)
    if data["perf"].get("latency_fidelity") is None:
        data["perf"].pop("latency_fidelity", None)  # measured latencies: nothing to qualify
    header = HEADER + NULL_NOTE if data.get("missing") else HEADER
    if not data.get("missing"):
        data.pop("missing", None)  # a complete record reads as the seed's form
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    return header + body


def write_record(record: Record | dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate ``record`` and write it as YAML to ``path`` (atomically), with its Prometheus
    rules beside it (``prometheus_rules.py``). Returns the record's path."""
    from kvpressure.record.prometheus_rules import RULES_FILE, rules_text
    from kvpressure.schema_files import problems

    path = Path(path)
    valid = validate_record(record, where=str(path))
    # The shipped schema is what other tools check a record with: one the kit wrote must pass.
    drift = problems("record", valid.model_dump(mode="json"))
    if drift:
        raise RuntimeError(f"{path}: the record breaks data/schemas/record.schema.json "
                           f"(regenerate it: python -m kvpressure.schemas): {drift[0]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((path, record_to_yaml(valid)),
                         (path.with_name(RULES_FILE), rules_text(valid))):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    return path


def load_record(path: str | os.PathLike[str]) -> Record:
    """Read and validate a ``record.yaml``."""
    path = Path(path)
    data = parse_user_yaml(read_user_text(path, "record"), path)
    return validate_record(data, where=str(path))
