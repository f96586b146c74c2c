"""Stage 01: fill the run folder with the canonical tables, from a simulated sweep or from data.

Simulation (the default): the experiment's sweep (every concurrency level of every comparison
variant, with each of the comparison's workload seeds) is simulated into
``points/<variant>/c<C>/`` (the experiment's own seed) and ``runs.csv`` (every seed: the
run-to-run noise); the focus point's Prometheus view (``metrics.prom.jsonl``) is ingested into
``series.csv``, the same way a real server's scrapes are.

Ingested data: each source is read with :func:`kvpressure.ingestion.api.ingest`. A source
folder laid out as ``<variant>/c<C>/metrics.prom.jsonl`` (what a sweep writes) becomes one run
per point, with its variant and concurrency taken from the path.

Either way ``analysis/collect.json`` records what was read, the focus point and its window.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.cache_config import cache_config
from kvpressure.ingestion.load_window import clock as _clock
from kvpressure.ingestion.load_window import is_idle, steady_part
from kvpressure.ingestion.server_log import engine_args_from_reports, log_notes
from kvpressure.jsonable import finite_or_none, to_jsonable
from kvpressure.pipeline.levels import REPEAT, repeats_of
from kvpressure.pipeline.run_folder import (
    EXPERIMENT_COPY,
    INGEST_JSON,
    POINTS_DIR,
    RUNS_CSV,
    SERIES_CSV,
    SOURCES_FILE,
    as_sources,
    display_path,
    has_stage,
    read_stage,
    sha256_file,
    write_stage,
)

BASELINE = "baseline"
_LEVEL = re.compile(r"^(?:c|concurrency[-_=]?)(\d+)$")
_SCRAPE_FILES = ("metrics.prom.jsonl", "metrics.prom.jsonl.gz")
# What the stages read from a point's scrapes: the analysis' families and the length histograms.
_LENGTH_HISTOGRAMS = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens")


@dataclass
class Tables:
    """What stage 01 left in the run folder, read back."""

    info: dict[str, Any]
    runs: pd.DataFrame
    series: pd.DataFrame
    steps: pd.DataFrame | None
    requests: pd.DataFrame | None

    @property
    def baseline_runs(self) -> pd.DataFrame:
        """Every row of the baseline variant (all repeats), by level then repeat."""
        base = self.info["baseline_variant"]
        part = self.runs[self.runs["variant"].astype(str) == base]
        keys = [c for c in ("concurrency", REPEAT) if c in part.columns]
        return part.sort_values(keys, kind="stable").reset_index(drop=True)

    @property
    def repeats(self) -> int:
        """How many workload seeds (or repeated runs) each point has."""
        return repeats_of(self.runs)

    @property
    def window(self) -> tuple[float | None, float | None]:
        """Where the focus point's counters are read (the whole level)."""
        focus = self.info["focus"]
        return focus["t0"], focus["t1"]

    @property
    def gauge_window(self) -> tuple[float | None, float | None]:
        """Where its gauges are read: the steady part of the load (``load_window``), the
        counters' window when no steady part was told apart."""
        focus = self.info["focus"]
        return focus.get("gauge_t0", focus["t0"]), focus.get("gauge_t1", focus["t1"])


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- focus and window
def focus_level(baseline_runs: pd.DataFrame, requested: int | None = None) -> tuple[int, str]:
    """The concurrency whose counters the investigation reads, and why that one.

    ``requested`` wins when it is a swept level; otherwise the first level past the knee of the
    baseline curve (the last level when the knee is the last level or there is none). Repeated
    rows of a level (workload seeds) are averaged, as the knee stage does.
    """
    from kvpressure.analysis.knee import find_knee

    levels = sorted(int(c) for c in pd.to_numeric(baseline_runs["concurrency"]).dropna().unique())
    if not levels:
        raise InputError("runs: no concurrency levels to focus on")
    if requested:
        if int(requested) not in levels:
            raise InputError(
                f"focus_concurrency {requested}: not a swept level; levels are "
                f"{', '.join(map(str, levels))}"
            )
        return int(requested), "given as a parameter"
    if len(levels) == 1:
        return levels[0], "the only level measured"
    if len(levels) < 3:
        return levels[-1], "the largest level (too few levels for a knee)"
    knee = find_knee(baseline_runs["concurrency"], baseline_runs["output_throughput"])
    if knee.knee_x is None:
        return levels[-1], "the largest level (throughput still rising: no knee in range)"
    past = [c for c in levels if c > knee.knee_x]
    if not past:
        return levels[-1], f"the largest level (the knee, {knee.knee_x:g}, is the last level)"
    return past[0], f"the first level past the knee at concurrency {knee.knee_x:g}"


def steady_window(requests: pd.DataFrame | None, series: pd.DataFrame) -> tuple[float, float]:
    """The span where the closed loop still holds its full concurrency.

    After the last request is submitted the number in flight only drains, which would dilute
    every gauge; the window ends at that submission (or the last scrape without requests.csv).
    """
    t = pd.to_numeric(series["t"], errors="coerce").dropna()
    if t.empty:
        raise InputError("series: no samples to take a window from")
    t0, t_last = float(t.min()), float(t.max())
    t1 = t_last
    if requests is not None and "arrival_time_s" in requests:
        last_submit = float(pd.to_numeric(requests["arrival_time_s"], errors="coerce").max())
        scrapes = sorted(float(x) for x in t.unique())
        # Snap to the first scrape at or after the last submission: windows end on samples.
        after = [x for x in scrapes if x >= last_submit]
        if after and after[0] > t0:
            t1 = after[0]
    return t0, t1


# --------------------------------------------------------------------------- simulation
def _run_sweep(experiment: Any, run_dir: Path, jobs: int, progress: Callable[[str], None]
               ) -> pd.DataFrame:
    from kvpressure.pipeline.sweep import run_sweep

    return run_sweep(experiment, run_dir, progress=progress, jobs=jobs)


def _describe_length(spec: Any) -> str:
    if spec is None:
        return "from the trace"
    data = spec.model_dump() if hasattr(spec, "model_dump") else dict(spec)
    kind = data.pop("type", None) or data.pop("kind", None) or type(spec).__name__
    args = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in data.items() if v is not None)
    return f"{kind} ({args})" if args else str(kind)


def _length_stats(values: pd.Series, description: str, source: str) -> dict[str, Any]:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return {
        "description": description, "mean": float(v.mean()), "p50": float(v.quantile(0.5)),
        "p95": float(v.quantile(0.95)), "max": float(v.max()), "source": source,
    }


def _point_dir(run_dir: Path, variant: str, concurrency: int) -> Path:
    return run_dir / POINTS_DIR / variant / f"c{concurrency}"


def _collect_simulation(run_dir: Path, experiment_path: str, focus_concurrency: int,
                        jobs: int, progress: Callable[[str], None]) -> dict[str, Any]:
    from kvpressure.ingestion.api import ingest
    from kvpressure.simulation.experiment import load_experiment

    exp = load_experiment(experiment_path)
    if exp.mode != "closed":
        raise InputError(f"{experiment_path}: the investigation sweeps closed-loop concurrency "
                         "levels; this experiment gives request rates")
    src = Path(exp.path) if exp.path else Path(experiment_path)
    shutil.copyfile(src, run_dir / EXPERIMENT_COPY)
    runs = _run_sweep(exp, run_dir, jobs, progress)
    if not (run_dir / RUNS_CSV).is_file():
        runs.to_csv(run_dir / RUNS_CSV, index=False)
    runs = pd.read_csv(run_dir / RUNS_CSV)
    variants = [str(v) for v in pd.unique(runs["variant"])]
    base = BASELINE if BASELINE in variants else variants[0]
    focus_variant = exp.config.focus.variant if exp.config.focus.variant in variants else base
    base_runs = runs[runs["variant"].astype(str) == focus_variant]
    requested = focus_concurrency or exp.config.focus.concurrency
    level, why = focus_level(base_runs, requested)
    point = _point_dir(run_dir, focus_variant, level)
    scrape = next((point / n for n in _SCRAPE_FILES if (point / n).is_file()), None)
    if scrape is None:
        raise InputError(f"{point}: the sweep wrote no metrics.prom.jsonl for the focus point")
    run_name = f"{focus_variant}/c{level}"
    ingested = ingest([scrape], run=run_name)
    ingested.series.to_csv(run_dir / SERIES_CSV, index=False)
    (run_dir / INGEST_JSON).write_text(
        json.dumps(_ingest_report(ingested.report), indent=2, sort_keys=True) + "\n")
    requests = pd.read_csv(point / "requests.csv")
    t0, t1 = steady_window(requests, ingested.series)
    settings = exp.settings()
    cmp = exp.config.comparison
    spec = exp.config.workload
    return {
        "mode": "simulation",
        "name": exp.name,
        "description": exp.description,
        "inputs": [{"path": display_path(src), "sha256": sha256_file(src)}],
        "seed": int(spec.seed),
        "seeds": [int(x) for x in exp.seeds],
        "model_name": exp.model_name,
        "baseline_variant": base,
        "variants": variants,
        "variant_settings": {v: _variant_settings(exp, v) for v in variants},
        "comparison_parameter": cmp.parameter if cmp else None,
        "comparison_variants": [v for v in exp.variants() if v != BASELINE and v in variants],
        "concurrency_levels": sorted(int(c) for c in base_runs["concurrency"].unique()),
        "settings": settings,
        "num_requests": int(len(requests)),
        "input_len_distribution": _length_stats(
            requests["prompt_len"], _describe_length(spec.input_len), "requests.csv (exact)"),
        "output_len_distribution": _length_stats(
            requests["output_len"], _describe_length(spec.output_len), "requests.csv (exact)"),
        "focus": {"variant": focus_variant, "concurrency": level, "run": run_name,
                  "why": why, "t0": t0, "t1": t1,
                  "point_dir": str(point.relative_to(run_dir))},
    }


def _variant_settings(exp: Any, variant: str) -> dict[str, Any]:
    overrides = exp.variants(include_remedies=True).get(variant, {})
    return exp.settings(overrides)


def _ingest_report(report: Mapping[str, Any]) -> dict[str, Any]:
    return to_jsonable(dict(report))


# --------------------------------------------------------------------------- ingested data
def _families() -> list[str]:
    from kvpressure.ingestion.names import ANALYSIS_FAMILIES

    return [*ANALYSIS_FAMILIES, *_LENGTH_HISTOGRAMS]


_INGESTED_FAMILIES = _families()


def _point_of(path: Path) -> tuple[str, int | None]:
    """(variant, concurrency) from a path like ``.../<variant>/c64/metrics.prom.jsonl``."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        m = _LEVEL.match(parts[i])
        if m:
            variant = parts[i - 1] if i > 0 else BASELINE
            return variant, int(m.group(1))
    return BASELINE, None


def _scrape_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    found = sorted(p for n in _SCRAPE_FILES for p in source.rglob(n))
    return found


def _parse_variant(name: str) -> dict[str, Any]:
    import yaml

    out = {}
    for part in name.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = yaml.safe_load(value)
    return out


LOAD_TEST = "load_test"  # the run a continuous scrape log and its bench results share


def _kinds(sources: list[str]) -> set[str]:
    from kvpressure.ingestion.sources import detect

    return {src.kind for s in sources for src in detect(s)}


def _run_names(runs: pd.DataFrame) -> list[str]:
    """``<variant>/c<C>`` per row (``#2``, ``#3`` for repeated runs of a level); rows of an
    unknown concurrency keep their ingested name."""
    names, seen = [], {}
    for _, r in runs.iterrows():
        c = r["concurrency"]
        name = str(r["run"]) if pd.isna(c) else f"{r['variant']}/c{int(c)}"
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


def _crop(series: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """The window's samples plus a margin: the scrape before it (the counters' baseline) and a
    little of the load around it for the figures."""
    t = pd.to_numeric(series["t"], errors="coerce")
    times = np.sort(t.dropna().unique())
    step = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    pad = max(2.0 * step, 0.05 * (t1 - t0))
    return series[(t >= t0 - pad) & (t <= t1 + pad)].reset_index(drop=True)


def _collect_ingested(run_dir: Path, sources: list[str], focus_concurrency: int,
                      engine_args: Mapping[str, Any], model_name: str,
                      bench_timezone: str = "", columns: Any = "", log_year: int = 0,
                      log_timezone: str = "") -> dict[str, Any]:
    """Ingested data in one of four shapes:

    * scrape folders laid out as ``<variant>/c<C>/metrics.prom.jsonl``: one run per point;
    * ``vllm bench serve`` results plus a scrape log recorded through the whole load test: one
      run per bench result, its engine metrics cut from the log at the bench run's time window;
    * bench results alone: the curve and latencies, no engine metrics;
    * one scrape log of one load level: the engine metrics, no curve (``focus_concurrency``
      names the level when it is known).
    """
    from kvpressure.ingestion.api import bench_tzinfo, bench_window, ingest

    files: list[tuple[Path, str, int | None]] = []
    others: list[str] = []
    for s in sources:
        path = Path(s)
        scrapes = _scrape_files(path) if path.is_dir() else []
        if scrapes and any(_point_of(p)[1] is not None for p in scrapes):
            files.extend((p, *_point_of(p)) for p in scrapes)
        else:
            others.append(s)
    (run_dir / SOURCES_FILE).write_text(json.dumps({"sources": sources}, indent=2) + "\n")
    inputs = []
    rows = []
    focus_series: dict[str, pd.DataFrame] = {}
    reports: dict[str, Any] = {}
    for path, variant, level in files:
        run_name = f"{variant}/c{level}"
        res = ingest([path], run=run_name, metrics=_INGESTED_FAMILIES,
                     **recompute_args({**engine_args, **_parse_variant(variant)}))
        row = res.runs.iloc[0].to_dict()
        row.update(run=run_name, variant=variant, concurrency=level)
        rows.append(row)
        focus_series[run_name] = res.series
        reports[run_name] = res.report
        inputs.append({"path": display_path(path), "sha256": sha256_file(path)})
    kinds = _kinds(others) if others else set()
    has_bench = "bench" in kinds
    has_scrapes = bool(kinds - {"bench"}) or bool(files)
    shared_log = has_bench and bool(kinds - {"bench"})
    matched = "scrape folders laid out by point" if files else None
    if others:
        # A log recorded through the whole load test and its bench results are one run, so
        # ingestion cuts the log at each bench run's time window.
        res = ingest(others, run=LOAD_TEST if shared_log else None,
                     metrics=_INGESTED_FAMILIES, bench_timezone=bench_timezone or None,
                     columns=columns or None, log_year=log_year or None,
                     log_timezone=log_timezone or None, **recompute_args(engine_args))
        for _, r in res.runs.iterrows():
            rows.append(r.to_dict())
        for run_name in pd.unique(res.series["run"]) if len(res.series) else []:
            focus_series[str(run_name)] = res.series[res.series["run"] == run_name]
        reports["other"] = res.report
        if shared_log:
            matched = ("each bench run's time window ('date' - 'duration', in "
                       f"{bench_timezone or 'local time'}) cut from one continuous scrape log")
        elif has_bench:
            matched = "bench results only (no engine metrics)"
        elif not files:
            matched = "one scrape log per run"
        for s in others:
            for p in ([Path(s)] if Path(s).is_file() else sorted(Path(s).rglob("*"))):
                if p.is_file():
                    inputs.append({"path": display_path(p), "sha256": sha256_file(p)})
    declared = sorted({f for r in reports.values() for run in r.get("runs", {}).values()
                       for f in run.get("declared_without_samples", [])})
    if not rows:
        raise InputError(
            f"{', '.join(sources)}: no measured run found"
            + (f": {len(declared)} metric families are declared (# TYPE) without a single "
               "sample, so nothing was measured; scrape the server while it serves"
               if declared else ""))
    runs = pd.DataFrame(rows)
    runs["variant"] = runs["variant"].fillna(BASELINE).replace({"default": BASELINE})
    runs["concurrency"] = pd.to_numeric(runs["concurrency"], errors="coerce")
    if focus_concurrency and runs["concurrency"].isna().all() and len(runs) == 1:
        # One scrape log of one load level: the level is what the user says it was.
        runs["concurrency"] = float(focus_concurrency)
    runs = runs.sort_values(["variant", "concurrency"], kind="stable").reset_index(drop=True)
    source_run = runs["run"].astype(str).tolist()
    runs["run"] = _run_names(runs)
    runs.to_csv(run_dir / RUNS_CSV, index=False)
    variants = [str(v) for v in pd.unique(runs["variant"])]
    base = BASELINE if BASELINE in variants else variants[0]
    base_runs = runs[runs["variant"] == base]
    measured = base_runs.dropna(subset=["concurrency"])
    if measured.empty and len(base_runs) > 1:
        rates = pd.to_numeric(base_runs.get("request_rate", pd.Series(dtype=float)),
                              errors="coerce")
        raise InputError(
            f"{', '.join(sources)}: {len(base_runs)} runs and no concurrency levels; lay scrapes "
            "out as <variant>/c<concurrency>/metrics.prom.jsonl or give vllm bench results"
            + ("; these runs are request-rate levels, not concurrency levels (kvpressure knee "
               "--x request_rate reads their curve)" if rates.notna().any() else "")
        )
    if measured.empty:
        level, why = None, ("the concurrency is not known (the metrics do not carry it; "
                            "give focus_concurrency)")
        focus_row = base_runs.iloc[0]
    else:
        level, why = focus_level(measured, focus_concurrency)
        focus_row = measured[measured["concurrency"] == level].iloc[0]
    run_name = str(focus_row["run"])
    series = focus_series.get(source_run[int(focus_row.name)])
    window = (finite_or_none(focus_row.get("t_start")), finite_or_none(focus_row.get("t_end")))
    steady = (finite_or_none(focus_row.get("t_steady_start")),
              finite_or_none(focus_row.get("t_steady_end")))
    origin = "first"
    load: dict[str, Any] = {"idle": None, "snapshot": False, "notes": []}
    if declared:
        load["notes"].append(
            f"{len(declared)} metric famil{'y is' if len(declared) == 1 else 'ies are'} declared "
            f"without samples, so missing (not zero): {', '.join(declared)}")
    if series is not None and not series.empty:
        scrape_times = pd.to_numeric(series["t"], errors="coerce").dropna().unique()
        if shared_log and None not in window:
            series = _crop(series, *window)
            t0, t1 = window
            g0, g1 = steady if None not in steady and steady[1] > steady[0] else window
            load["notes"].append(
                f"counters over the level's window {_clock(t0)}-{_clock(t1)} (from its bench "
                f"result), gauges over its steady part {_clock(g0)}-{_clock(g1)} "
                f"({t1 - t0 - g1 + g0:.0f} s "
                "of ramp-up, drain and idle left out)")
        elif len(scrape_times) == 1:
            # One dump: gauges as they stood at that instant, counters since the server began.
            t0 = t1 = g0 = g1 = float(scrape_times[0])
            origin = "zero"
            load["snapshot"] = True
            load["notes"].append(
                "one scrape: gauges at that instant, counters since the server started (no rate, "
                "no time series)")
        else:
            t0, t1 = steady_window(None, series)
            part = steady_part(series, concurrency=float(level) if level else None)
            g0, g1 = part.t0, part.t1
            load["notes"].extend(part.notes)
            # The runs row of a whole log counts from the process start when ingestion found
            # that the log starts with it; the focus window, the same span, counts the same way.
            origin = _counter_origin(reports, source_run[int(focus_row.name)])
        load["idle"] = is_idle(series, t0 if t1 > t0 else None, t1)
        series = series.assign(run=run_name)
    else:
        series = pd.DataFrame(columns=["run", "t", "metric", "labels", "value"])
        w = bench_window({"date": focus_row.get("date"),
                          "duration_s": finite_or_none(focus_row.get("duration_s"))},
                         bench_tzinfo(bench_timezone or None))
        duration = finite_or_none(focus_row.get("duration_s")) or 0.0
        if duration <= 0:
            # A table of runs without durations (a spreadsheet): the window only names the
            # level; without engine metrics nothing is read over it.
            duration = 1.0
            load["notes"].append("the runs table gives no duration: the level's window is a "
                                 "1 s placeholder (no engine metrics are read over it)")
        t0, t1 = (w[0], w[0] + duration) if w else (0.0, duration)
        g0, g1 = t0, t1
    series.to_csv(run_dir / SERIES_CSV, index=False)
    (run_dir / INGEST_JSON).write_text(
        json.dumps(_ingest_report({"runs": reports}), indent=2, sort_keys=True) + "\n")
    engine_metrics = bool(len(series))
    geometry = cache_config(series) if engine_metrics else {}
    # A server log shows some engine arguments (max_num_seqs...); what the user gives wins.
    settings = {**geometry, **engine_args_from_reports(reports), **dict(engine_args)}
    load["notes"].extend(log_notes(reports))
    variant_settings = {}
    for v in variants:
        variant_settings[v] = {**settings, **_parse_variant(v)} if v != base else dict(settings)
    params = sorted({k for v in variants if v != base for k in _parse_variant(v)})
    bench_source = _bench_source(focus_row.get("source"))
    lengths = _bench_lengths(bench_source) if bench_source else {}
    # The whole log from the process start counts from zero; a window cut from it does not.
    from_start = not shared_log
    for key, base_name in (("input_len_distribution", "vllm:request_prompt_tokens"),
                           ("output_len_distribution", "vllm:request_generation_tokens")):
        bench_len = lengths.get(key)
        if (bench_len is None or bench_len["p50"] is None) and engine_metrics:
            hist = _length_from_histogram(series, base_name, None if from_start else t0, t1)
            if hist["mean"] is not None:
                lengths[key] = hist | _keep_mean(bench_len or {})
        lengths.setdefault(key, _unmeasured(base_name))
    model = (model_name or (_model_name(series) if engine_metrics else None)
             or _dropped_model_name(reports) or _first(runs.get("model")) or "unknown model")
    return {
        "mode": "ingested",
        "name": run_dir.name,
        "description": "ingested metrics",
        "inputs": inputs,
        "seed": None,
        "seeds": None,
        "model_name": model,
        "baseline_variant": base,
        "variants": variants,
        "variant_settings": variant_settings,
        "comparison_parameter": params[0] if len(params) == 1 else None,
        "comparison_variants": [v for v in variants if v != base] if len(params) == 1 else [],
        "concurrency_levels": sorted(int(c) for c in measured["concurrency"].unique()),
        "settings": settings,
        "num_requests": _finite_int(base_runs.loc[base_runs["run"] == run_name, "num_requests"]),
        "input_len_distribution": lengths["input_len_distribution"],
        "output_len_distribution": lengths["output_len_distribution"],
        "engine_metrics": engine_metrics,
        "bench_results": has_bench,
        "scrapes": has_scrapes,
        "matched": matched,
        "bench_timezone": bench_timezone or "local",
        "incomplete_levels": incomplete_levels(others),
        "focus": {"variant": base, "concurrency": level, "run": run_name, "why": why,
                  "t0": t0, "t1": t1, "gauge_t0": g0, "gauge_t1": g1, "point_dir": None,
                  "counter_origin": origin},
        "load": load,
    }


def recompute_args(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the recompute estimate takes from the engine arguments (vLLM exports only the pool
    geometry): the same for the ``runs`` table and stage 02, so both give one number."""
    return {
        "num_gpu_blocks": settings.get("num_gpu_blocks"),
        "block_size": settings.get("block_size"),
        "prefix_caching": settings.get("enable_prefix_caching"),
        "policy": settings.get("scheduling_policy", settings.get("policy")),
        "scheduler_reserve_full_isl": settings.get("scheduler_reserve_full_isl"),
    }


def _counter_origin(reports: Mapping[str, Any], run: str) -> str:
    """The counter origin ingestion decided for ``run`` ("zero": the log starts with the
    process), "first" when it is not reported."""
    for report in reports.values():
        info = (report.get("runs") or {}).get(run) or {}
        origin = (info.get("counter_origin") or {}).get("origin")
        if origin:
            return str(origin)
    return "first"


def _dropped_model_name(reports: Mapping[str, Any]) -> str | None:
    """The served model's name when ingestion dropped the ``model_name`` label (one model)."""
    for report in reports.values():
        for run in (report.get("runs") or {}).values():
            name = (run.get("dropped_labels") or {}).get("model_name")
            if name:
                return str(name)
    return None


def _first(values: Any) -> str | None:
    if values is None:
        return None
    for v in values:
        if isinstance(v, str) and v.strip():
            return v
    return None


def _bench_source(source: Any) -> tuple[Path, int] | None:
    """(file, index of the result in it) from a runs row's ``source`` (``path#k + log``)."""
    if not isinstance(source, str) or not source:
        return None
    first = source.split(" + ")[0]
    path, sep, k = first.rpartition("#")
    if sep and k.isdigit():
        return Path(path), int(k) - 1
    return Path(first), 0


def _bench_lengths(where: tuple[Path, int]) -> dict[str, Any]:
    """Length distributions from a bench result: exact from ``--save-detailed``'s
    ``input_lens``/``output_lens``, else only the means from its token totals."""
    from kvpressure.ingestion.bench import load_results

    path, index = where
    if path.suffix not in (".json", ".jsonl", ".gz") or not path.is_file():
        return {}
    try:
        results = load_results(path)
    except InputError:
        return {}
    if index >= len(results) or not isinstance(results[index][1], dict):
        return {}
    res = results[index][1]
    if "completed" not in res:
        return {}
    out = {}
    for key, array, total in (("input_len_distribution", "input_lens", "total_input_tokens"),
                              ("output_len_distribution", "output_lens", "total_output_tokens")):
        values = res.get(array)
        if isinstance(values, list) and values:
            errors = res.get("errors")
            if isinstance(errors, list) and len(errors) == len(values):
                values = [v for v, e in zip(values, errors, strict=True) if not e]
            out[key] = _length_stats(pd.Series(values), f"per request, from {array}",
                                     f"{path.name} ({array}, exact)")
        elif isinstance(res.get(total), int | float) and res.get("completed"):
            mean = float(res[total]) / float(res["completed"])
            out[key] = {"description": f"{total} / completed (mean only)", "mean": mean,
                        "p50": None, "p95": None, "max": None,
                        "source": f"{path.name} ({total})"}
    return out


def _keep_mean(bench: dict[str, Any]) -> dict[str, Any]:
    """A bench result's exact mean wins over a histogram's bucket-interpolated one."""
    if bench.get("mean") is None:
        return {}
    return {"mean": bench["mean"], "description": "quantiles from the histogram, mean from the "
            "bench result's token totals"}


def _unmeasured(base: str) -> dict[str, Any]:
    return {"description": f"not measured ({base} missing, no bench result)", "mean": None,
            "p50": None, "p95": None, "max": None, "source": base}


def _finite_int(values: pd.Series) -> int | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return int(round(float(v.iloc[0]))) if len(v) else None


def _model_name(series: pd.DataFrame) -> str | None:
    from kvpressure.ingestion.labels import parse_labels

    for text in pd.unique(series["labels"].astype(str))[:50]:
        name = parse_labels(text).get("model_name")
        if name:
            return name
    return None


def _length_from_histogram(series: pd.DataFrame, base: str, t0: float | None, t1: float
                           ) -> dict[str, Any]:
    """Length statistics of the requests finished in ``(t0, t1]`` (``t0`` None: since the
    process started, the log's counters read from zero)."""
    from kvpressure.ingestion.counters import histogram_mean, histogram_quantile

    origin = "zero" if t0 is None else "first"

    def q(x: float) -> float:
        return histogram_quantile(series, base, x, t0, t1, origin=origin)

    mean = histogram_mean(series, base, t0, t1, origin=origin)
    stats = {"mean": mean, "p50": q(0.5), "p95": q(0.95), "max": q(1.0)}
    if any(not isinstance(v, float) or math.isnan(v) for v in stats.values()):
        return {"description": f"not measured ({base} missing)", "mean": None, "p50": None,
                "p95": None, "max": None, "source": base}
    return {"description": f"from the {base} histogram", **stats,
            "source": f"{base} (bucket-interpolated)"}


# --------------------------------------------------------------------------- entry points
def collect(
    run_dir: str | os.PathLike[str],
    experiment: str | os.PathLike[str] = "",
    source: Any = "",
    *,
    focus_concurrency: int = 0,
    engine_args: Mapping[str, Any] | None = None,
    model_name: str = "",
    bench_timezone: str = "",
    columns: Any = "",
    log_year: int = 0,
    log_timezone: str = "",
    jobs: int = 1,
    progress: Callable[[str], None] | None = _stderr,
) -> dict[str, Any]:
    """Stage 01: write the canonical tables and ``analysis/collect.json``; returns the latter."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sources = as_sources(source)
    say = progress or (lambda _m: None)
    if sources:
        info = _collect_ingested(run_dir, sources, focus_concurrency, engine_args or {},
                                 model_name, bench_timezone, columns, log_year, log_timezone)
    else:
        if not experiment:
            raise InputError("collect: give an experiment file or a source")
        info = _collect_simulation(run_dir, os.fspath(experiment), focus_concurrency,
                                   max(1, int(jobs)), say)
    write_stage(run_dir, "collect", info)
    return read_stage(run_dir, "collect")


def ensure_collected(
    run_dir: str | os.PathLike[str], experiment: str | os.PathLike[str] = "", source: Any = ""
) -> dict[str, Any]:
    """Stage 01's results; runs stage 01 first when the run folder does not have them yet,
    so any notebook can be opened and run on its own."""
    if not has_stage(run_dir, "collect") or not (Path(run_dir) / RUNS_CSV).is_file():
        return collect(run_dir, experiment, source)
    return read_stage(run_dir, "collect")


def load_tables(run_dir: str | os.PathLike[str]) -> Tables:
    """Stage 01's tables: runs, the focus point's series (and steps, requests when simulated)."""
    run_dir = Path(run_dir)
    info = read_stage(run_dir, "collect")
    runs = pd.read_csv(run_dir / RUNS_CSV)
    series = pd.read_csv(run_dir / SERIES_CSV, dtype={"labels": str, "run": str, "metric": str})
    series["labels"] = series["labels"].fillna("")
    steps = requests = None
    point_dir = info["focus"].get("point_dir")
    if point_dir:
        steps = pd.read_csv(run_dir / point_dir / "steps.csv")
        requests = pd.read_csv(run_dir / point_dir / "requests.csv")
    return Tables(info, runs, series, steps, requests)


def incomplete_levels(sources: list[str]) -> list[dict[str, Any]]:
    """Levels ``kvpressure collect`` measured only in part (left off the curve), with why."""
    from kvpressure.ingestion.bench import load_results
    from kvpressure.ingestion.sources import detect

    out = []
    for s in sources:
        try:
            found = detect(s)
        except InputError:
            continue
        for src in found:
            if src.kind != "bench":
                continue
            try:
                results = load_results(Path(src.location))
            except (InputError, OSError):
                continue
            for _, res in results:
                level = res.get("kvpressure_level") if isinstance(res, dict) else None
                if isinstance(level, dict) and level.get("complete") is False:
                    out.append({"concurrency": res.get("max_concurrency"),
                                "completed": res.get("completed"), "failed": res.get("failed"),
                                "reason": level.get("reason") or "no reason recorded",
                                "source": display_path(src.location)})
    return sorted(out, key=lambda lv: (lv["concurrency"] is None, lv["concurrency"] or 0))
