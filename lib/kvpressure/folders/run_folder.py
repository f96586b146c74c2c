"""The run folder (``reports/<name>/``): :class:`RunFolder` (its files, written and read),
the stages' result files, notebook defaults.

Stages exchange data only through files here. Each notebook writes ``analysis/<stage>.json``
with :func:`write_stage` and reads earlier ones with :func:`kvpressure.stages.files.read_stage`
(the types and their files: :mod:`kvpressure.stages`).
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.folders.layout import (
    EXPERIMENT_COPY,
    INDEX_HTML,
    INGEST_JSON,
    POINTS_DIR,
    RECORD_YAML,
    RUNS_CSV,
    SERIES_CSV,
    SOURCES_FILE,
)
from kvpressure.folders.output_folder import MARKER, NOTEBOOKS_COMMAND, write_marker
from kvpressure.paths import checkout_root
from kvpressure.stages import files as stages_files
from kvpressure.stages.results import StageResult
from kvpressure.table_files import write_table

R = TypeVar("R", bound=StageResult)
T = TypeVar("T")

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


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as the record shows it: relative to the checkout when inside it (an installed
    package has none: absolute, so it reads back from any working directory)."""
    resolved = Path(path).resolve()
    root = checkout_root()
    try:
        return resolved.relative_to(root).as_posix() if root else resolved.as_posix()
    except ValueError:
        return resolved.as_posix()


class RunFolder:
    """One run folder over its path: where each of its files is, written and read here.

    What it reads it keeps, so the stages and the twin working in one process read each file
    once (a table handed out is a copy: a caller's edits stay its own). Writing a file forgets
    what was read of it. The formats are the ones the folder always had.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._read: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"RunFolder({os.fspath(self.path)!r})"

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    # Where each file is.
    @property
    def runs_path(self) -> Path:
        return self.path / RUNS_CSV

    @property
    def series_path(self) -> Path:
        return self.path / SERIES_CSV

    @property
    def ingest_path(self) -> Path:
        return self.path / INGEST_JSON

    @property
    def sources_path(self) -> Path:
        return self.path / SOURCES_FILE

    @property
    def experiment_path(self) -> Path:
        """The experiment a simulated run was made from, as stage 01 copied it."""
        return self.path / EXPERIMENT_COPY

    @property
    def record_path(self) -> Path:
        return self.path / RECORD_YAML

    @property
    def index_path(self) -> Path:
        return self.path / INDEX_HTML

    @property
    def points_dir(self) -> Path:
        return self.path / POINTS_DIR

    def point_dir(self, name: str) -> Path:
        """A point's folder, ``name`` as the sweep names it (``<variant>/c<C>``)."""
        return self.points_dir / name

    def stage_path(self, stage: str) -> Path:
        return stages_files.stage_path(self.path, stage)

    def has_runs(self) -> bool:
        return self.runs_path.is_file()

    def has_stage(self, kind: type[StageResult]) -> bool:
        return stages_files.has_stage(self.path, kind)

    # Reading.
    def _kept(self, key: str, read: Any) -> Any:
        if key not in self._read:
            self._read[key] = read()
        return self._read[key]

    def derived(self, name: str, make: Callable[[], T]) -> T:
        """What a reader makes of the folder's files (``make()``), made once per folder; the
        caller must not change it."""
        got: T = self._kept(f"derived:{name}", make)
        return got

    def data(self, path: Path) -> bytes:
        """A file of the folder as its bytes, read once (each reader parses them its way)."""
        got: bytes = self._kept(f"bytes:{path}", path.read_bytes)
        return got

    def _csv(self, path: Path, **options: Any) -> pd.DataFrame:
        return pd.read_csv(io.BytesIO(self.data(path)), **options)

    def runs(self) -> pd.DataFrame:
        """``runs.csv`` as pandas reads it by default."""
        frame = self._kept(RUNS_CSV, lambda: self._csv(self.runs_path))
        return frame.copy()

    def series(self) -> pd.DataFrame:
        """``series.csv`` as the stages read it: run, metric and labels as text, no labels
        the empty string."""
        def read() -> pd.DataFrame:
            series = self._csv(self.series_path,
                               dtype={"labels": str, "run": str, "metric": str})
            series["labels"] = series["labels"].fillna("")
            return series

        return self._kept(SERIES_CSV, read).copy()

    def series_as(self, **options: Any) -> pd.DataFrame:
        """``series.csv`` parsed with a reader's own ``pandas.read_csv`` options (the file is
        read once whichever way it is parsed)."""
        return self._csv(self.series_path, **options)

    def ingest(self) -> dict[str, Any]:
        """``ingest.json`` as JSON values ({} when there is none; InputError naming the line
        when it is not JSON)."""
        def read() -> dict[str, Any]:
            if not self.ingest_path.is_file():
                return {}
            try:
                data = json.loads(self.data(self.ingest_path).decode("utf-8"))
            except json.JSONDecodeError as exc:
                raise InputError(f"{self.ingest_path}: line {exc.lineno}: not JSON "
                                 f"({exc.msg})") from None
            return data if isinstance(data, dict) else {}

        return copy.deepcopy(self._kept(INGEST_JSON, read))

    def sources(self) -> list[str]:
        """The sources ``sources.json`` lists as given ([] when it is absent or unreadable)."""
        def read() -> list[str]:
            try:
                text = self.data(self.sources_path).decode("utf-8")
                listed = json.loads(text).get("sources") or []
            except (OSError, ValueError, AttributeError):
                return []
            return [str(s) for s in listed] if isinstance(listed, list) else []

        return list(self._kept(SOURCES_FILE, read))

    def stage(self, kind: type[R]) -> R:
        """``analysis/<stage>.json`` as ``kind`` (:func:`kvpressure.stages.files.read_stage`)."""
        got: R = self._kept(f"stage:{kind.STAGE}",
                            lambda: stages_files.read_stage(self.path, kind))
        return got.model_copy(deep=True)

    # Writing.
    def _forget(self, key: str, path: Path) -> None:
        self._read.pop(key, None)
        self._read.pop(f"bytes:{path}", None)

    def write_runs(self, frame: pd.DataFrame) -> list[Path]:
        """``runs.csv`` (and its parquet twin when pyarrow is there)."""
        self._forget(RUNS_CSV, self.runs_path)
        return write_table(frame, self.runs_path)

    def write_series(self, frame: pd.DataFrame) -> list[Path]:
        self._forget(SERIES_CSV, self.series_path)
        return write_table(frame, self.series_path)

    def write_ingest(self, report: Any) -> Path:
        """``ingest.json``: ``report`` as sorted, two-space indented JSON."""
        self._forget(INGEST_JSON, self.ingest_path)
        self.ingest_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        return self.ingest_path

    def write_sources(self, sources: list[str]) -> Path:
        """``sources.json``: the sources as given (re-analysis expands them again)."""
        self._forget(SOURCES_FILE, self.sources_path)
        self.sources_path.write_text(json.dumps({"sources": sources}, indent=2) + "\n")
        return self.sources_path

    def copy_experiment(self, src: str | os.PathLike[str]) -> Path:
        shutil.copyfile(src, self.experiment_path)
        return self.experiment_path

    def write_stage(self, result: StageResult) -> Path:
        """``analysis/<stage>.json`` (:func:`write_stage`, which also marks the folder)."""
        self._forget(f"stage:{result.STAGE}", self.stage_path(result.STAGE))
        return write_stage(self.path, result)


def as_run_folder(folder: RunFolder | str | os.PathLike[str]) -> RunFolder:
    """``folder`` as a :class:`RunFolder` (one given is kept, with what it has read)."""
    return folder if isinstance(folder, RunFolder) else RunFolder(folder)
