"""Stages 02-06: call the analysis on stage 01's tables and shape what each notebook shows.

Each ``*_stage`` function returns a :class:`StageOutput`: ``result`` (the stage's type of
:mod:`kvpressure.stages.results`, which the notebook writes to ``analysis/<stage>.json``) and
``frames`` (tidy tables for its figures). The notebooks
only plot, print and assert; the judgement lives in :mod:`kvpressure.analysis`. Curves are the
per-level means over the repeats (workload seeds) with their spread, as
:mod:`kvpressure.analysis.levels` lays down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.analysis.knee import MIN_KNEE_LEVELS
from kvpressure.analysis.levels import level_means
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.names import KV_USAGE, PREEMPTIONS, RUNNING, WAITING, WAITING_BY_REASON
from kvpressure.investigation.collect import Tables
from kvpressure.jsonable import finite_or_none
from kvpressure.stages.files import as_result
from kvpressure.stages.results import (
    ComparisonResult,
    InterferenceResult,
    KneeResult,
    RecomputeResult,
    StageResult,
    StepThresholds,
)

CURVE_COLUMNS = ("concurrency", "output_throughput", "itl_mean_s", "itl_p95_s", "ttft_p95_s",
                 "preemptions", "recompute_ratio", "recompute_ratio_low", "recompute_ratio_high",
                 "mean_running", "mean_kv_usage", "itl_p99_s")


@dataclass
class StageOutput:
    result: StageResult
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)


def _gauge(series: pd.DataFrame, metric: str, run: str, labels: str | None = None) -> pd.Series:
    from kvpressure.ingestion.counters import select

    parts = select(series, metric, labels, run=run)
    if not parts:
        return pd.Series(dtype=float)
    frame = pd.concat(parts.values(), axis=1)
    return frame.mean(axis=1) if metric == KV_USAGE else frame.sum(axis=1)


# --------------------------------------------------------------------------- 01 collect
def level_windows(runs: pd.DataFrame, x: str = "concurrency") -> pd.DataFrame:
    """Per measured level, where its counters and its gauges were read, in seconds from the
    first level's start (empty when the data has no such windows: simulated or bench-only)."""
    cols = ["t_start", "t_end", "t_steady_start", "t_steady_end"]
    if not set(cols) <= set(runs.columns):
        return pd.DataFrame()
    part = runs.dropna(subset=[x, *cols])
    if part.empty:
        return pd.DataFrame()
    ref = float(part["t_start"].min())
    out = pd.DataFrame({
        x: part[x].astype(int) if x == "concurrency" else part[x].astype(float),
        "counters from (s)": part["t_start"] - ref,
        "counters to (s)": part["t_end"] - ref,
        "gauges from (s)": part["t_steady_start"] - ref,
        "gauges to (s)": part["t_steady_end"] - ref,
    })
    out["left out of the gauges (s)"] = ((out["counters to (s)"] - out["counters from (s)"])
                                         - (out["gauges to (s)"] - out["gauges from (s)"]))
    return out.sort_values(x).reset_index(drop=True)


def _window(tables: Tables) -> dict[str, Any]:
    """The focus window's run and level, as stage 02's result names them."""
    focus = tables.info.focus
    out: dict[str, Any] = {"run": focus.run, "concurrency": focus.concurrency}
    if tables.x == "request_rate":
        out["request_rate"] = focus.request_rate
    return out


# --------------------------------------------------------------------------- 02 recompute
def timeline(tables: Tables) -> pd.DataFrame:
    """Running, waiting (by reason) and KV usage at each scrape of the focus point (long form)."""
    run = tables.info.focus.run
    s = tables.series
    cols = {
        "running": _gauge(s, RUNNING, run),
        "waiting": _gauge(s, WAITING, run),
        "waiting: capacity": _gauge(s, WAITING_BY_REASON, run, "reason=capacity"),
        "waiting: deferred": _gauge(s, WAITING_BY_REASON, run, "reason=deferred"),
        "kv_cache_usage_perc": _gauge(s, KV_USAGE, run),
    }
    wide = pd.DataFrame({k: v for k, v in cols.items() if not v.empty})
    wide.index.name = "t"
    return wide.reset_index().melt(id_vars="t", var_name="metric", value_name="value")


def preemption_intervals(tables: Tables) -> pd.DataFrame:
    """Preemptions in each scrape interval: differences of the cumulative counter."""
    from kvpressure.ingestion.counters import interval_increases, select

    run = tables.info.focus.run
    parts = select(tables.series, PREEMPTIONS, None, run=run)
    if not parts:
        return pd.DataFrame(columns=["t", "preemptions"])
    total = pd.concat(parts.values(), axis=1).sum(axis=1).sort_index()
    t = total.index.to_numpy(float)
    inc = interval_increases(t, total.to_numpy(float))
    return pd.DataFrame({"t": t[1:], "preemptions": inc})


def focus_recompute_estimate(tables: Tables) -> Any:
    """The recompute estimate from the focus window's counters, with the engine arguments
    the data came with: the one estimate stage 02, the symptoms and the record all show."""
    from kvpressure.analysis.recompute import recompute_from_series

    focus = tables.info.focus
    t0, t1 = tables.window
    engine = EngineFacts.from_settings(tables.info.settings)
    # A window from the start of a log that starts with the process counts from zero, as the
    # runs table does over the same span.
    zero = focus.counter_origin == "zero"
    return recompute_from_series(
        tables.series, None if zero else t0, t1, run=focus.run,
        num_gpu_blocks=engine.num_gpu_blocks, block_size=engine.block_size,
        enable_prefix_caching=engine.enable_prefix_caching, policy=engine.scheduling_policy,
        scheduler_reserve_full_isl=engine.scheduler_reserve_full_isl,
        origin="zero" if zero else "first",
    )


def recompute_stage(tables: Tables) -> StageOutput:
    """Counters over the focus window, the waiting split, and recompute (exact or a range)."""
    from kvpressure.analysis.recompute import recompute_from_steps
    from kvpressure.analysis.waiting import waiting_from_series

    focus = tables.info.focus
    t0, t1 = tables.window
    g0, g1 = tables.gauge_window
    mns = tables.info.settings.get("max_num_seqs")
    if not has_engine_metrics(tables):
        return _no_engine_metrics(tables, mns)
    waiting = waiting_from_series(tables.series, g0, g1, max_num_seqs=mns)
    if tables.steps is not None:
        rec = recompute_from_steps(tables.steps, t0, t1)
        recomputed: float | None = float(rec.recomputed_tokens)
        low: float | None = recomputed
        high: float | None = recomputed
        ratio: float | None = rec.recompute_ratio or 0.0
        ratio_low: float | None = ratio
        ratio_high: float | None = ratio
        preemptions: float | None = float(rec.preemptions)
        exact = True
        detail = rec.to_dict()
    else:
        est = focus_recompute_estimate(tables)
        recomputed = finite_or_none(est.recomputed_point)
        low, high = finite_or_none(est.recomputed_low), finite_or_none(est.recomputed_high)
        ratio, ratio_low, ratio_high = (finite_or_none(est.recompute_ratio), finite_or_none(est.ratio_low),
                                        finite_or_none(est.ratio_high))
        preemptions = finite_or_none(est.preemptions)
        exact = False
        detail = est.to_dict()
    wr = waiting.to_dict()
    result = {
        "window": {**_window(tables), "t0": t0, "t1": t1, "gauge_t0": g0, "gauge_t1": g1},
        "max_num_seqs": mns,
        "running_mean": wr.get("mean_running"),
        "running_max": wr.get("max_running"),
        "waiting_mean": wr.get("mean_waiting"),
        "waiting_capacity_mean": wr.get("mean_capacity"),
        "waiting_deferred_mean": wr.get("mean_deferred"),
        "frac_waiting": wr.get("frac_waiting"),
        "frac_silent": wr.get("frac_silent"),
        "kv_usage_mean": _kv_mean(tables.series, focus.run, g0, g1),
        "preemptions": preemptions,
        "recomputed_tokens": recomputed,
        "recomputed_tokens_low": low,
        "recomputed_tokens_high": high,
        "recompute_ratio": ratio,
        "recompute_ratio_low": ratio_low,
        "recompute_ratio_high": ratio_high,
        "exact": exact,
        "available": True,
        "recompute_time_share": detail.get("recompute_time_share"),
        "waiting": wr,
        "recompute": detail,
    }
    by_level = level_means(tables.baseline_runs, ("preemptions", "recomputed_tokens",
                                                  "recompute_ratio", "recompute_ratio_low",
                                                  "recompute_ratio_high"), x=tables.x,
                          by=(), band=())
    if tables.repeats == 1:
        by_level = by_level.drop(columns=["repeats"])
    frames = {"timeline": timeline(tables), "preemptions": preemption_intervals(tables),
              "by_concurrency": by_level}
    return StageOutput(as_result(RecomputeResult, result), frames)


NO_ENGINE_METRICS = ("no engine metrics: only vllm bench results were given (no Prometheus "
                     "scrapes of the server's /metrics)")


def has_engine_metrics(tables: Tables) -> bool:
    """Whether the investigation has the server's own metrics (simulated or scraped)."""
    return tables.steps is not None or len(tables.series) > 0


def _no_engine_metrics(tables: Tables, mns: Any) -> StageOutput:
    """What stage 02 can say without engine metrics: every counter missing, never zero."""
    t0, t1 = tables.window
    keys = ("running_mean", "running_max", "waiting_mean", "waiting_capacity_mean",
            "waiting_deferred_mean", "frac_waiting", "frac_silent", "kv_usage_mean",
            "preemptions", "recomputed_tokens", "recomputed_tokens_low",
            "recomputed_tokens_high", "recompute_ratio", "recompute_ratio_low",
            "recompute_ratio_high", "recompute_time_share")
    result = {
        "window": {**_window(tables), "t0": t0, "t1": t1},
        "max_num_seqs": mns, "available": False, "missing": NO_ENGINE_METRICS, "exact": False,
        **dict.fromkeys(keys), "waiting": {}, "recompute": {},
    }
    empty = pd.DataFrame(columns=["t", "metric", "value"])
    return StageOutput(as_result(RecomputeResult, result), {"timeline": empty,
                                "preemptions": pd.DataFrame(columns=["t", "preemptions"]),
                                "by_concurrency": pd.DataFrame(columns=[tables.x])})


def _kv_mean(series: pd.DataFrame, run: str, t0: float | None, t1: float | None) -> float | None:
    from kvpressure.ingestion.counters import gauge_mean

    return finite_or_none(gauge_mean(series, KV_USAGE, t0, t1, run=run))


# --------------------------------------------------------------------------- 03 knee
# The latencies whose turn against offered load a request-rate sweep locates.
LATENCY_KNEE_COLUMNS = ("ttft_p95_s", "itl_p95_s")
def curve(runs: pd.DataFrame, x: str = "concurrency") -> pd.DataFrame:
    """Per variant and level: the mean of each curve column over the repeats, ``repeats``, and
    the spread of ``output_throughput`` (``_sd``, ``_min``, ``_max``) for a band."""
    return level_means(runs, [c for c in CURVE_COLUMNS if c != "concurrency"], x=x)


def knee_stage(tables: Tables) -> StageOutput:
    """Knee, peak, sustained range and decline of the baseline curve (repeats averaged, their
    spread the noise); latencies at every level."""
    from kvpressure.analysis.knee import knee_of_runs, same_schedule_from
    from kvpressure.analysis.symptoms import ITL_P99_NOTE
    from kvpressure.report.sentences import level_words

    base = tables.baseline_runs
    focus = tables.info.focus
    x = tables.x
    rates = x == "request_rate"
    # A level without a throughput is no point of the curve (knee_of_runs names it).
    points = curve(base.dropna(subset=[x, "output_throughput"]), x)
    if rates:  # the closed loop's concurrency column is empty on this axis
        points = points.drop(columns=["concurrency"], errors="ignore")
    levels = len(points)
    enough = levels >= MIN_KNEE_LEVELS
    # The function `kvpressure knee` calls: the report's knee is the command's.
    knee = knee_of_runs(base, x=x, where="runs.csv") if enough else None
    if knee is not None and not rates:
        # An open loop's levels are different request sets in time: never one schedule.
        knee.same_schedule_from = same_schedule_from(points)
    here = points[points[x] == focus.level]
    at = here.iloc[0] if len(here) else base.iloc[0]
    one = "level" if rates else "concurrency level"
    why = None if enough else (
        f"the {level_words(x).singular} of the one run is not known: no curve" if levels == 0
        else f"{levels} {one}{'s' if levels > 1 else ''} measured; a knee needs at "
        f"least {MIN_KNEE_LEVELS} (a curve that rises, bends and flattens)")
    result = {
        "variant": tables.info.baseline_variant,
        "repeats": tables.repeats,
        "available": enough,
        "why_not": why,
        "levels": levels,
        "knee": knee,
        "curve": points.drop(columns=["variant"], errors="ignore").to_dict(orient="records"),
        "focus_concurrency": focus.concurrency,
        **({"focus_request_rate": focus.request_rate, "x": x} if rates else {}),
        "itl_mean_s": finite_or_none(at.get("itl_mean_s")),
        "itl_p95_s": finite_or_none(at.get("itl_p95_s")),
        "ttft_p95_s": finite_or_none(at.get("ttft_p95_s")),
    }
    if rates and enough:
        from kvpressure.analysis.knee import latency_knee

        result["latency_knees"] = {
            col: latency_knee(points[x], points[col]) for col in LATENCY_KNEE_COLUMNS
            if col in points and points[col].notna().sum() >= MIN_KNEE_LEVELS}
    if result["itl_p95_s"] is None and finite_or_none(at.get("itl_p99_s")) is not None:
        result["itl_p99_s"] = finite_or_none(at.get("itl_p99_s"))
        result["itl_tail_note"] = ITL_P99_NOTE
    return StageOutput(as_result(KneeResult, result), {"curve": points})


# --------------------------------------------------------------------------- 04 compare
def comparison_runs(tables: Tables) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Baseline and the comparison's variants, each with the one setting that was changed.

    Only the compared parameter is handed to the comparison: a change of ``max_num_seqs`` also
    re-sizes the KV pool (vLLM profiles activations for it), which is part of that one change.
    """
    info = tables.info
    param = info.comparison_parameter
    base = info.baseline_variant
    settings = info.variant_settings
    keep = [base, *[v for v in info.comparison_variants if v in settings]]
    runs = tables.runs[tables.runs["variant"].astype(str).isin(keep)]
    chosen = {k: {param: settings[k].get(param)} for k in keep} if param else {}
    return runs.reset_index(drop=True), chosen


def compare_stage(tables: Tables, seed: int = 0) -> StageOutput:
    """The single-variable comparison: each variant's knee and whether it moved beyond noise."""
    from kvpressure.analysis.compare import compare_variants, moved_right_by, moved_right_words

    runs, settings = comparison_runs(tables)
    param = tables.info.comparison_parameter
    x = tables.x
    if param is None or len(settings) < 2:
        levels = int(pd.to_numeric(tables.baseline_runs[x], errors="coerce")
                     .nunique())
        what = ("one load level measured, one engine configuration: a comparison needs the "
                "curve of each of two configurations" if levels <= 1 else
                "one engine configuration measured (one variant): no single-variable comparison "
                "in the data")
        result: dict[str, Any] = {"available": False, "parameter": param, "summary": what}
        return StageOutput(as_result(ComparisonResult, result), {"curves": curve(runs, x)})
    cmp = compare_variants(runs, settings, parameter=param,
                           baseline=tables.info.baseline_variant, x=x, seed=seed)
    last = max(p.x for v in cmp.variants for p in v.points)
    phrases = []
    for s in cmp.shifts:
        knee = (f"knee {_at(s.baseline_knee_x)} -> {_at(s.knee_x)}, "
                f"{_noise_word(s.knee_beyond_noise)}")
        turn = (f"end of the sustained range "
                f"{_held(s.baseline_decline_onset, s.baseline_sustained_end, last)} -> "
                f"{_held(s.decline_onset, s.sustained_end, last)}, "
                f"{_noise_word(s.sustained_beyond_noise)}")
        gain = s.peak_gain_pct
        gain_txt = "" if gain is None or math.isnan(gain) else f"; peak throughput {gain:+.0f}%"
        phrases.append(f"{param} {s.baseline_value} -> {s.value}: {knee}; {turn}{gain_txt}")
    moved = cmp.knee_moves_right and cmp.beyond_noise
    by = moved_right_by(cmp.shifts)
    summary = "; ".join(phrases) + (
        f". {moved_right_words(by).capitalize()} when {param} changes: the curve was bound by "
        "KV blocks." if moved else
        f". The knee does not move right beyond noise when {param} changes.")
    result = {**dict(cmp), "available": True, "summary": summary,
              "moved_right_beyond_noise": moved,
              "variant_names": [v.variant for v in cmp.variants if v.variant != cmp.baseline]}
    return StageOutput(as_result(ComparisonResult, result), {"curves": curve(runs, x)})


def variant_table(result: ComparisonResult, x: str = "concurrency") -> pd.DataFrame:
    """One row per variant of compare.json: its knee and the end of its sustained range, each
    with its bootstrap range, the peak and the noise (empty without a comparison). A range
    end past the largest level (a curve that does not turn inside the sweep) reads "past N"."""
    from kvpressure.report.sentences import num

    if not result.available:
        return pd.DataFrame()

    def span(r: Any, last: float) -> str | None:
        if r is None:
            return None
        hi = f"past {num(last)}" if r[1] > last else num(r[1])
        return f"{num(r[0])} to {hi}" if r[0] <= last else f"past {num(last)}"

    def at(x: Any, last: float) -> str | None:
        return None if x is None else (f"past {num(last)}" if x > last else num(x))

    unit = "clients" if x == "concurrency" else "req/s"
    rows = []
    for v in result.variants:
        last = max((p.x for p in v.points), default=math.inf)
        rows.append({
            "variant": v.variant, f"knee ({unit})": at(v.knee_x, last),
            "knee range": span(v.knee_range, last),
            f"holds to ({unit})": at(v.sustained_end, last),
            # No decline inside the sweep: the turn, if any, lies past its largest level.
            "declines from": (at(v.decline_onset, last) if v.decline_onset is not None
                              else f"past {num(last)}"),
            "holds-to range": span(v.sustained_range, last),
            "peak (tok/s)": v.peak_y, "noise (tok/s per run)": v.noise_sd,
            "runs averaged": v.repeats})
    return pd.DataFrame(rows)


SHIFT_COLUMNS = ("variant", "baseline_value", "value", "shift", "knee_beyond_noise",
                 "sustained_shift", "sustained_beyond_noise", "beyond_noise", "peak_gain_pct")
SHIFT_NAMES = {"baseline_value": "baseline value", "shift": "knee shift (clients)",
               "knee_beyond_noise": "knee moved beyond noise",
               "sustained_shift": "holds-to shift (clients)",
               "sustained_beyond_noise": "holds-to moved beyond noise",
               "beyond_noise": "either beyond noise", "peak_gain_pct": "peak change (%)"}


def shift_table(result: ComparisonResult, x: str = "concurrency") -> pd.DataFrame:
    """One row per compared variant of compare.json: how far its knee and its sustained range
    moved from the baseline's, and whether beyond noise (empty without a comparison)."""
    names = SHIFT_NAMES if x == "concurrency" else {
        k: v.replace("(clients)", "(req/s)") for k, v in SHIFT_NAMES.items()}
    if not result.available:
        return pd.DataFrame(columns=[names.get(c, c) for c in SHIFT_COLUMNS])
    table = pd.DataFrame([sh.model_dump() for sh in result.shifts])[list(SHIFT_COLUMNS)]
    for col in ("knee_beyond_noise", "sustained_beyond_noise", "beyond_noise"):
        table[col] = table[col].map({True: "yes", False: "no"})
    return table.rename(columns=names)


def _at(x: float | None) -> str:
    return "past the range" if x is None else f"{x:g}"


def _held(onset: float | None, end: float | None, last: float) -> str:
    if onset is None:
        return f"past {last:g} (no decline)"
    return f"{end:g} (decline from {onset:g})"


def _noise_word(beyond: bool) -> str:
    return "beyond noise" if beyond else "within noise"


# --------------------------------------------------------------------------- 05 interference
def interference_stage(tables: Tables) -> StageOutput:
    """Prefill interference vs preemption at the focus point, with a per-step (or interval) view."""
    from kvpressure.analysis._steps import steps_in_window
    from kvpressure.analysis.interference import interference_from_series, interference_from_steps

    t0, t1 = tables.window
    if tables.steps is not None and "time_s" in tables.steps:
        rep = interference_from_steps(tables.steps, t0, t1)
        # The analysis' own window rule (by output time), so the plotted steps are the judged ones.
        st = steps_in_window(tables.steps, (t0, t1))
        view = pd.DataFrame({
            "t": st["time_s"].to_numpy(float),
            "step_ms": 1000 * st["step_duration_s"].to_numpy(float),
            "prefill_tokens": st["num_prefill_tokens"].to_numpy(float),
            "decode_tokens": st["num_decode_tokens"].to_numpy(float),
            "preempting": (st["preemptions"].to_numpy(float) > 0)
            | (st["recomputed_tokens"].to_numpy(float) > 0),
            "kv_usage": st["kv_usage"].to_numpy(float),
        })
        view = view[view["decode_tokens"] > 0]
        thr = rep.thresholds
        long = ((thr.long_prefill_tokens if isinstance(thr, StepThresholds) else None)
                or view["prefill_tokens"].max())
        view["kind"] = np.where(view["preempting"], "preemption / recompute",
                                np.where(view["prefill_tokens"] >= long, "long prefill",
                                         "other"))
    elif not has_engine_metrics(tables):
        result = {"source": "none", "prefill_interference": None, "preemption": None,
                  "notes": [NO_ENGINE_METRICS],
                  "summary": "prefill interference and preemption-driven slow steps not "
                             "measurable: " + NO_ENGINE_METRICS}
        return StageOutput(as_result(InterferenceResult, result), {"steps": pd.DataFrame(
            columns=["t", "step_ms", "prefill_tokens", "kind"])})
    else:
        rep = interference_from_series(tables.series, t0, t1, run=tables.info.focus.run)
        view = pd.DataFrame(columns=["t", "step_ms", "prefill_tokens", "kind"])
    pi, pre = rep.prefill_interference, rep.preemption
    words = {True: "present", False: "absent", None: "not measurable"}
    summary = (f"prefill interference {words[pi]}; preemption-driven slow steps "
               f"{words[pre]} (from {rep.source})")
    return StageOutput(as_result(InterferenceResult, {**dict(rep), "summary": summary}),
                       {"steps": view, "by_kind": steps_by_kind(view)})


def steps_by_kind(view: pd.DataFrame) -> pd.DataFrame:
    """Stage 05's steps by what they carried: how many, and their time seen by decodes (ms)."""
    if not len(view):
        return pd.DataFrame(columns=["kind", "steps", "mean (ms)", "p50 (ms)", "p95 (ms)",
                                     "max (ms)"])
    g = view.groupby("kind")["step_ms"]
    return pd.DataFrame({"steps": g.size(), "mean (ms)": g.mean(), "p50 (ms)": g.median(),
                         "p95 (ms)": g.quantile(0.95), "max (ms)": g.max()}).reset_index()
