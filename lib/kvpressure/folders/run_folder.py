"""The run folder (``reports/<name>/``): its layout, the stages' result files, notebook defaults.

Stages exchange data only through files here. Each notebook writes ``analysis/<stage>.json``
with :func:`write_stage` and reads earlier ones with :func:`kvpressure.stages.files.read_stage`
(the types and their files: :mod:`kvpressure.stages`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvpressure.folders.output_folder import MARKER, NOTEBOOKS_COMMAND, write_marker
from kvpressure.paths import checkout_root
from kvpressure.stages import files as stages_files
from kvpressure.stages.results import StageResult

# The notebooks run with cwd = notebooks/, so their defaults are relative to it.
DEFAULT_EXPERIMENT = "../data/experiments/seed_case.yaml"
DEFAULT_REPORTS = "../reports"
# Replaces the notebooks' default experiment (nbval runs them on a small seeded experiment).
EXPERIMENT_ENV = "KVPRESSURE_NB_EXPERIMENT"



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


def write_stage(run_dir: str | os.PathLike[str], result: StageResult) -> Path:
    """Write one stage's result to ``run_dir/analysis/<stage>.json`` (:mod:`kvpressure.stages`)
    and mark a folder the notebooks fill on their own as the kit's."""
    path = stages_files.write_stage(run_dir, result)
    if not (Path(run_dir) / MARKER).exists():
        # Notebooks run on their own write in place: mark the folder as the kit's, so that
        # `kvpressure report` may later replace it (a report run has its own marker already).
        write_marker(Path(run_dir), NOTEBOOKS_COMMAND, {}, complete=False)
    return path


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as the record shows it: relative to the checkout when inside it (an installed
    package has none: absolute, so it reads back from any working directory)."""
    resolved = Path(path).resolve()
    root = checkout_root()
    try:
        return resolved.relative_to(root).as_posix() if root else resolved.as_posix()
    except ValueError:
        return resolved.as_posix()
