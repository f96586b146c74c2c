"""Stage 01: fill the run folder with the canonical tables, from a simulated sweep or from data.

A simulation (the default, :mod:`.collect_simulated`) or ingested data
(:mod:`.collect_ingested`); the focus level's rule is :mod:`.focus`, the windows' rules
:mod:`.windows`, the length distributions :mod:`.lengths`.

Either way ``analysis/collect.json`` records what was read, the focus point and its window.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.analysis.levels import REPEAT, repeats_of
from kvpressure.errors import InputError
from kvpressure.folders.run_folder import RunFolder, as_run_folder, as_sources, write_stage
from kvpressure.stages.files import read_stage
from kvpressure.stages.results import CollectInfo


@dataclass
class Tables:
    """What stage 01 left in the run folder, read back."""

    info: CollectInfo
    runs: pd.DataFrame
    series: pd.DataFrame
    steps: pd.DataFrame | None
    requests: pd.DataFrame | None
    folder: RunFolder | None = field(default=None, repr=False)
    """The folder they were read from, holding what it read (the twin reads on from it)."""

    @property
    def baseline_runs(self) -> pd.DataFrame:
        """Every row of the baseline variant (all repeats), by level then repeat."""
        base = self.info.baseline_variant
        part = self.runs[self.runs["variant"].astype(str) == base]
        keys = [c for c in (self.x, REPEAT) if c in part.columns]
        return part.sort_values(keys, kind="stable").reset_index(drop=True)

    @property
    def x(self) -> str:
        """The runs column of the sweep's levels: ``concurrency`` or ``request_rate``."""
        return self.info.level_axis

    @property
    def repeats(self) -> int:
        """How many workload seeds (or repeated runs) each point has."""
        return repeats_of(self.runs)

    @property
    def window(self) -> tuple[float | None, float | None]:
        """Where the focus point's counters are read (the whole level)."""
        return self.info.focus.window

    @property
    def gauge_window(self) -> tuple[float | None, float | None]:
        """Where its gauges are read: the steady part of the load (``load_window``), the
        counters' window when no steady part was told apart."""
        return self.info.focus.gauge_window


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def collect(
    run_dir: str | os.PathLike[str],
    experiment: str | os.PathLike[str] = "",
    source: Any = "",
    *,
    focus_concurrency: int = 0,
    focus_request_rate: float = 0.0,
    engine_args: Mapping[str, Any] | None = None,
    model_name: str = "",
    bench_timezone: str = "",
    columns: Any = "",
    log_year: int = 0,
    log_timezone: str = "",
    jobs: int = 1,
    progress: Callable[[str], None] | None = _stderr,
) -> CollectInfo:
    """Stage 01: write the canonical tables and ``analysis/collect.json``; returns the latter."""
    from kvpressure.investigation.collect_ingested import collect_ingested
    from kvpressure.investigation.collect_simulated import collect_simulation

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sources = as_sources(source)
    say = progress or (lambda _m: None)
    if sources:
        info = collect_ingested(run_dir, sources, focus_concurrency, engine_args or {},
                                 model_name, bench_timezone, columns, log_year, log_timezone,
                                 focus_request_rate=focus_request_rate)
    else:
        if not experiment:
            raise InputError("collect: give an experiment file or a source")
        info = collect_simulation(run_dir, os.fspath(experiment), focus_concurrency,
                                   max(1, int(jobs)), say,
                                   focus_request_rate=focus_request_rate)
    write_stage(run_dir, info)
    return read_stage(run_dir, CollectInfo)


def ensure_collected(
    run_dir: RunFolder | str | os.PathLike[str], experiment: str | os.PathLike[str] = "",
    source: Any = ""
) -> CollectInfo:
    """Stage 01's results; runs stage 01 first when the run folder does not have them yet,
    so any notebook can be opened and run on its own."""
    folder = as_run_folder(run_dir)
    if not folder.has_stage(CollectInfo) or not folder.has_runs():
        return collect(folder.path, experiment, source)
    return folder.stage(CollectInfo)


def load_tables(run_dir: RunFolder | str | os.PathLike[str]) -> Tables:
    """Stage 01's tables: runs, the focus point's series (and steps, requests when simulated)."""
    folder = as_run_folder(run_dir)
    info = folder.stage(CollectInfo)
    steps = requests = None
    point_dir = info.focus.point_dir
    if point_dir:
        steps = pd.read_csv(folder.path / point_dir / "steps.csv")
        requests = pd.read_csv(folder.path / point_dir / "requests.csv")
    return Tables(info, folder.runs(), folder.series(), steps, requests, folder)


def open_run(run_dir: Any = "", experiment: Any = "", source: Any = "") -> Tables:
    """What notebooks 02-06 open with: the plot theme, stage 01's results (running stage 01
    first when the run folder lacks them, so each notebook also runs on its own) and its tables.
    ``run_dir`` may be a :class:`RunContext`. A folder whose inputs changed since stage 01 read
    them is refused (InputError saying to rerun 01)."""
    from kvpressure.folders.run_context import RunContext, check_fresh, current_run
    from kvpressure.report.display import setup_plots

    ctx = run_dir if isinstance(run_dir, RunContext) else current_run(experiment, source, run_dir)
    setup_plots()
    # One folder for the whole opening: stage 01's result is read once, the tables once.
    folder = RunFolder(ctx.run_dir)
    check = folder.has_stage(CollectInfo)
    ensure_collected(folder, ctx.experiment, ctx.source)
    if check:
        check_fresh(folder)
    return load_tables(folder)
