"""The whole investigation in batch: notebooks, then ``record.yaml``, then ``index.html``.

``make_report`` is what ``kvpressure report`` and ``make report`` run. It prepares the run
folder, runs the notebooks with papermill (01, then 02-05 side by side, then 06, which builds
and writes ``record.yaml``), validates that record as it reads it back, and renders the
readable report.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kvpressure.errors import InputError
from kvpressure.folders.layout import NOTEBOOKS_DIR
from kvpressure.folders.output_folder import check_replaceable, output_folder, point_paths_at
from kvpressure.folders.run_folder import RunFolder, display_path
from kvpressure.notebooks.batch import (
    NOTEBOOK_SOURCE_DIR,
    NOTEBOOKS,
    NotebookRun,
    parameter_defaults,
    parameter_names,
    run_notebooks,
)
from kvpressure.user_files import parse_user_yaml

# Set by the command itself; a --param may not override them.
RESERVED = frozenset({"run_dir", "experiment", "source"})


@dataclass(frozen=True)
class ReportResult:
    run_dir: Path
    record_path: Path
    index_path: Path
    notebooks: list[NotebookRun]
    seconds: float


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``["k=v", ...]`` to a dict; values read as YAML scalars (``32`` int, ``true`` bool)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if key in RESERVED:
            raise InputError(f"--param {key}: set by --experiment/--source/--out, not by --param")
        try:
            value = parse_user_yaml(text, f"--param {key}") if text.strip() else ""
        except InputError:
            if text.lstrip()[:1] in "{[":  # a mapping or list, written wrong: say so
                raise
            value = text
        out[key] = value if isinstance(value, str | int | float | bool | list | dict) else text
    return out


def notebook_parameters(
    notebooks: Sequence[str] = NOTEBOOKS, notebooks_dir: str | os.PathLike[str] | None = None
) -> dict[str, set[str]]:
    """Parameter names of each notebook's ``parameters`` cell."""
    source_dir = Path(notebooks_dir) if notebooks_dir else NOTEBOOK_SOURCE_DIR
    return {name: parameter_names(source_dir / f"{name}.ipynb") for name in notebooks}


def _check_params(params: Mapping[str, Any], known: Mapping[str, set[str]]) -> None:
    every = set().union(*known.values()) if known else set()
    unknown = sorted(set(params) - every)
    if unknown:
        raise InputError(
            f"--param {', '.join(unknown)}: no notebook has such a parameter; "
            f"known: {', '.join(sorted(every - RESERVED))}"
        )


def _check_param_types(params: Mapping[str, Any],
                       notebooks_dir: str | os.PathLike[str] | None) -> None:
    """A parameter whose default is a whole number takes one (``focus_concurrency=abc`` would
    otherwise fail inside a notebook); one whose default is a mapping takes a mapping."""
    source_dir = Path(notebooks_dir) if notebooks_dir else NOTEBOOK_SOURCE_DIR
    defaults: dict[str, Any] = {}
    for name in NOTEBOOKS:
        defaults.update(parameter_defaults(source_dir / f"{name}.ipynb"))
    for key, value in params.items():
        default = defaults.get(key)
        if isinstance(default, bool) or default is None:
            continue
        if isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(f"--param {key}={value!r}: expected a whole number")
        if isinstance(default, dict) and not isinstance(value, dict):
            raise InputError(f"--param {key}={value!r}: expected a mapping, e.g. "
                             f"{key}={{max_num_seqs: 256}}")


def experiment_file(experiment: str | os.PathLike[str]) -> Path:
    """The experiment's YAML from a path or the name of a built-in experiment (``seed_case``),
    read the way ``kvpressure sweep`` reads it, so a bad file is refused before any notebook runs."""
    from kvpressure.simulation.experiment import load_experiment

    try:
        exp = load_experiment(experiment)
    except InputError as exc:
        raise InputError(f"--experiment {experiment}: {exc}") from None
    return Path(exp.path) if exp.path is not None else Path(experiment)


def notebook_record(run_dir: str | os.PathLike[str]) -> Path:
    """``record.yaml`` as notebook 06 wrote it, read back and validated (InputError naming the
    file when it is missing or invalid). The record is built once, by the notebook."""
    from kvpressure.record.io import load_record

    path = RunFolder(run_dir).record_path
    if not path.is_file():
        raise InputError(f"{path}: not written; notebook 06_record builds and writes the record "
                         f"(see {Path(run_dir) / NOTEBOOKS_DIR / '06_record.ipynb'})")
    load_record(path)
    return path


def _load_notes(run_dir: Path) -> list[str]:
    """What stage 01 found about the data's load and families, for the console."""
    from kvpressure.stages.files import has_stage, read_stage
    from kvpressure.stages.results import CollectInfo

    if not has_stage(run_dir, CollectInfo):
        return []
    load = read_stage(run_dir, CollectInfo).load
    return list(load.notes) + (
        ["no load in the data: nothing ran or waited while the server was scraped"]
        if load.idle else [])


def make_report(
    out_dir: str | os.PathLike[str],
    *,
    experiment: str | os.PathLike[str] | None = None,
    sources: Sequence[str | os.PathLike[str]] = (),
    params: Mapping[str, Any] | None = None,
    jobs: int = 2,
    force: bool = False,
    notebooks_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    stream: TextIO | None = sys.stderr,
) -> ReportResult:
    """Run the investigation on an experiment (simulated) or on ingested sources."""
    from kvpressure.report.html import render_report

    started = time.perf_counter()
    if (experiment is None) == (not sources):
        raise InputError("give either an experiment file or one or more sources, not both")
    if experiment is not None:
        experiment = experiment_file(experiment)
    for src in sources:
        if not Path(src).exists():
            raise InputError(f"--source {src}: no such file or folder")
    if jobs < 1:
        raise InputError(f"--jobs {jobs}: must be at least 1")
    run_dir = Path(out_dir).resolve()
    check_replaceable(run_dir, force, "report", rerun_ok=True)
    params = dict(params or {})
    _check_params(params, notebook_parameters(notebooks_dir=notebooks_dir))
    _check_param_types(params, notebooks_dir)

    parameters: dict[str, Any] = {
        **params,
        "experiment": str(Path(experiment).resolve()) if experiment is not None else "",
        "source": [str(Path(s).resolve()) for s in sources] if sources else "",
        "jobs": jobs,
    }
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    inputs = [experiment] if experiment is not None else list(sources)
    with output_folder(run_dir, "report", inputs=inputs, force=force, rerun_ok=True) as work:
        runs = run_notebooks(
            work, parameters, jobs=jobs, notebooks_dir=notebooks_dir, progress=say, stream=stream
        )
        # The notebooks ran in the hidden sibling that replaces run_dir once complete: what
        # they show must name run_dir.
        point_paths_at(work, run_dir)
        say("index.html ...")
        notebook_record(work)
        for note in _load_notes(work):
            say(f"note: {note}")
        # Named as it will be: the page is drawn in the hidden sibling that replaces run_dir.
        render_report(work, run_folder=display_path(run_dir))
    folder = RunFolder(run_dir)
    record_path, index_path = folder.record_path, folder.index_path
    runs = [NotebookRun(r.notebook, run_dir / r.output_path.relative_to(work), r.seconds)
            for r in runs]
    seconds = time.perf_counter() - started
    say(f"done in {seconds:.1f} s: {index_path}")
    return ReportResult(run_dir, record_path, index_path, runs, seconds)
