"""The six symptoms of KV-cache pressure, each with a verdict and its evidence.

1. ``curve_falls``: throughput rises, flattens, then falls as concurrency grows (runs).
2. ``waiting_persists``: ``vllm:num_requests_waiting`` > 0 for most of the window.
3. ``running_below_max_num_seqs``: capacity waiting while running < ``max_num_seqs`` (silent).
4. ``kv_usage_near_full``: ``vllm:kv_cache_usage_perc`` near 1 for most of the window.
5. ``preemption_recompute``: preemptions in the window and a recompute ratio above threshold.
6. ``itl_jitter``: ITL p95 pulls away from the mean (as concurrency grows, or in the window).

A verdict is "present", "absent" or "no data"; a missing metric is never read as zero.
The gauges come from ``series`` (real or simulated through its Prometheus view), else from the
simulation's ``steps``; the curve and the ITL spread across concurrency come from ``runs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.analysis import _series as S
from kvpressure.analysis._steps import is_timed, steps_in_window
from kvpressure.analysis.knee import find_knee
from kvpressure.analysis.recompute import (
    RecomputeEstimate,
    recompute_from_series,
    recompute_from_steps,
)
from kvpressure.analysis.waiting import WaitingReport, waiting_from_series, waiting_from_steps
from kvpressure.ingestion.counters import gauge_window, held_mean
from kvpressure.ingestion.names import ITL, KV_USAGE, PREEMPTIONS, RUNNING, WAITING
from kvpressure.jsonable import finite_or_none, to_jsonable

Verdict = str  # "present" | "absent" | "no data"


# KV usage from which the pool counts as full (``vllm:kv_cache_usage_perc``, a 0..1 fraction).
KV_FULL_USAGE = 0.95


@dataclass
class Thresholds:
    """When a symptom counts as present. Defaults follow the workflow's wording.

    * ``kv_full_usage`` / ``kv_full_frac``: KV usage >= 0.95 for >= 50% of the window.
    * ``waiting_frac``: waiting > 0 for >= 50% of the window.
    * ``silent_frac``: capacity waiting with running < max_num_seqs for >= 50% of the window.
    * ``recompute_ratio``: preemptions > 0 and recompute ratio >= 0.05.
    * ``itl_spread_growth``: (p95 / mean ITL) at the highest concurrency >= 1.5 x that at the
      lowest; ``itl_spread_window``: within one window, p95 >= 2 x mean.
    * ``decline_pct``: the curve falls after its peak by >= 2% and beyond noise (knee.py).
    """

    kv_full_usage: float = KV_FULL_USAGE
    kv_full_frac: float = 0.5
    waiting_frac: float = 0.5
    silent_frac: float = 0.5
    recompute_ratio: float = 0.05
    itl_spread_growth: float = 1.5
    itl_spread_window: float = 2.0
    decline_pct: float = 2.0
    plateau_tol: float = 0.05

    def to_dict(self) -> dict:
        return to_jsonable(self)


@dataclass
class Symptom:
    id: str
    name: str
    verdict: Verdict
    evidence: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] = field(default_factory=dict)

    @property
    def present(self) -> bool:
        return self.verdict == "present"

    def to_dict(self) -> dict:
        return to_jsonable(self)


@dataclass
class SymptomChecklist:
    symptoms: list[Symptom]
    window: tuple[float | None, float | None]
    thresholds: Thresholds

    def by_id(self, sid: str) -> Symptom:
        for s in self.symptoms:
            if s.id == sid:
                return s
        raise KeyError(sid)

    def to_dict(self) -> dict:
        return {
            "window": list(self.window),
            "thresholds": self.thresholds.to_dict(),
            "symptoms": [s.to_dict() for s in self.symptoms],
        }


def _verdict(ok: bool) -> Verdict:
    return "present" if ok else "absent"


def _curve(runs: pd.DataFrame | None, th: Thresholds, x: str, y: str) -> Symptom:
    name = ("throughput rises, flattens, then falls with concurrency" if x == "concurrency"
            else "throughput rises, flattens, then falls with offered load")
    thr = {"decline_pct": th.decline_pct, "beyond_noise": True}
    if runs is None or x not in runs or y not in runs:
        return Symptom("curve_falls", name, "no data", {"missing": f"runs with {x}, {y}"}, thr)
    part = runs[[x, y]].apply(pd.to_numeric, errors="coerce").dropna()
    if part[x].nunique() < 3:
        return Symptom("curve_falls", name, "no data",
                       {"levels": int(part[x].nunique()), "missing": "at least 3 levels"}, thr)
    k = find_knee(part[x], part[y], plateau_tol=th.plateau_tol, min_decline_pct=th.decline_pct)
    ev = {"knee_x": k.knee_x, "peak_x": k.peak_x, "peak_y": k.peak_y,
          "plateau": list(k.plateau), "decline_pct": k.decline_pct, "noise_sd": k.noise_sd}
    return Symptom("curve_falls", name, _verdict(k.declines), ev, thr)


def _gauge_symptoms(
    series: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    window: S.Window,
    max_num_seqs: int | None,
    th: Thresholds,
) -> list[Symptom]:
    if series is not None:
        wr = waiting_from_series(series, *window, max_num_seqs=max_num_seqs)
        usage, w = gauge_window(S.metric_values(series, KV_USAGE, agg="mean"), *window)
        kv_frac = held_mean(usage >= th.kv_full_usage, w) if not usage.empty else None
        kv_mean = finite_or_none(held_mean(usage, w))
        kv_src = "series"
    elif steps is not None:
        wr = waiting_from_steps(steps, *window, max_num_seqs=max_num_seqs)
        st = steps_in_window(steps, window)
        col = "kv_usage_after" if "kv_usage_after" in st else "kv_usage"
        if col in st and not st.empty:
            w = st["step_duration_s"].to_numpy(float) if is_timed(st) else np.ones(len(st))
            u = st[col].to_numpy(float)
            kv_frac = float((w * (u >= th.kv_full_usage)).sum() / w.sum())
            kv_mean = float((w * u).sum() / w.sum())
        else:
            kv_frac = kv_mean = None
        kv_src = "steps"
    else:
        wr, kv_frac, kv_mean, kv_src = None, None, None, ""

    out = []
    name = "vllm:num_requests_waiting stays > 0"
    thr: dict[str, Any] = {"waiting_frac": th.waiting_frac}
    ev: dict[str, Any]
    if wr is None or wr.frac_waiting is None:
        out.append(Symptom("waiting_persists", name, "no data",
                           {"missing": "vllm:num_requests_waiting"}, thr))
    else:
        ev = {"frac_waiting": wr.frac_waiting, "mean_waiting": wr.mean_waiting,
              "max_waiting": wr.max_waiting, "frac_capacity": wr.frac_capacity,
              "frac_deferred": wr.frac_deferred, "mean_capacity": wr.mean_capacity,
              "mean_deferred": wr.mean_deferred, "source": wr.source}
        out.append(Symptom("waiting_persists", name,
                           _verdict(wr.frac_waiting >= th.waiting_frac), ev, thr))

    name = "vllm:num_requests_running stays below --max-num-seqs while requests wait"
    thr = {"silent_frac": th.silent_frac, "max_num_seqs": max_num_seqs}
    if wr is None or wr.frac_silent is None:
        ev = {"missing": ", ".join(_silent_form_missing(wr, max_num_seqs))}
        if wr is not None and wr.mean_running is not None:
            ev.update(mean_running=wr.mean_running, max_running=wr.max_running)
        out.append(Symptom("running_below_max_num_seqs", name, "no data", ev, thr))
    else:
        ev = {"frac_silent": wr.frac_silent, "frac_at_limit": wr.frac_at_limit,
              "mean_running": wr.mean_running, "max_running": wr.max_running,
              "states": wr.states, "source": wr.source}
        out.append(Symptom("running_below_max_num_seqs", name,
                           _verdict(wr.frac_silent >= th.silent_frac), ev, thr))

    name = "vllm:kv_cache_usage_perc stays near 1"
    thr = {"kv_full_usage": th.kv_full_usage, "kv_full_frac": th.kv_full_frac}
    if kv_frac is None or np.isnan(kv_frac):
        out.append(Symptom("kv_usage_near_full", name, "no data",
                           {"missing": KV_USAGE}, thr))
    else:
        ev = {"frac_near_full": kv_frac, "mean_kv_usage": kv_mean, "source": kv_src}
        out.append(Symptom("kv_usage_near_full", name,
                           _verdict(kv_frac >= th.kv_full_frac), ev, thr))
    return out


def _silent_form_missing(wr: WaitingReport | None, max_num_seqs: int | None) -> list[str]:
    """What the silent-form test lacks, the engine's metrics first: without them knowing
    ``max_num_seqs`` would not help."""
    out = []
    if wr is None or wr.mean_running is None:
        out.append(RUNNING)
    if wr is None or (wr.mean_waiting is None and wr.mean_capacity is None):
        out.append(WAITING)
    if max_num_seqs is None:
        out.append("max_num_seqs")
    return out or [RUNNING]


def _recompute(
    series: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    runs: pd.DataFrame | None,
    window: S.Window,
    th: Thresholds,
    x: str,
    estimate: RecomputeEstimate | None = None,
    origin: str = "first",
) -> Symptom:
    sid, name = "preemption_recompute", "preemptions rise and so does the recompute ratio"
    thr = {"preemptions_gt": 0, "recompute_ratio": th.recompute_ratio}
    ev: dict = {}
    if runs is not None and {x, "recompute_ratio"} <= set(runs.columns):
        curve = (runs[[x, "recompute_ratio"]].apply(pd.to_numeric, errors="coerce").dropna()
                 .groupby(x)["recompute_ratio"].mean())
        if not curve.empty:
            ev["recompute_ratio_by_concurrency"] = {str(k): float(v) for k, v in curve.items()}
    if steps is not None and "recomputed_tokens" in steps:
        ex = recompute_from_steps(steps, *window)
        ev.update(preemptions=ex.preemptions, recomputed_tokens=ex.recomputed_tokens,
                  recompute_ratio=ex.recompute_ratio, recompute_time_share=ex.recompute_time_share,
                  source="steps (exact)")
        ok = ex.preemptions > 0 and (ex.recompute_ratio or 0) >= th.recompute_ratio
        return Symptom(sid, name, _verdict(ok), ev, thr)
    if series is not None:
        # Without the caller's estimate the engine arguments are unknown (policy, admission).
        est = estimate or recompute_from_series(series, *window, policy=None)
        if est.available and est.preemptions is not None:
            ev.update(preemptions=est.preemptions, recompute_ratio=est.recompute_ratio,
                      ratio_low=est.ratio_low, ratio_high=est.ratio_high,
                      source="series (estimated range)")
            ratio = est.recompute_ratio
            if est.preemptions > 0 and ratio is None:
                return Symptom(sid, name, "no data", {**ev, "missing": "token counters"}, thr)
            ok = est.preemptions > 0 and (ratio or 0.0) >= th.recompute_ratio
            return Symptom(sid, name, _verdict(ok), ev, thr)
        if S.has_metric(series, PREEMPTIONS):
            p = S.counter_increase(S.metric_values(series, PREEMPTIONS), window, origin)
            ev.update(preemptions=p, source="series")
            if not p:
                return Symptom(sid, name, "absent", ev, thr)
            return Symptom(sid, name, "no data",
                           {**ev, "missing": "counters to size the recompute"}, thr)
    return Symptom(sid, name, "no data", {**ev, "missing": PREEMPTIONS}, thr)


ITL_P99_NOTE = ("ITL p99 stands in for p95: the runs have no p95 (vllm bench serve writes p99 "
                "unless given --metric-percentiles 95,99)")


def itl_tail_column(runs: pd.DataFrame | None) -> str | None:
    """The ITL tail a runs table measured: ``itl_p95_s``, else ``itl_p99_s``, else None."""
    if runs is None:
        return None
    for column in ("itl_p95_s", "itl_p99_s"):
        if column in runs.columns and pd.to_numeric(runs[column], errors="coerce").notna().any():
            return column
    return None


def _itl(series: pd.DataFrame | None, runs: pd.DataFrame | None, window: S.Window,
         th: Thresholds, x: str, origin: str = "first") -> Symptom:
    sid, name = "itl_jitter", "ITL p95 and its spread grow while mean throughput looks normal"
    thr = {"itl_spread_growth": th.itl_spread_growth, "itl_spread_window": th.itl_spread_window}
    tail = itl_tail_column(runs)
    if runs is not None and tail and {x, "itl_mean_s"} <= set(runs.columns):
        r = runs[[x, tail, "itl_mean_s"]].apply(pd.to_numeric, errors="coerce").dropna()
        r = r[r["itl_mean_s"] > 0].groupby(x).mean().sort_index()
        if len(r) >= 2:
            spread = r[tail] / r["itl_mean_s"]
            growth = float(spread.iloc[-1] / spread.iloc[0])
            ev = {"spread_by_concurrency": {str(k): float(v) for k, v in spread.items()},
                  "spread_growth": growth, "source": "runs", "tail": tail}
            if tail != "itl_p95_s":
                ev["note"] = ITL_P99_NOTE
            return Symptom(sid, name, _verdict(growth >= th.itl_spread_growth), ev, thr)
    if series is not None:
        h = S.histogram_window(series, ITL, window, origin)
        if h is not None and h[2] > 0:
            buckets, total, count = h
            p95 = S.histogram_quantile(0.95, buckets)
            p99 = S.histogram_quantile(0.99, buckets)
            mean = total / count
            spread = p95 / mean if p95 is not None and mean > 0 else None
            # p95 interpolated inside the bucket that also holds the mean is not resolved by
            # the bucket layout (a constant ITL would read as 1.5x): no spread is claimed then.
            les = sorted(buckets)
            same_bucket = p95 is not None and np.searchsorted(les, p95) == np.searchsorted(
                les, mean)
            ev = {"itl_mean_s": mean, "itl_p95_s": p95, "itl_p99_s": p99, "spread": spread,
                  "p95_in_mean_bucket": bool(same_bucket), "source": "series (histogram)"}
            if spread is None:
                return Symptom(sid, name, "no data", ev, thr)
            ok = spread >= th.itl_spread_window and not same_bucket
            return Symptom(sid, name, _verdict(ok), ev, thr)
    return Symptom(sid, name, "no data",
                   {"missing": f"{ITL} histogram or runs with itl_p95_s, itl_mean_s"}, thr)


def check_symptoms(
    series: pd.DataFrame | None = None,
    *,
    runs: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    t0: float | None = None,
    t1: float | None = None,
    run: str | None = None,
    max_num_seqs: int | None = None,
    thresholds: Thresholds | None = None,
    x: str = "concurrency",
    y: str = "output_throughput",
    recompute: RecomputeEstimate | None = None,
    counters: S.Window | None = None,
    counter_origin: str = "first",
) -> SymptomChecklist:
    """The six symptoms over ``(t0, t1]`` of one run's series/steps, plus the runs curve.

    ``counters``: where counters and histograms are read when not over the gauges' ``(t0,
    t1]`` (a level's whole window, its gauges over the steady part). ``counter_origin="zero"``:
    the series start with the server (or are one scrape), so counters count from the
    server's start.

    ``max_num_seqs`` defaults to the ``max_num_seqs`` column of ``runs`` when it has one value.
    ``recompute`` is the window's estimate made with the engine arguments the data came with
    (policy, admission rule, pool); without it the estimate from series assumes them unknown.
    """
    th = thresholds or Thresholds()
    window = (t0, t1)
    if series is not None:
        series = S.check_series(series)
        series = S.select_run(series, run)
        if series.empty:
            series = None
    if max_num_seqs is None and runs is not None and "max_num_seqs" in runs:
        vals = pd.to_numeric(runs["max_num_seqs"], errors="coerce").dropna().unique()
        if len(vals) == 1:
            max_num_seqs = int(vals[0])
    symptoms = [_curve(runs, th, x, y)]
    symptoms += _gauge_symptoms(series, steps, window, max_num_seqs, th)
    counters = counters or window
    if counter_origin == "zero":
        counters = (None, counters[1])
    symptoms.append(_recompute(series, steps, runs, counters, th, x, recompute, counter_origin))
    symptoms.append(_itl(series, runs, counters, th, x, counter_origin))
    return SymptomChecklist(symptoms=symptoms, window=window, thresholds=th)
