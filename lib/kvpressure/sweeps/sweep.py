"""Sweeps: every variant of an experiment at every concurrency level (or request rate).

Each point is simulated event-driven with the experiment's cost model and a Prometheus
recorder, and written to ``out_dir/points/<variant>/c<concurrency>/`` (``summary.json``,
``steps.csv``, ``requests.csv``, ``metrics.prom.jsonl``); open-loop points go to
``r<rate>``. ``runs.csv`` collects one row per point with the ``runs`` columns of
``docs/interfaces.md#runs-csv`` plus ``seed`` and ``repeat`` and the engine arguments in force.

Repeats (the comparison's ``seeds``): every point is run once more for each further workload
seed. Repeat 0 is the experiment's own seed and the only one with a point folder; the other
repeats exist for the run-to-run noise, so they run without the Prometheus recorder, write no
files and leave only their ``runs.csv`` row. Points run in worker processes; rows and files do
not depend on the number of workers or on completion order.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.simulation.experiment import (
    ENGINE_ARGS,
    MAX_SEEDS,
    Experiment,
    load_experiment,
)
from kvpressure.sweeps.point_marker import complete_row, point_key, write_point_marker

RUNS_COLUMNS = (
    "run", "variant", "concurrency", "request_rate", "num_requests", "duration_s",
    "request_throughput", "output_throughput", "total_token_throughput", "ttft_mean_s",
    "ttft_p95_s", "itl_mean_s", "itl_p95_s", "itl_p99_s", "e2e_mean_s", "preemptions",
    "recomputed_tokens", "recompute_ratio", "recompute_ratio_low", "recompute_ratio_high",
    "mean_running", "max_running", "mean_kv_usage", "source",
)
EXTRA_COLUMNS = (
    "requests_preempted", "total_scheduled_tokens", "prefill_tokens", "decode_tokens",
    "steps", "max_kv_usage", "recompute_time_s", "recompute_time_share", "refused_requests",
)
# Which request set a row measured: the workload seed and its repeat index (0 = the
# experiment's own seed, whose point folder exists).
REPEAT_COLUMNS = ("seed", "repeat")
SETTING_COLUMNS = tuple(ENGINE_ARGS)


@dataclass(frozen=True)
class _PointJob:
    index: int
    variant: str
    overrides: dict[str, Any]
    concurrency: int | None
    request_rate: float | None
    folder: str | None
    """Where the point's files go; None for a repeat, which writes none."""
    repeat: int = 0
    seed: int | None = None
    key: str = ""
    """What determines the point's results (its folder's completion marker must match)."""


def _level_name(concurrency: int | None, request_rate: float | None) -> str:
    return f"c{concurrency}" if concurrency is not None else f"r{request_rate:g}"


def point_folder(variant: str, concurrency: int | None = None,
                 request_rate: float | None = None) -> str:
    """``points/<variant>/c<concurrency>`` (closed loop) or ``points/<variant>/r<rate>``."""
    return f"points/{variant}/{_level_name(concurrency, request_rate)}"


def _run_point(experiment: Experiment, job: _PointJob, out_dir: str) -> dict[str, Any]:
    """Simulate one point, write its folder (repeat 0), return its ``runs`` row (in a worker)."""
    from kvpressure.simulation.engine import simulate

    point = experiment.point(concurrency=job.concurrency, request_rate=job.request_rate,
                             overrides=job.overrides, variant=job.variant, seed=job.seed,
                             with_recorder=job.folder is not None)
    result = simulate(point.scenario, cost_model=point.cost_model, recorder=point.recorder,
                      fast_path="leap")
    if job.folder is not None:
        result.write(Path(out_dir) / job.folder)
    row = _row(experiment, job, point, result.summary)
    if job.folder is not None:
        write_point_marker(Path(out_dir) / job.folder, job.key, row)
    return row


def _row(experiment: Experiment, job: _PointJob, point: Any, s: dict[str, Any]
         ) -> dict[str, Any]:
    ratio = float(s["recompute_ratio"])
    duration = float(s.get("duration_s") or 0.0)
    recompute_time = float(s.get("recompute_time_s") or 0.0)
    level = _level_name(job.concurrency, job.request_rate)
    run = f"{experiment.name}/{job.variant}/{level}"
    row: dict[str, Any] = {
        "run": run if job.repeat == 0 else f"{run}/seed{point.scenario.seed}",
        "variant": job.variant,
        "concurrency": job.concurrency,
        "request_rate": job.request_rate,
        "num_requests": s["num_requests"],
        "duration_s": duration,
        "request_throughput": s.get("request_throughput"),
        "output_throughput": s.get("output_throughput"),
        "total_token_throughput": s.get("total_token_throughput"),
        "ttft_mean_s": s.get("ttft_mean_s"),
        "ttft_p95_s": s.get("ttft_p95_s"),
        "itl_mean_s": s.get("itl_mean_s"),
        "itl_p95_s": s.get("itl_p95_s"),
        "itl_p99_s": s.get("itl_p99_s"),
        "e2e_mean_s": s.get("e2e_mean_s"),
        "preemptions": s["preemptions"],
        "recomputed_tokens": s["recomputed_tokens"],
        "recompute_ratio": ratio,
        # the simulation knows every recomputed token: the range collapses to the value
        "recompute_ratio_low": ratio,
        "recompute_ratio_high": ratio,
        "mean_running": s["mean_running"],
        "max_running": s["max_running"],
        "mean_kv_usage": s["mean_kv_usage"],
        "source": "simulation",
        "seed": point.scenario.seed,
        "repeat": job.repeat,
        "requests_preempted": s["requests_preempted"],
        "total_scheduled_tokens": s["total_scheduled_tokens"],
        "prefill_tokens": s["prefill_tokens"],
        "decode_tokens": s["decode_tokens"],
        "steps": s["steps"],
        "max_kv_usage": s["max_kv_usage"],
        "recompute_time_s": recompute_time,
        "recompute_time_share": recompute_time / duration if duration > 0 else 0.0,
        "refused_requests": int(point.scenario.annotations.get("refused_requests", 0) or 0),
    }
    for key in SETTING_COLUMNS:
        row[key] = point.settings.get(key)
    return row


def _point_jobs(experiment: Experiment, variants: Mapping[str, Mapping[str, Any]],
                levels: Sequence[float], seeds: Sequence[int], write_points: bool
                ) -> list[_PointJob]:
    """Variant by variant (baseline first), repeat by repeat, level by level."""
    closed = experiment.mode == "closed"
    from kvpressure import __version__

    identity = (__version__, experiment.config.model_dump(mode="json"),
                repr(experiment.hardware), repr(experiment.model))
    out: list[Any] = []
    for name, overrides in variants.items():
        for repeat, seed in enumerate(seeds):
            for level in levels:
                c = int(level) if closed else None
                r = None if closed else float(level)
                folder = point_folder(name, c, r) if write_points and repeat == 0 else None
                key = point_key(identity, name, dict(overrides), c, r, int(seed))
                out.append(_PointJob(len(out), name, dict(overrides), c, r, folder, repeat,
                                     int(seed), key))
    return out


def resolve_variants(experiment: Experiment,
                     variants: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None,
                     include_remedies: bool = False, compare: bool = True
                     ) -> dict[str, dict[str, Any]]:
    """The variants to run: all of the experiment's (baseline first), a subset by name, or an
    explicit ``{name: overrides}`` mapping. ``compare=False`` keeps only the baseline."""
    known = experiment.variants(include_remedies=True)
    if variants is None:
        chosen = experiment.variants(include_remedies=include_remedies)
    elif isinstance(variants, Mapping):
        chosen = {str(k): dict(v) for k, v in variants.items()}
    else:
        chosen = {}
        for name in variants:
            if name not in known:
                raise InputError(f"variant {name!r}: not in experiment {experiment.name!r}; "
                                 f"known: {', '.join(known)}")
            chosen[name] = known[name]
    if not compare:
        chosen = {k: v for k, v in chosen.items() if k == "baseline"} or {"baseline": {}}
    for name in chosen:
        if not name or "/" in name or name.startswith("."):
            raise InputError(f"variant name {name!r} cannot name a folder")
    return chosen


def run_sweep(
    experiment: Experiment | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    variants: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None,
    concurrencies: Sequence[float] | None = None,
    executor: Executor | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    jobs: int | None = None,
    include_remedies: bool = False,
    compare: bool = True,
    seeds: int | None = None,
    write_points: bool = True,
) -> Any:
    """Simulate every (variant, seed, level) point; write the point folders and ``runs.csv``.

    ``concurrencies`` are the levels to run (request rates for an open-loop experiment);
    default: the experiment's. ``seeds`` is how many workload seeds each point runs with
    (default: the comparison's ``seeds``; 1 = the experiment's seed alone). ``write_points=False``
    writes no point folder at all (every point then runs without the recorder; only
    ``runs.csv``). ``executor`` runs the points (default: a process pool of ``jobs`` workers,
    2 unless given; ``jobs=1`` runs in this process). ``progress`` receives one line per
    finished point. Returns the ``runs`` DataFrame (also in ``out_dir/runs.csv``), rows ordered
    by variant (baseline first), then repeat, then level.
    """
    import pandas as pd

    from kvpressure.simulation.experiment import repeat_seeds

    exp = experiment if isinstance(experiment, Experiment) else load_experiment(experiment)
    chosen = resolve_variants(exp, variants, include_remedies=include_remedies,
                              compare=compare)
    levels = sorted(concurrencies) if concurrencies is not None else exp.levels
    if not levels:
        raise InputError(f"experiment {exp.name!r}: no concurrency levels to run")
    if seeds is not None and not 1 <= int(seeds) <= MAX_SEEDS:
        raise InputError(f"seeds: must be between 1 and {MAX_SEEDS}, got {seeds}")
    seed_list = exp.seeds if seeds is None else repeat_seeds(exp.seed, int(seeds))
    # Validate every variant's engine arguments and pool before starting any worker.
    for name, overrides in chosen.items():
        try:
            exp.settings(overrides)
        except InputError as exc:
            raise InputError(f"variant {name!r}: {exc}") from None
    if exp.mode == "closed":
        for seed in seed_list:  # drawn once here, shipped to the workers with the experiment
            exp.requests_for_seed(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    point_jobs = _point_jobs(exp, chosen, levels, seed_list, write_points)
    rows: list[dict[str, Any] | None] = [None] * len(point_jobs)
    point_jobs = _keep_complete_points(point_jobs, out, rows)
    started = time.perf_counter()

    def report(job: _PointJob, row: dict[str, Any], done: int) -> None:
        if progress is None:
            return
        level = (f"concurrency {job.concurrency}" if job.concurrency is not None
                 else f"request rate {job.request_rate:g}/s")
        if job.repeat:
            level += f" (seed {job.seed})"
        progress(f"[{done}/{len(point_jobs)}] {job.variant} {level}: "
                 f"{row['output_throughput']:.0f} output tok/s, {row['preemptions']} "
                 f"preemptions, recompute ratio {row['recompute_ratio']:.3f} "
                 f"({time.perf_counter() - started:.1f} s)")

    n_jobs = jobs if jobs is not None else min(2, os.cpu_count() or 1)
    if executor is None and (n_jobs <= 1 or len(point_jobs) == 1):
        for done, job in enumerate(point_jobs, start=1):
            row = _run_point(exp, job, str(out))
            rows[job.index] = row
            report(job, row, done)
    else:
        from kvpressure.workers import process_pool, stop_pool

        own = executor is None
        pool = executor if executor is not None else process_pool(n_jobs)
        try:
            futures = {pool.submit(_run_point, exp, job, str(out)): job for job in point_jobs}
            from concurrent.futures import as_completed

            for done, fut in enumerate(as_completed(futures), start=1):
                job = futures[fut]
                row = fut.result()
                rows[job.index] = row
                report(job, row, done)
        except BaseException:
            if own:  # interrupted or failed: the other points are not waited for
                stop_pool(pool)
            raise
        finally:
            if own:
                pool.shutdown(wait=True, cancel_futures=True)
    columns = [*RUNS_COLUMNS, *REPEAT_COLUMNS, *EXTRA_COLUMNS, *SETTING_COLUMNS]
    frame = pd.DataFrame(rows, columns=columns)
    write_runs(frame, out)
    return frame


def _keep_complete_points(jobs: list[_PointJob], out: Path, rows: list[dict[str, Any] | None]
                          ) -> list[_PointJob]:
    """Reuse the point folders an interrupted run finished (their markers checked: same point,
    every file whole), drop every other point folder, and return the jobs left to run."""
    import shutil

    from kvpressure.folders.run_folder import RunFolder

    wanted = {job.folder for job in jobs if job.folder is not None}
    points = RunFolder(out).points_dir
    if points.is_dir():
        for kept in sorted(p for p in points.glob("*/*") if p.is_dir()):
            if kept.relative_to(out).as_posix() not in wanted:
                shutil.rmtree(kept)
        for variant in points.iterdir():
            if variant.is_dir() and not any(variant.iterdir()):
                variant.rmdir()
            elif not variant.is_dir():
                variant.unlink()
    todo = []
    for job in jobs:
        folder = out / job.folder if job.folder is not None else None
        row = complete_row(folder, job.key) if folder is not None and folder.is_dir() else None
        if row is not None:
            rows[job.index] = row
            continue
        if folder is not None and folder.exists():
            shutil.rmtree(folder)
        todo.append(job)
    return todo


def write_runs(frame: Any, out_dir: str | os.PathLike[str]) -> Path:
    """``runs.csv`` (and ``runs.parquet`` when pyarrow is installed)."""
    from kvpressure.folders.run_folder import RunFolder

    return RunFolder(out_dir).write_runs(frame)[0]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
