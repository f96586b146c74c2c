"""Recompute ratio over a window: exact from simulated steps, an estimated range from counters.

The recompute ratio is recomputed tokens / all tokens processed (scheduled) in the window.

Exact (simulation): ``steps.csv`` counts every recomputed token, so the ratio is
Σ recomputed_tokens / Σ num_scheduled_tokens. When steps carry ``step_duration_s``, the time spent
on recompute is each step's duration pro-rated by the recomputed share of its scheduled tokens.
Token share is the simplest attribution of a step's compute and needs no cost model; it
overstates the cost in memory-bound decode steps, where added prefill tokens ride along almost
free, so read it as an upper figure of the time recompute took.

Estimated (real server): vLLM 0.33.0 exports no counter of recomputed tokens. The estimate is
``kvpressure.ingestion.recompute_estimate.recompute_range`` (FCFS victims sized by the mean prompt
of newly started requests, the docs/scheduler.md#rec-estimate range otherwise; the module says how),
the one estimator behind both the ``runs`` table and this module, so the two never disagree over the
same window.

The estimator is checked against the simulation, which knows every recomputed token, by
``validate_recompute_estimator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvpressure.analysis import _series as S
from kvpressure.analysis._steps import is_timed, require_columns, steps_in_window
from kvpressure.errors import InputError
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.names import PREEMPTIONS
from kvpressure.ingestion.recompute_estimate import recompute_range
from kvpressure.jsonable import finite_or_none, to_jsonable


@dataclass
class RecomputeExact:
    """Recompute counted step by step (simulation)."""

    window: tuple[float | None, float | None]
    steps: int
    scheduled_tokens: int
    recomputed_tokens: int
    recompute_ratio: float | None
    preemptions: int
    resumed: int
    busy_time_s: float | None = None
    recompute_time_s: float | None = None
    recompute_time_share: float | None = None
    method: str = "exact: sum of recomputed_tokens / sum of num_scheduled_tokens over the steps"

    @property
    def ratio_low(self) -> float | None:
        return self.recompute_ratio

    @property
    def ratio_high(self) -> float | None:
        return self.recompute_ratio

    def to_dict(self) -> dict:
        d = to_jsonable(self)
        d.update(kind="exact", ratio_low=self.recompute_ratio, ratio_high=self.recompute_ratio)
        return d


@dataclass
class RecomputeEstimate:
    """Recompute estimated from exported counters: a range, a point and its assumptions."""

    window: tuple[float | None, float | None]
    available: bool
    preemptions: float | None
    recomputed_low: float | None = None
    recomputed_point: float | None = None
    recomputed_high: float | None = None
    processed_without_recompute: float | None = None
    ratio_low: float | None = None
    recompute_ratio: float | None = None
    ratio_high: float | None = None
    victim_context_tokens: float | None = None
    method: str = ""
    assumptions: list[str] = field(default_factory=list)
    inputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = to_jsonable(self)
        d["kind"] = "estimate"
        return d


def recompute_from_steps(
    steps: pd.DataFrame, t0: float | None = None, t1: float | None = None
) -> RecomputeExact:
    """Exact recompute over ``(t0, t1]`` (seconds when steps are timed, else step numbers)."""
    require_columns(steps, ("recomputed_tokens", "num_scheduled_tokens"), "steps")
    w = steps_in_window(steps, (t0, t1))
    sched = int(w["num_scheduled_tokens"].sum())
    rec = int(w["recomputed_tokens"].sum())
    out = RecomputeExact(
        window=(t0, t1),
        steps=len(w),
        scheduled_tokens=sched,
        recomputed_tokens=rec,
        recompute_ratio=rec / sched if sched > 0 else None,
        preemptions=int(w["preemptions"].sum()) if "preemptions" in w else 0,
        resumed=int(w["resumed"].sum()) if "resumed" in w else 0,
    )
    if is_timed(w):
        dur = w["step_duration_s"].astype(float).to_numpy()
        n = w["num_scheduled_tokens"].astype(float).to_numpy()
        r = w["recomputed_tokens"].astype(float).to_numpy()
        share = np.divide(r, n, out=np.zeros_like(r), where=n > 0)
        out.busy_time_s = float(dur.sum())
        out.recompute_time_s = float((dur * share).sum())
        out.recompute_time_share = (
            out.recompute_time_s / out.busy_time_s if out.busy_time_s > 0 else None
        )
    return out


def recompute_from_series(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    num_gpu_blocks: int | None = None,
    block_size: int | None = None,
    enable_prefix_caching: bool | None = None,
    policy: str | None = None,
    scheduler_reserve_full_isl: bool | None = None,
    z: float = 2.0,
    origin: str = "first",
) -> RecomputeEstimate:
    """Estimated recomputed tokens and recompute ratio over ``(t0, t1]`` from counters: the
    ingestion estimator (``kvpressure.ingestion.recompute_estimate.recompute_range``, the same
    numbers as the ``runs`` table) as a ``RecomputeEstimate``.

    ``available`` is False (and every number None) when ``vllm:num_preemptions_total`` is
    missing: missing is never read as zero. ``scheduler_reserve_full_isl`` is the admission
    rule (not exported): True (vLLM 0.33.0's default) admits a request only when its whole
    prompt fits, so an FCFS victim has its prompt computed; False admits by first chunk, and
    victims are often cut mid-prompt with far less computed (the simulation shows a few hundred
    tokens against prompts of thousands), so only the wide D4 range holds; None (unknown) uses
    the FCFS point inside the union of both ranges, as does ``policy=None``.
    """
    series = S.select_run(S.check_series(series), run)
    window = (t0, t1)
    engine = EngineFacts(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                         enable_prefix_caching=enable_prefix_caching, scheduling_policy=policy,
                         scheduler_reserve_full_isl=scheduler_reserve_full_isl)
    est = recompute_range(series, t0, t1, run=run, engine=engine, origin=origin, z=z)
    params = est["params"]
    inputs = {
        "num_gpu_blocks": params["num_gpu_blocks"], "block_size": params["block_size"],
        "enable_prefix_caching": params["prefix_caching"], "policy": policy, "z": z,
        "scheduler_reserve_full_isl": scheduler_reserve_full_isl,
        "prompt_mean": params.get("prompt_mean"), "prompt_sd": params.get("prompt_sd"),
        "resident_context": params.get("mean_victim_context_tokens"),
        "processed_tokens_from": params.get("processed_tokens_from"), "origin": origin,
        "d4": est["d4"],
    }
    preemptions = finite_or_none(est["preemptions"])
    if preemptions is None:
        return RecomputeEstimate(
            window=window, available=False, preemptions=None,
            method=f"no data: {PREEMPTIONS} is not in the series",
            assumptions=est["assumptions"], inputs=inputs,
        )
    available = finite_or_none(est["point"]) is not None
    return RecomputeEstimate(
        window=window,
        available=available,
        preemptions=preemptions,
        recomputed_low=finite_or_none(est["low"]),
        recomputed_point=finite_or_none(est["point"]),
        recomputed_high=finite_or_none(est["high"]),
        processed_without_recompute=finite_or_none(est["processed_tokens"]),
        ratio_low=finite_or_none(est["ratio_low"]),
        recompute_ratio=finite_or_none(est["ratio_point"]),
        ratio_high=finite_or_none(est["ratio_high"]),
        victim_context_tokens=finite_or_none(est["victim_context_tokens"]),
        method=est["method"] if available else "no data: " + est["method"],
        assumptions=est["assumptions"],
        inputs=inputs,
    )


# --------------------------------------------------------------------------- validation


@dataclass
class EstimatorCase:
    """One simulated run seen both ways: exact ``steps`` and its Prometheus ``series``."""

    name: str
    steps: pd.DataFrame
    series: pd.DataFrame
    policy: str = "fcfs"
    enable_prefix_caching: bool | None = None
    scheduler_reserve_full_isl: bool | None = None


@dataclass
class EstimatorValidation:
    windows: list[dict]
    n_cases: int
    n_windows: int
    coverage: float | None
    coverage_ratio: float | None
    median_rel_width: float | None
    median_abs_point_error: float | None
    z: float
    d4_coverage: float | None = None
    d4_median_rel_width: float | None = None

    def to_dict(self) -> dict:
        return to_jsonable(self)


def _windows_for(series: pd.DataFrame, windows_per_case: int) -> list[tuple[float, float]]:
    ts = np.sort(pd.to_numeric(series["t"]).unique())
    if len(ts) < 2:
        return []
    k = max(1, min(windows_per_case, len(ts) - 1))
    edges = np.unique(np.linspace(0, len(ts) - 1, k + 1).round().astype(int))
    return [(float(ts[a]), float(ts[c])) for a, c in zip(edges[:-1], edges[1:], strict=True)]


def validate_recompute_estimator(
    cases: list[EstimatorCase] | list[tuple],
    *,
    windows_per_case: int = 6,
    z: float = 2.0,
) -> EstimatorValidation:
    """Compare the counter-based range with the simulation's exact recompute, window by window.

    Windows end on scrape timestamps (so counters are read exactly at the edges). Only windows
    where something was recomputed or preempted count. ``coverage`` is the share of windows
    whose exact recomputed tokens lie inside [low, high]; ``median_rel_width`` is
    (high − low) / exact; ``median_abs_point_error`` is |point − exact| / exact.
    """
    rows: list[dict] = []
    norm = [c if isinstance(c, EstimatorCase) else EstimatorCase(*c) for c in cases]
    for case in norm:
        if "time_s" not in case.steps.columns:
            raise InputError(f"case {case.name}: steps need time_s/step_duration_s (timed run)")
        for a, c in _windows_for(case.series, windows_per_case):
            exact = recompute_from_steps(case.steps, a, c)
            est = recompute_from_series(
                case.series, a, c, policy=case.policy,
                enable_prefix_caching=case.enable_prefix_caching,
                scheduler_reserve_full_isl=case.scheduler_reserve_full_isl, z=z,
            )
            if not est.available:
                continue
            if exact.recomputed_tokens == 0 and not est.preemptions:
                continue
            truth = exact.recomputed_tokens
            lo, hi = est.recomputed_low or 0.0, est.recomputed_high or 0.0
            rows.append({
                "case": case.name, "t0": a, "t1": c, "exact": truth,
                "preemptions_counted": est.preemptions, "preemptions_exact": exact.preemptions,
                "low": lo, "point": est.recomputed_point, "high": hi,
                "inside": bool(lo - 0.5 <= truth <= hi + 0.5),
                "d4_low": est.inputs["d4"]["low"], "d4_high": est.inputs["d4"]["high"],
                "ratio_exact": exact.recompute_ratio,
                "ratio_low": est.ratio_low, "ratio_high": est.ratio_high,
                "ratio_inside": (
                    exact.recompute_ratio is not None and est.ratio_low is not None
                    and est.ratio_high is not None
                    and est.ratio_low - 1e-3 <= exact.recompute_ratio <= est.ratio_high + 1e-3
                ),
            })
    n = len(rows)
    pos = [r for r in rows if r["exact"] > 0]
    return EstimatorValidation(
        windows=rows,
        n_cases=len(norm),
        n_windows=n,
        coverage=sum(r["inside"] for r in rows) / n if n else None,
        coverage_ratio=sum(r["ratio_inside"] for r in rows) / n if n else None,
        median_rel_width=(
            float(np.median([(r["high"] - r["low"]) / r["exact"] for r in pos])) if pos else None
        ),
        median_abs_point_error=(
            float(np.median([abs(r["point"] - r["exact"]) / r["exact"] for r in pos]))
            if pos else None
        ),
        z=z,
        d4_coverage=(sum(_inside(r["exact"], r["d4_low"], r["d4_high"]) for r in rows) / n
                     if n else None),
        d4_median_rel_width=(
            float(np.median([(r["d4_high"] - r["d4_low"]) / r["exact"] for r in pos]))
            if pos and all(not math.isnan(r["d4_high"]) for r in pos) else None
        ),
    )


def _inside(truth: float, lo: float, hi: float) -> bool:
    return not (math.isnan(lo) or math.isnan(hi)) and lo - 0.5 <= truth <= hi + 0.5
