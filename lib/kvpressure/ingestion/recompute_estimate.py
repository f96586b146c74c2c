"""Recomputed tokens estimated from what a real vLLM exports (no counter sees recompute).

vLLM 0.33.0 counts a request's prompt once, at its first output; a preempted request's re-prefill
moves no token counter (docs/scheduler.md#rec-counters). What is exported is the number of
preemptions ``P`` (counted when the victim next emits output, right after the re-prefill that
recomputes it, so counts and recompute fall in the same window), the KV usage, the number of running
requests, the prompt counters and the pool geometry in ``vllm:cache_config_info``. Recomputed tokens
are ``P`` times a victim's context minus what survives in the prefix cache; the policy and the
admission rule decide how big a victim's context is:

* FCFS with full-sequence admission (``scheduler_reserve_full_isl``, vLLM 0.33.0's default)
  preempts the tail of the running list: the most recently (re)admitted request, which has its
  prompt computed and few output tokens. Its context is about a prompt: the window's mean
  prompt of newly started requests (Δ``vllm:prompt_tokens_total`` /
  Δ``vllm:time_to_first_token_seconds_count``) plus half a block is the point, and the spread
  of prompt lengths (``vllm:request_prompt_tokens``) over ``P`` victims gives the range
  (±z·sd·√P). A resumed request goes back to the tail and may be preempted again, now with
  output tokens too, so the high end lets a quarter of the victims hold the mean resident
  context (the figure below).
* Otherwise (priority, or admission by first chunk, where victims are often cut mid-prompt with far
  less computed, or no prompt counters) the range of docs/scheduler.md#rec-estimate: for every
  scrape interval in which the preemption counter rose by ``dP``, with the gauges of the scrape just
  before it,

      Ctx  = usage * (N - 1) * B / running - B / 2     tokens held by an average running request
      high = sum dP * Ctx                              nothing of a victim survives
      low  = sum dP * (B - 1) / 2                      all its full blocks survive in the prefix
                                                       cache; only the partly filled last block
                                                       is redone
      point: prefix caching off -> high; on -> sum dP * max((1 - hit_rate) * Ctx, (B - 1) / 2)

* Policy or admission rule unknown: the FCFS point (vLLM's defaults) inside the union of both
  ranges.
* Prefix caching on: hits at resume are not exported (docs/scheduler.md#kv-stats), so the low end is
  the partial tail block per preemption and the point is reduced by the window's prefix hit rate.

The ratio puts the estimate over all processed tokens: prompt tokens computed locally
(``prompt_tokens_by_source{source=local_compute}``, else ``prompt_tokens`` minus
``prompt_tokens_cached``, else ``prompt_tokens``) + generated tokens + the recompute itself (vLLM's
``scheduled = prompt + output - 1 - hits + recomputed`` per request, to within a token per request).
Where this goes wrong is docs/scheduler.md#rec-pitfalls; the assumptions travel with the numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.cache_config import cache_config
from kvpressure.ingestion.counters import (
    gauge_mean,
    histogram_buckets,
    interval_increases,
    select,
    window_increase,
)
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.labels import parse_labels
from kvpressure.ingestion.names import (
    CACHE_CONFIG_INFO,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_LENGTHS,
    PROMPT_TOKENS,
    RUNNING,
)

FIRST_TOKENS = "vllm:time_to_first_token_seconds_count"

POLICIES = ("fcfs", "priority")
DEFAULT_BLOCK_SIZE = 16  # vLLM's default, used only to size the FCFS victim's partial block
RESUMED_VICTIM_SHARE = 0.25  # share of FCFS victims allowed the mean resident context (high end)


def _values_at(s: pd.Series, times: np.ndarray) -> np.ndarray:
    """The gauge at each of ``times``: its last sample at or before it (NaN before any)."""
    if len(s) == 0:
        return np.full(len(times), math.nan)
    idx = np.searchsorted(s.index.to_numpy(), times, side="right") - 1
    values = s.to_numpy(dtype=float)[np.maximum(idx, 0)]
    return np.where(idx >= 0, values, math.nan)


def _window_points(
    t: np.ndarray, v: np.ndarray, t0: float | None, t1: float | None, origin: str
) -> tuple[np.ndarray, np.ndarray]:
    """Interval start times and increases of a counter over the window."""
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(v) == 0:
        return np.zeros(0), np.zeros(0)
    hi = len(v) if t1 is None else int(np.searchsorted(t, t1, side="right"))
    lo = 0 if t0 is None else int(np.searchsorted(t, t0, side="right")) - 1
    from_zero = origin == "zero" and (t0 is None or lo < 0)
    lo = max(lo, 0)
    seg_t, seg_v = t[lo:hi], v[lo:hi]
    if from_zero and len(seg_v):
        # The counter was 0 when the log began; its first interval's "before" is the first scrape.
        seg_t = np.concatenate(([seg_t[0]], seg_t))
        seg_v = np.concatenate(([0.0], seg_v))
    if len(seg_v) < 2:
        return np.zeros(0), np.zeros(0)
    return seg_t[:-1], interval_increases(seg_t, seg_v)


def _base_tokens(
    series: pd.DataFrame, t0: float | None, t1: float | None, run: str | None, origin: str
) -> tuple[float, str]:
    kw: dict[str, Any] = {"run": run, "origin": origin}
    gen = window_increase(series, "vllm:generation_tokens_total", t0, t1, **kw)
    local = window_increase(
        series, "vllm:prompt_tokens_by_source_total", t0, t1, {"source": "local_compute"}, **kw
    )
    if not math.isnan(local):
        prompt, how = local, "prompt_tokens_by_source{source=local_compute}"
    else:
        prompt = window_increase(series, PROMPT_TOKENS, t0, t1, **kw)
        cached = window_increase(series, "vllm:prompt_tokens_cached_total", t0, t1, **kw)
        how = "prompt_tokens"
        if not math.isnan(prompt) and not math.isnan(cached):
            prompt, how = prompt - cached, "prompt_tokens - prompt_tokens_cached"
    if math.isnan(gen) or math.isnan(prompt):
        return math.nan, how + " + generation_tokens (missing)"
    return prompt + gen, how + " + generation_tokens"


def _histogram_sd(buckets: pd.Series) -> float | None:
    """Standard deviation implied by cumulative bucket counts (uniform inside each bucket):
    coarse, but enough for a spread when only the bucket layout is known."""
    bounds = [float(le) for le in buckets.index if not math.isinf(le)]
    if not bounds:
        return None
    cum = buckets.loc[bounds].to_numpy(dtype=float)
    if cum[-1] <= 0:
        return None
    counts = np.diff(np.concatenate([[0.0], cum]))
    lowers = np.concatenate([[0.0], bounds[:-1]])
    uppers = np.array(bounds)
    p = counts / counts.sum()
    mids = (lowers + uppers) / 2
    mean = float((p * mids).sum())
    var = float((p * ((mids - mean) ** 2 + (uppers - lowers) ** 2 / 12)).sum())
    return math.sqrt(max(var, 0.0))


def _prompt_stats(
    series: pd.DataFrame, t0: float | None, t1: float | None, run: str | None, origin: str
) -> tuple[float | None, float | None]:
    """Mean prompt of the requests whose first token fell in the window (else of the whole
    series), and the spread of prompt lengths."""
    mean = None
    for a, b in ((t0, t1), (None, None)):
        dp = window_increase(series, PROMPT_TOKENS, a, b, run=run, origin=origin)
        dn = window_increase(series, FIRST_TOKENS, a, b, run=run, origin=origin)
        if not math.isnan(dp) and not math.isnan(dn) and dn > 0:
            mean = dp / dn
            break
    # The spread is a property of the workload: the whole series gives more requests to read it
    # from than a short window.
    buckets = histogram_buckets(series, PROMPT_LENGTHS, run=run, origin=origin)
    sd = _histogram_sd(buckets) if len(buckets) else None
    if mean is None and len(buckets):
        total = window_increase(series, PROMPT_LENGTHS + "_sum", run=run, origin=origin)
        count = window_increase(series, PROMPT_LENGTHS + "_count", run=run, origin=origin)
        if not math.isnan(total) and not math.isnan(count) and count > 0:
            mean = total / count
    return mean, sd


def _d4(
    series: pd.DataFrame,
    t0: float | None,
    t1: float | None,
    run: str | None,
    origin: str,
    n_blocks: int | None,
    b_size: int | None,
    caching: bool | None,
    hit_rate: float,
) -> dict[str, Any]:
    """The range of docs/scheduler.md#rec-estimate over the window: ``preemptions``,
    ``low``/``point``/``high`` (NaN when the pool geometry or the gauges are missing), the mean
    resident context and the gauge fallbacks."""
    out: dict[str, Any] = {"preemptions": 0.0, "low": 0.0, "point": 0.0, "high": 0.0,
                           "context": None, "fallbacks": 0}
    weighted = 0.0
    for key, s in select(series, PREEMPTIONS, None, run).items():
        starts, incs = _window_points(s.index.to_numpy(), s.to_numpy(), t0, t1, origin)
        out["preemptions"] += float(incs.sum())
        moved = incs > 0
        if not moved.any():
            continue
        if n_blocks is None or b_size is None:
            out["low"] = out["point"] = out["high"] = math.nan
            continue
        # Gauges of the same engine as the counter (its labels), just before the preemptions.
        gauge_labels = parse_labels(key)
        u_s = next(iter(select(series, KV_USAGE, gauge_labels, run).values()), pd.Series(dtype=float))
        r_s = next(iter(select(series, RUNNING, gauge_labels, run).values()),
                   pd.Series(dtype=float))
        t_before, d_p = starts[moved], incs[moved]
        u, r = _values_at(u_s, t_before), _values_at(r_s, t_before)
        bad = ~((u > 0) & (r > 0))
        out["fallbacks"] += int(bad.sum())
        u[bad] = gauge_mean(series, KV_USAGE, t0, t1, gauge_labels, run=run)
        r[bad] = gauge_mean(series, RUNNING, t0, t1, gauge_labels, run=run)
        with np.errstate(divide="ignore", invalid="ignore"):
            ctx = u * (n_blocks - 1) * b_size / r - b_size / 2
        ctx[~((u > 0) & (r > 0))] = math.nan
        floor = (b_size - 1) / 2
        out["low"] += float(d_p.sum()) * floor
        if np.isnan(ctx).any():
            out["point"] = out["high"] = math.nan
            continue
        ctx = np.maximum(ctx, floor)
        weighted += float(np.dot(d_p, ctx))
        out["high"] += float(np.dot(d_p, ctx))
        rate = 0.0 if not caching or math.isnan(hit_rate) else hit_rate
        out["point"] += float(np.dot(d_p, np.maximum((1.0 - rate) * ctx, floor)))
    if out["preemptions"] > 0 and not math.isnan(out["high"]):
        out["context"] = weighted / out["preemptions"]
    return out


def _d4_assumptions(caching: bool | None, hit_rate: float, fallbacks: int,
                    with_point: bool = True) -> list[str]:
    if not caching:
        point = "prefix caching is off, so nothing of a victim survives: point = high"
    elif math.isnan(hit_rate):
        point = "prefix caching is on but no hit rate is known: point = high"
    else:
        point = ("prefix caching is on: that share of the victim's context is served from the "
                 f"cache at resume which the window's first admissions got ({hit_rate:.3f})")
    out = [
        "each preemption re-prefills the average running request's context, "
        "Ctx = usage*(N-1)*B/running - B/2, from the gauges of the scrape before the interval "
        "in which the preemption counter rose",
        "high: no prefix hit at resume (every computed token of the victim is redone)",
        "low: every full block of the victim survives in the prefix cache; only the partly "
        "filled last block, (B-1)/2 tokens on average, is redone",
        *(["point: " + point] if with_point else []),
        "shared prefix blocks count once in usage, so Ctx is too small when prompts share them",
    ]
    if fallbacks:
        out.append(f"{fallbacks} interval(s) had no usable usage/running gauge before them: the "
                   "window means were used")
    return out


def check_scheduler_args(policy: str | None, scheduler_reserve_full_isl: bool | None) -> None:
    """InputError naming the parameter when the policy or the admission rule is not one vLLM
    knows (None = unknown is fine)."""
    if policy is not None and policy not in POLICIES:
        raise InputError(f"policy: expected one of {', '.join(POLICIES)} (vLLM's "
                         f"--scheduling-policy) or unknown, got {policy!r}")
    if scheduler_reserve_full_isl is not None and not isinstance(scheduler_reserve_full_isl,
                                                                 bool | np.bool_):
        raise InputError("scheduler_reserve_full_isl: expected true, false or unknown, got "
                         f"{scheduler_reserve_full_isl!r}")


def recompute_range(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    engine: EngineFacts | None = None,
    origin: str = "first",
    z: float = 2.0,
) -> dict[str, Any]:
    """Estimated recomputed tokens over ``(t0, t1]``: a range, a point and its assumptions.

    N, B and prefix caching come from ``vllm:cache_config_info`` unless ``engine`` gives them;
    its ``scheduling_policy`` ("fcfs", "priority") and ``scheduler_reserve_full_isl`` are not
    exported, None = unknown.
    ``origin="zero"``: the counters were 0 when the log began (a window from its start counts
    what happened before the first scrape).

    Returns ``low``, ``point``, ``high`` (recomputed tokens; NaN when nothing sizes a victim),
    ``preemptions`` (NaN when the counter is missing: never read as zero), ``ratio_low``,
    ``ratio_point``, ``ratio_high``, ``processed_tokens`` (prompt computed + generated, without
    the recompute), ``victim_context_tokens``, ``method``, ``params``, ``assumptions`` and
    ``d4`` (the wide range of docs/scheduler.md#rec-estimate, for comparison).
    """
    facts = engine if engine is not None else EngineFacts()
    num_gpu_blocks, block_size = facts.num_gpu_blocks, facts.block_size
    enable_prefix_caching, scheduling_policy = facts.enable_prefix_caching, facts.scheduling_policy
    scheduler_reserve_full_isl = facts.scheduler_reserve_full_isl
    check_scheduler_args(scheduling_policy, scheduler_reserve_full_isl)
    nan = math.nan
    result: dict[str, Any] = {
        "low": nan, "point": nan, "high": nan, "preemptions": nan,
        "ratio_low": nan, "ratio_point": nan, "ratio_high": nan, "processed_tokens": nan,
        "victim_context_tokens": nan, "method": "", "params": {}, "assumptions": [],
        "d4": dict.fromkeys(("low", "point", "high", "ratio_low", "ratio_point", "ratio_high"),
                            nan),
    }
    assumptions: list[str] = result["assumptions"]
    geometry = cache_config(series, run)
    n_blocks = num_gpu_blocks if num_gpu_blocks is not None else geometry.get("num_gpu_blocks")
    b_size = block_size if block_size is not None else geometry.get("block_size")
    kw: dict[str, Any] = {"run": run, "origin": origin}
    queries = window_increase(series, PREFIX_QUERIES, t0, t1, **kw)
    hits = window_increase(series, PREFIX_HITS, t0, t1, **kw)
    caching = (enable_prefix_caching if enable_prefix_caching is not None
               else geometry.get("enable_prefix_caching"))
    caching_from = "given" if enable_prefix_caching is not None else CACHE_CONFIG_INFO
    if caching is None and not math.isnan(queries):
        # With prefix caching off vLLM makes no lookup, so the query counter stays at 0
        # (docs/scheduler.md#kv-stats).
        caching = queries > 0
        caching_from = f"prefix_cache_queries {'moved' if caching else 'stayed 0'}"
    hit_rate = hits / queries if not math.isnan(queries) and queries > 0 else nan
    params: dict[str, Any] = {
        "num_gpu_blocks": n_blocks,
        "num_gpu_blocks_from": (("given" if num_gpu_blocks is not None else CACHE_CONFIG_INFO)
                                if n_blocks is not None else None),
        "block_size": b_size,
        "block_size_from": (("given" if block_size is not None else CACHE_CONFIG_INFO)
                            if b_size is not None else None),
        "prefix_caching": caching,
        "prefix_caching_from": caching_from if caching is not None else None,
        "prefix_hit_rate": hit_rate,
        "policy": scheduling_policy,
        "scheduler_reserve_full_isl": scheduler_reserve_full_isl,
        "origin": origin,
        "z": z,
    }
    result["params"] = params

    if not select(series, PREEMPTIONS, None, run):
        assumptions.append(f"{PREEMPTIONS} is missing: no estimate")
        return result
    d4 = _d4(series, t0, t1, run, origin, n_blocks, b_size, caching, hit_rate)
    p = d4["preemptions"]
    result["preemptions"] = p
    prompt_mean, prompt_sd = _prompt_stats(series, t0, t1, run, origin)
    params.update(prompt_mean=prompt_mean, prompt_sd=prompt_sd,
                  mean_victim_context_tokens=d4["context"])
    base, base_how = _base_tokens(series, t0, t1, run, origin)
    result["processed_tokens"] = base
    params["processed_tokens_from"] = base_how

    def ratio(r: float) -> float:
        denom = base + r
        return r / denom if not math.isnan(r) and denom > 0 else nan

    result["d4"] = {name: d4[name] for name in ("low", "point", "high")}
    result["d4"].update({f"ratio_{name}": ratio(d4[name]) for name in ("low", "point", "high")})
    if p == 0:
        result.update(low=0.0, point=0.0, high=0.0, ratio_low=ratio(0.0),
                      ratio_point=ratio(0.0), ratio_high=ratio(0.0),
                      method="no preemption in the window")
        assumptions.append("no preemption in the window: no recompute")
        return result

    d4_ok = not math.isnan(d4["high"])
    assumptions.append(
        "a preemption is counted when its victim next emits output, right after the re-prefill "
        "that recomputes it, so counts and recompute fall in the same window; preemptions near "
        "a window edge can land in the next one")
    fcfs = scheduling_policy in ("fcfs", None) and prompt_mean is not None
    if fcfs and scheduler_reserve_full_isl is False and d4_ok:
        fcfs = False
        assumptions.append("admission by first chunk (scheduler_reserve_full_isl off): victims "
                           "may be cut mid-prompt, so the FCFS prompt rule does not apply")
    if fcfs and prompt_mean is not None:
        b_eff = b_size if b_size is not None else DEFAULT_BLOCK_SIZE
        if b_size is None:
            assumptions.append(f"block_size unknown ({CACHE_CONFIG_INFO} missing or without it): "
                               f"{DEFAULT_BLOCK_SIZE} assumed for the victim's partial block")
        victim = prompt_mean + b_eff / 2
        spread = z * (prompt_sd or 0.0) * math.sqrt(p)
        low, point, high = max(p * victim - spread, p * b_eff / 2), p * victim, p * victim + spread
        method = "FCFS victim = most recently admitted request: prompt computed + a partial block"
        assumptions.append(
            f"victim context ~ mean prompt of newly started requests ({prompt_mean:.0f} tokens) "
            f"+ B/2; range +-{z:g} sd of prompt lengths over sqrt(P) victims")
        ctx = d4["context"]
        if ctx is not None and ctx > victim:
            # A resumed request goes back to the tail of the running list and is the next
            # victim, now with output tokens too: a share of the victims may hold the mean
            # resident context, never above the held-context high end.
            high = max(high, min(p * ctx, high + RESUMED_VICTIM_SHARE * p * (ctx - victim)))
            assumptions.append(
                f"high: {RESUMED_VICTIM_SHARE:.0%} of the victims may be resumed requests "
                f"preempted again, holding the mean resident context ({ctx:.0f} tokens)")
        if (scheduling_policy is None or scheduler_reserve_full_isl is None) and d4_ok:
            low, high = min(low, d4["low"]), max(high, d4["high"])
            unknown = " and ".join(name for name, v in (("policy", scheduling_policy), (
                "scheduler_reserve_full_isl", scheduler_reserve_full_isl)) if v is None)
            assumptions.append(f"{unknown} unknown: the FCFS point with full-sequence admission "
                               "(vLLM's defaults), the range spanning the held-context range too (give "
                               "the engine arguments to narrow it)")
            assumptions.extend(_d4_assumptions(caching, hit_rate, d4["fallbacks"],
                                               with_point=False))
        if caching:
            point *= 1.0 - (0.0 if math.isnan(hit_rate) else hit_rate)
            low = min(low, p * (b_eff - 1) / 2)
            assumptions.append(
                "prefix caching on: hits at resume are not exported; low end = only the partial "
                "tail block recomputed per preemption, point reduced by the window's prefix hit "
                "rate")
    elif d4_ok:
        low, point, high, victim = d4["low"], d4["point"], d4["high"], d4["context"]
        method = "mean context held per running request (docs/scheduler.md, REC-ESTIMATE)"
        assumptions.extend(_d4_assumptions(caching, hit_rate, d4["fallbacks"]))
    else:
        missing = [name for name, v in (("num_gpu_blocks", n_blocks), ("block_size", b_size))
                   if v is None]
        result["method"] = "no estimate: neither prompt counters nor pool shape size a victim"
        assumptions.append(
            (f"{' and '.join(missing)} unknown ({CACHE_CONFIG_INFO} missing or without them; pass "
             "num_gpu_blocks= / block_size=)" if missing else
             f"no usable {KV_USAGE}/{RUNNING} gauges") + " and no prompt counters: no estimate")
        return result
    if caching is None:
        assumptions.append("prefix caching state unknown: treated as off")
    point = min(max(point, low), high)
    result.update(low=low, point=point, high=high, victim_context_tokens=victim, method=method,
                  ratio_low=ratio(low), ratio_point=ratio(point), ratio_high=ratio(high))
    if not math.isnan(base):
        assumptions.append(f"ratio = recomputed / ({base_how} + recomputed), the tokens the "
                           "engine processed (within one token per request)")
    return result
