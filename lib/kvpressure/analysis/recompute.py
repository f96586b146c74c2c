"""Recompute ratio over a window: exact from simulated steps, an estimated range from counters.

The recompute ratio is recomputed tokens / all tokens processed (scheduled) in the window.

Exact (simulation): ``steps.csv`` counts every recomputed token, so the ratio is
Σ recomputed_tokens / Σ num_scheduled_tokens. When steps carry ``step_duration_s``, the time spent
on recompute is each step's duration pro-rated by the recomputed share of its scheduled tokens.
Token share is the simplest attribution of a step's compute and needs no cost model; it
overstates the cost in memory-bound decode steps, where added prefill tokens ride along almost
free, so read it as an upper figure of the time recompute took.

Estimated (real server): vLLM 0.33.0 exports no counter of recomputed tokens. Every preemption
is counted by ``vllm:num_preemptions_total`` when its victim next emits output, i.e. at the end of
the re-prefill that does the recompute, so preemption counts and recompute land in the same
window. Recomputed tokens = Σ over preemptions of the victim's context minus what survives in the
prefix cache. How big a victim's context is depends on the policy:

* FCFS with full-sequence admission (``scheduler_reserve_full_isl``, vLLM 0.33.0's default)
  takes the tail of the running list: the most recently (re)admitted request, which has its
  prompt computed and few output tokens. Its context is close to a prompt length, so the window's
  mean prompt (Δ``vllm:prompt_tokens_total`` / Δ``vllm:time_to_first_token_seconds_count``) plus
  half a block is the point estimate, and the spread of prompt lengths (from
  ``vllm:request_prompt_tokens``) over P victims gives the range (±z·sd·√P).
* Otherwise (priority, admission by first chunk, or no prompt counters) the mean context held per running request while the
  pool is full, ``usage·(N−1)·B/running − B/2`` (N, B from ``vllm:cache_config_info``), is used.
* With prefix caching on, a victim's full blocks may survive and come back as hits that no
  exporter shows, so the low end drops to the partial tail, (B−1)/2 per preemption.

The estimator is checked against the simulation, which knows every recomputed token, by
``validate_recompute_estimator``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from kvpressure.analysis import _series as S
from kvpressure.analysis._steps import is_timed, require_columns, steps_in_window
from kvpressure.errors import InputError
from kvpressure.ingestion.recompute_estimate import recompute_range

PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
PROMPT_HIST = "vllm:request_prompt_tokens"
CACHE_CONFIG = "vllm:cache_config_info"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


def _clean(value: object) -> object:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, np.generic):
        return _clean(value.item())
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def to_jsonable(obj: object) -> dict:
    """A dataclass as a JSON-able dict (NaN and inf become null)."""
    return _clean(asdict(obj))  # type: ignore[arg-type,return-value]


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


def _pool_shape(
    series: pd.DataFrame,
    num_gpu_blocks: int | None,
    block_size: int | None,
    enable_prefix_caching: bool | None,
) -> tuple[int | None, int | None, bool | None]:
    rows = series[series["metric"] == CACHE_CONFIG]
    labels = S.parse_labels(rows["labels"].iloc[-1]) if not rows.empty else {}

    def as_int(v: str | None) -> int | None:
        try:
            return int(float(v)) if v not in (None, "None", "") else None
        except ValueError:
            return None

    n = num_gpu_blocks if num_gpu_blocks is not None else as_int(labels.get("num_gpu_blocks"))
    b = block_size if block_size is not None else as_int(labels.get("block_size"))
    pc = enable_prefix_caching
    if pc is None and "enable_prefix_caching" in labels:
        pc = labels["enable_prefix_caching"].lower() == "true"
    return n, b, pc


def _prompt_stats(series: pd.DataFrame, window: S.Window) -> tuple[float | None, float | None]:
    """Mean prompt of requests whose first token fell in the window, and the prompt spread."""
    mean = None
    prompt = S.metric_values(series, PROMPT_TOKENS)
    firsts = S.metric_values(series, TTFT_COUNT)
    for w in (window, (None, None)):
        dp, dn = S.counter_increase(prompt, w), S.counter_increase(firsts, w)
        if dp is not None and dn:
            mean = dp / dn
            break
    sd = None
    hist = S.histogram_window(series, PROMPT_HIST)
    if hist is not None:
        buckets, hsum, hcount = hist
        moments = S.histogram_moments(buckets)
        if moments is not None:
            sd = moments[1]
            if mean is None and hcount > 0:
                mean = hsum / hcount
    return mean, sd


def recompute_from_series(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    num_gpu_blocks: int | None = None,
    block_size: int | None = None,
    enable_prefix_caching: bool | None = None,
    policy: str = "fcfs",
    scheduler_reserve_full_isl: bool | None = None,
    z: float = 2.0,
) -> RecomputeEstimate:
    """Estimated recomputed tokens and recompute ratio over ``(t0, t1]`` from counters.

    ``available`` is False (and every number None) when ``vllm:num_preemptions_total`` is
    missing: missing is never read as zero. ``scheduler_reserve_full_isl`` is the admission
    rule (not exported): True (vLLM 0.33.0's default) admits a request only when its whole
    prompt fits, so an FCFS victim has its prompt computed; False admits by first chunk, and
    victims are often cut mid-prompt with far less computed (the simulation shows a few hundred
    tokens against prompts of thousands), so only the wide D4 range holds; None (unknown) uses
    the FCFS point inside the union of both ranges.
    """
    series = S.check_series(series)
    series = S.select_run(series, run)
    window = (t0, t1)
    p = S.counter_increase(S.metric_values(series, PREEMPTIONS), window)
    if p is None:
        return RecomputeEstimate(
            window=window, available=False, preemptions=None,
            method="no data: vllm:num_preemptions_total is not in the series",
        )
    n, b, prefix_caching = _pool_shape(series, num_gpu_blocks, block_size, enable_prefix_caching)
    b_eff = b if b is not None else 16
    d4 = recompute_range(series, t0, t1, num_gpu_blocks=n, block_size=b,
                         prefix_caching=prefix_caching)
    d4_ok = not math.isnan(d4["high"])
    ctx_res = d4["params"].get("mean_victim_context_tokens")
    prompt_mean, prompt_sd = _prompt_stats(series, window)

    by_source = S.metric_values(series, PROMPT_BY_SOURCE, {"source": "local_compute"})
    prompt_inc = S.counter_increase(by_source, window)
    if prompt_inc is None:
        prompt_inc = S.counter_increase(S.metric_values(series, PROMPT_TOKENS), window)
    gen_inc = S.counter_increase(S.metric_values(series, GENERATION_TOKENS), window)
    base = None if prompt_inc is None or gen_inc is None else prompt_inc + gen_inc

    assumptions: list[str] = [
        "a preemption is counted when its victim next emits output, right after the re-prefill "
        "that recomputes it, so counts and recompute fall in the same window (edges can shift)",
    ]
    if b is None:
        assumptions.append("block_size unknown (no vllm:cache_config_info): 16 assumed")
    sd = prompt_sd if prompt_sd is not None else 0.0
    fcfs_prompt = policy == "fcfs" and prompt_mean is not None
    if fcfs_prompt and scheduler_reserve_full_isl is False and d4_ok:
        fcfs_prompt = False
        assumptions.append("admission by first chunk (scheduler_reserve_full_isl off): victims "
                           "may be cut mid-prompt, so the FCFS prompt rule does not apply")
    if fcfs_prompt:
        victim = prompt_mean + b_eff / 2
        spread = z * sd * math.sqrt(p) if p > 0 else 0.0
        low, point, high = p * victim - spread, p * victim, p * victim + spread
        low = max(low, p * b_eff / 2)
        method = "FCFS victim = most recently admitted request: prompt computed + a partial block"
        assumptions.append(
            f"victim context ~ mean prompt of newly started requests ({prompt_mean:.0f} tokens) "
            f"+ B/2; range +-{z:g} sd of prompt lengths over sqrt(P) victims"
        )
        if ctx_res is not None and ctx_res > victim:
            # A resumed request goes to the tail of the running list and is the next victim,
            # now with output tokens too: allow a quarter of the victims the mean resident
            # context (the D4 figure), never above D4's high end.
            high = max(high, min(p * ctx_res, high + 0.25 * p * (ctx_res - victim)))
    elif d4_ok:
        victim = ctx_res
        low, point, high = d4["low"], d4["point"], d4["high"]
        method = "mean context held per running request (spec D4, ingestion.recompute_range)"
        assumptions.extend(d4["assumptions"])
    else:
        return RecomputeEstimate(
            window=window, available=False, preemptions=p,
            method="no data: neither prompt counters nor pool shape to size a victim's context",
            assumptions=list(d4["assumptions"]),
            inputs={"num_gpu_blocks": n, "block_size": b},
        )
    if fcfs_prompt and scheduler_reserve_full_isl is None and d4_ok:
        low, high = min(low, d4["low"]), max(high, d4["high"])
        assumptions.append("admission rule unknown: the range spans the D4 range too "
                           "(pass scheduler_reserve_full_isl to narrow it)")
    if prefix_caching and fcfs_prompt:
        hits = S.counter_increase(S.metric_values(series, PREFIX_HITS), window)
        queries = S.counter_increase(S.metric_values(series, PREFIX_QUERIES), window)
        hit_rate = hits / queries if hits is not None and queries else 0.0
        point *= 1.0 - hit_rate
        low = p * (b_eff - 1) / 2
        assumptions.append(
            "prefix caching on: hits at resume are not exported; low end = only the partial tail "
            "block recomputed per preemption, point reduced by the window's prefix hit rate"
        )
    elif prefix_caching is None:
        assumptions.append("prefix caching state unknown: treated as off")

    def ratio(r: float) -> float | None:
        if base is None or base + r <= 0:
            return None
        return r / (base + r)

    return RecomputeEstimate(
        window=window,
        available=True,
        preemptions=p,
        recomputed_low=low,
        recomputed_point=point,
        recomputed_high=high,
        processed_without_recompute=base,
        ratio_low=ratio(low),
        recompute_ratio=ratio(point),
        ratio_high=ratio(high),
        victim_context_tokens=victim,
        method=method,
        assumptions=assumptions,
        inputs={
            "num_gpu_blocks": n, "block_size": b, "enable_prefix_caching": prefix_caching,
            "policy": policy, "z": z, "scheduler_reserve_full_isl": scheduler_reserve_full_isl, "prompt_mean": prompt_mean, "prompt_sd": prompt_sd,
            "resident_context": ctx_res, "prompt_tokens_increase": prompt_inc,
            "generation_tokens_increase": gen_inc,
            "d4": {k: d4[k] for k in ("low", "point", "high", "ratio_low", "ratio_high")},
        },
    )


def recompute_window(
    series: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    t0: float | None = None,
    t1: float | None = None,
    **kwargs: object,
) -> RecomputeExact | RecomputeEstimate:
    """Exact when steps are given (simulation), else the estimate from series."""
    if steps is not None:
        return recompute_from_steps(steps, t0, t1)
    if series is None:
        raise InputError("recompute: pass series (counters) or steps (simulation)")
    return recompute_from_series(series, t0, t1, **kwargs)  # type: ignore[arg-type]


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
