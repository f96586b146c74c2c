"""The shipped JSON Schemas of the files a user writes or keeps (the experiment YAML and
``record.yaml``, in ``data/schemas/``) and the check of a file against them.

This sits below every layer that writes a checked file (``record.yaml`` is checked as it is
written); the schemas are generated from the models that load those files (``ExperimentFile``,
``Record``) by :mod:`kvpressure.schemas` (``python -m kvpressure.schemas``), above the models,
and a test keeps the shipped ones equal to the models, so an editor or another tool checks a
file against the same rules the kit loads it with. ``kvpressure schema NAME FILE...`` validates
files against the shipped schema, naming the file and each bad field's path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.paths import data_dir

NAMES = ("experiment", "record")
TITLES = {"experiment": "kvpressure experiment (YAML)",
           "record": "kvpressure investigation record (record.yaml)"}


def schema_path(name: str) -> Path:
    return data_dir() / "schemas" / f"{name}.schema.json"


def shipped(name: str) -> dict[str, Any]:
    if name not in NAMES:
        raise InputError(f"schema {name!r}: one of {', '.join(NAMES)}")
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


@functools.cache
def _validator(name: str) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(shipped(name))


def problems(name: str, data: Any) -> list[str]:
    """Each way ``data`` breaks the shipped schema, as ``field.path: message``."""
    validator = _validator(name)
    out = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.path))):
        where = ".".join(str(p) for p in err.path) or "(top level)"
        out.append(f"{where}: {err.message}")
    return out


def validate_files(name: str, paths: Iterable[str | Path]) -> None:
    """Refuse the first file that breaks the schema, naming every bad field in it."""
    from kvpressure.user_files import parse_user_yaml, read_user_text

    for path in map(Path, paths):
        data = parse_user_yaml(read_user_text(path, f"{name} file"), path)
        bad = problems(name, data)
        if bad:
            raise InputError(f"{path}: not a valid {name} ({schema_path(name).name}):\n  "
                             + "\n  ".join(bad))
