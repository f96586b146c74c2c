"""The JSON Schemas generated from the models that load the files (``ExperimentFile``,
``Record``): ``python -m kvpressure.schemas`` writes them into ``data/schemas/``; the shipped
files and the check against them are :mod:`kvpressure.schema_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.record.schema import Record
from kvpressure.schema_files import NAMES, TITLES, schema_path, schema_text
from kvpressure.simulation.experiment import ExperimentFile


def generated(name: str) -> dict[str, Any]:
    """The schema of ``name`` from its model."""
    model: Any
    if name == "experiment":
        model = ExperimentFile
    elif name == "record":
        model = Record
    else:
        raise InputError(f"schema {name!r}: one of {', '.join(NAMES)}")
    schema = model.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"{name}.schema.json", **schema, "title": TITLES[name]}


def write_shipped(folder: Path | None = None) -> list[Path]:
    out = []
    for name in NAMES:
        path = (folder or schema_path(name).parent) / f"{name}.schema.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(schema_text(generated(name)), encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_shipped():
        print(p)
