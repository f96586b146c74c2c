"""The run folder (``reports/<name>/``): its layout, the stages' result files, notebook defaults.

Stages exchange data only through files here. Each notebook writes ``analysis/<stage>.json``
with :func:`write_stage` and reads earlier ones with :func:`read_stage`; the JSON is written with
sorted keys and plain Python numbers, so identical inputs give identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.paths import REPO_ROOT
from kvpressure.pipeline.output_folder import MARKER, NOTEBOOKS_COMMAND, write_marker

# The notebooks run with cwd = notebooks/, so their defaults are relative to it.
DEFAULT_EXPERIMENT = "../data/experiments/seed_case.yaml"
DEFAULT_REPORTS = "../reports"
# Replaces the notebooks' default experiment (nbval runs them on a small seeded experiment).
EXPERIMENT_ENV = "KVPRESSURE_NB_EXPERIMENT"

STAGES: dict[str, str] = {
    "collect": "01_collect",
    "recompute": "02_recompute",
    "knee": "03_knee",
    "compare": "04_compare",
    "interference": "05_interference",
    "record": "06_record",
}

EXPERIMENT_COPY = "experiment.yaml"
SOURCES_FILE = "sources.json"
RUNS_CSV = "runs.csv"
SERIES_CSV = "series.csv"
INGEST_JSON = "ingest.json"
RECORD_YAML = "record.yaml"
INDEX_HTML = "index.html"
ANALYSIS_DIR = "analysis"
NOTEBOOKS_DIR = "notebooks"
POINTS_DIR = "points"
# What notebooks run on their own may write into a run folder (besides the marker's files).
RUN_LAYOUT = (EXPERIMENT_COPY, SOURCES_FILE, RUNS_CSV, SERIES_CSV, INGEST_JSON, RECORD_YAML,
              INDEX_HTML, "runs.parquet", "series.parquet")
RUN_LAYOUT_DIRS = (ANALYSIS_DIR, NOTEBOOKS_DIR, POINTS_DIR)


def default_experiment() -> str:
    """The notebooks' default experiment: ``$KVPRESSURE_NB_EXPERIMENT`` or the seed case."""
    return os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


def as_sources(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None) -> list[str]:
    """A notebook's ``source`` parameter as a list of paths ("" or [] = simulate)."""
    if source is None:
        return []
    if isinstance(source, str | os.PathLike):
        text = os.fspath(source).strip()
        return [text] if text else []
    return [os.fspath(s) for s in source if os.fspath(s).strip()]


def default_run_dir(experiment: str | os.PathLike[str] = "", source: Any = "") -> str:
    """``../reports/<name>``: the experiment's file stem, or the first source's name."""
    sources = as_sources(source)
    if sources:
        name = Path(sources[0].rstrip("/")).name.split(".")[0] or "ingested"
        return f"{DEFAULT_REPORTS}/{name}"
    return f"{DEFAULT_REPORTS}/{Path(os.fspath(experiment) or DEFAULT_EXPERIMENT).stem}"


def _plain(value: Any, where: str) -> Any:
    """Convert numpy/pandas scalars and containers to JSON-ready Python values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist(), where)
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{where}: cannot store {type(value).__name__} in a stage result")


def write_stage(run_dir: str | os.PathLike[str], stage: str, result: Mapping[str, Any]) -> Path:
    """Write one stage's results to ``run_dir/analysis/<stage>.json`` (non-finite -> null)."""
    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    path = Path(run_dir) / ANALYSIS_DIR / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_plain(result, stage), indent=2, sort_keys=True, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    if not (Path(run_dir) / MARKER).exists():
        # Notebooks run on their own write in place: mark the folder as the kit's, so that
        # `kvpressure report` may later replace it (a report run has its own marker already).
        write_marker(Path(run_dir), NOTEBOOKS_COMMAND, {}, complete=False)
    return path


def read_stage(run_dir: str | os.PathLike[str], stage: str) -> dict[str, Any]:
    """Read ``analysis/<stage>.json``; InputError naming the notebook to run if it is absent."""
    path = Path(run_dir) / ANALYSIS_DIR / f"{stage}.json"
    if not path.is_file():
        raise InputError(
            f"{path}: missing; run notebooks/{STAGES[stage]}.ipynb (or `kvpressure report`) first"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}, line {exc.lineno}: not valid JSON: {exc.msg}") from None


def has_stage(run_dir: str | os.PathLike[str], stage: str) -> bool:
    return (Path(run_dir) / ANALYSIS_DIR / f"{stage}.json").is_file()


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as the record shows it: relative to the checkout when inside it."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return resolved.as_posix()
