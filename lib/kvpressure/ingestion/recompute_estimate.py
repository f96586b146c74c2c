"""Recomputed tokens estimated from what a real vLLM exports (no counter sees recompute).

vLLM 0.33.0 counts a request's prompt once, at its first output; a preempted request's
re-prefill moves no token counter (spec D1, D3). What is exported is the number of preemptions,
the KV usage and the number of running requests, and the pool geometry in
``vllm:cache_config_info``. From those (spec D4), for every scrape interval in which the
preemption counter rose by ``dP``, with the gauges of the scrape just before it:

    Ctx  = usage * (N - 1) * B / running - B / 2     tokens held by an average running request
    high = sum dP * Ctx                              nothing of a victim survives (no prefix hit)
    low  = sum dP * (B - 1) / 2                      all its full blocks survive; only the
                                                     partly filled last block is redone
    point: prefix caching off -> high (nothing can survive);
           on -> sum dP * max((1 - hit_rate) * Ctx, (B - 1) / 2), ``hit_rate`` the share of
           looked-up tokens the prefix cache served in the window.

The ratio puts the estimate over all processed tokens: prompt tokens computed locally
(``prompt_tokens_by_source{source=local_compute}``, else ``prompt_tokens`` minus
``prompt_tokens_cached``, else ``prompt_tokens``) + generated tokens + the recompute itself
(vLLM's ``scheduled = prompt + output - 1 - hits + recomputed`` per request, to within a token
per request). Where this goes wrong is spec D5; the assumptions travel with the numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.ingestion.counters import (
    LabelMatch,
    gauge_mean,
    interval_increases,
    select,
    window_increase,
)
from kvpressure.ingestion.labels import parse_labels

PREEMPTIONS = "vllm:num_preemptions_total"
USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
CACHE_INFO = "vllm:cache_config_info"


def cache_geometry(series: pd.DataFrame, run: str | None = None) -> dict[str, Any]:
    """``num_gpu_blocks``, ``block_size`` and ``enable_prefix_caching`` from the labels of
    ``vllm:cache_config_info`` (None where absent or ``None``)."""
    parts = select(series, CACHE_INFO, None, run)
    out: dict[str, Any] = {"num_gpu_blocks": None, "block_size": None, "prefix_caching": None}
    for key in parts:
        labels = parse_labels(key)
        for field, name, conv in (
            ("num_gpu_blocks", "num_gpu_blocks", int),
            ("block_size", "block_size", int),
            ("prefix_caching", "enable_prefix_caching", lambda x: x.lower() == "true"),
        ):
            raw = labels.get(name)
            if out[field] is None and raw not in (None, "", "None"):
                try:
                    out[field] = conv(raw)
                except ValueError:
                    pass
    return out


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
    kw = {"run": run, "origin": origin}
    gen = window_increase(series, "vllm:generation_tokens_total", t0, t1, **kw)
    local = window_increase(
        series, "vllm:prompt_tokens_by_source_total", t0, t1, {"source": "local_compute"}, **kw
    )
    if not math.isnan(local):
        prompt, how = local, "prompt_tokens_by_source{source=local_compute}"
    else:
        prompt = window_increase(series, "vllm:prompt_tokens_total", t0, t1, **kw)
        cached = window_increase(series, "vllm:prompt_tokens_cached_total", t0, t1, **kw)
        how = "prompt_tokens"
        if not math.isnan(prompt) and not math.isnan(cached):
            prompt, how = prompt - cached, "prompt_tokens - prompt_tokens_cached"
    if math.isnan(gen) or math.isnan(prompt):
        return math.nan, how + " + generation_tokens (missing)"
    return prompt + gen, how + " + generation_tokens"


def _point_rule(caching: bool | None, hit_rate: float) -> str:
    if not caching:
        return "prefix caching is off, so nothing of a victim survives: point = high"
    if math.isnan(hit_rate):
        return "prefix caching is on but no hit rate is known: point = high"
    return (
        "prefix caching is on: that share of the victim's context is served from the cache "
        f"at resume which the window's first admissions got ({hit_rate:.3f})"
    )


def recompute_range(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    labels: LabelMatch = None,
    num_gpu_blocks: int | None = None,
    block_size: int | None = None,
    prefix_caching: bool | None = None,
    origin: str = "first",
) -> dict[str, Any]:
    """The recomputed-token range over ``(t0, t1]`` (spec D4).

    Returns ``low``, ``high``, ``point``, ``preemptions``, ``ratio_low``, ``ratio_high``,
    ``ratio_point``, ``processed_tokens`` (without recompute), ``params`` and ``assumptions``.
    N, B and prefix caching come from ``vllm:cache_config_info`` unless given.
    """
    nan = math.nan
    result: dict[str, Any] = {
        "low": nan,
        "high": nan,
        "point": nan,
        "preemptions": nan,
        "ratio_low": nan,
        "ratio_high": nan,
        "ratio_point": nan,
        "processed_tokens": nan,
        "params": {},
        "assumptions": [],
    }
    assumptions: list[str] = result["assumptions"]
    geometry = cache_geometry(series, run)
    n_blocks = num_gpu_blocks if num_gpu_blocks is not None else geometry["num_gpu_blocks"]
    b_size = block_size if block_size is not None else geometry["block_size"]
    source_n = "given" if num_gpu_blocks is not None else CACHE_INFO
    source_b = "given" if block_size is not None else CACHE_INFO

    queries = window_increase(series, "vllm:prefix_cache_queries_total", t0, t1, run=run, origin=origin)
    hits = window_increase(series, "vllm:prefix_cache_hits_total", t0, t1, run=run, origin=origin)
    caching = prefix_caching if prefix_caching is not None else geometry["prefix_caching"]
    caching_source = "given" if prefix_caching is not None else CACHE_INFO
    if caching is None and not math.isnan(queries):
        # With prefix caching off vLLM makes no lookup, so the query counter stays at 0 (R5.6).
        caching, caching_source = queries > 0, "prefix_cache_queries moved" if queries > 0 else (
            "prefix_cache_queries stayed 0"
        )
    hit_rate = hits / queries if not math.isnan(queries) and queries > 0 else nan

    result["params"] = {
        "num_gpu_blocks": n_blocks,
        "num_gpu_blocks_from": source_n if n_blocks is not None else None,
        "block_size": b_size,
        "block_size_from": source_b if b_size is not None else None,
        "prefix_caching": caching,
        "prefix_caching_from": caching_source if caching is not None else None,
        "prefix_hit_rate": hit_rate,
        "origin": origin,
    }

    parts = select(series, PREEMPTIONS, labels, run)
    if not parts:
        assumptions.append(f"{PREEMPTIONS} is missing: no estimate")
        return result

    total_p = 0.0
    high = low = point = 0.0
    ctx_weighted = 0.0
    fallbacks = 0
    for key, s in parts.items():
        starts, incs = _window_points(s.index.to_numpy(), s.to_numpy(), t0, t1, origin)
        if len(incs) == 0:
            continue
        total_p += float(incs.sum())
        moved = incs > 0
        if not moved.any():
            continue
        if n_blocks is None or b_size is None:
            continue
        gauge_labels = parse_labels(key)
        usage = select(series, USAGE, gauge_labels, run)
        running = select(series, RUNNING, gauge_labels, run)
        u_s = next(iter(usage.values()), pd.Series(dtype=float))
        r_s = next(iter(running.values()), pd.Series(dtype=float))
        mean_u = gauge_mean(series, USAGE, t0, t1, gauge_labels, run=run)
        mean_r = gauge_mean(series, RUNNING, t0, t1, gauge_labels, run=run)
        t_before, d_p = starts[moved], incs[moved]
        u = _values_at(u_s, t_before)
        r = _values_at(r_s, t_before)
        bad = ~((u > 0) & (r > 0))
        fallbacks += int(bad.sum())
        u[bad], r[bad] = mean_u, mean_r
        with np.errstate(divide="ignore", invalid="ignore"):
            ctx = u * (n_blocks - 1) * b_size / r - b_size / 2
        ctx[~((u > 0) & (r > 0))] = nan
        floor = (b_size - 1) / 2
        low += float(d_p.sum()) * floor
        if np.isnan(ctx).any():
            high = point = nan
            continue
        ctx = np.maximum(ctx, floor)
        ctx_weighted += float(np.dot(d_p, ctx))
        high += float(np.dot(d_p, ctx))
        if caching:
            rate = 0.0 if math.isnan(hit_rate) else hit_rate
            point += float(np.dot(d_p, np.maximum((1.0 - rate) * ctx, floor)))
        else:
            point += float(np.dot(d_p, ctx))

    result["preemptions"] = total_p
    if total_p == 0:
        result.update(low=0.0, high=0.0, point=0.0)
        assumptions.append("no preemption in the window: no recompute")
    elif n_blocks is None or b_size is None:
        missing = [n for n, v in (("num_gpu_blocks", n_blocks), ("block_size", b_size)) if v is None]
        assumptions.append(
            f"{' and '.join(missing)} unknown ({CACHE_INFO} missing or without them; pass "
            "num_gpu_blocks= / block_size=): no estimate"
        )
    else:
        result.update(low=low, high=high, point=point)
        if not math.isnan(high):
            result["params"]["mean_victim_context_tokens"] = ctx_weighted / total_p
        assumptions += [
            "each preemption re-prefills the average running request's context, "
            "Ctx = usage*(N-1)*B/running - B/2, from the gauges of the scrape before the "
            "interval in which the preemption counter rose",
            "high: no prefix hit at resume (every computed token of the victim is redone)",
            "low: every full block of the victim survives in the prefix cache; only the partly "
            "filled last block, (B-1)/2 tokens on average, is redone",
            "point: " + _point_rule(caching, hit_rate),
            "the preemption counter moves when the victim next emits output (up to a queue "
            "wait later), so preemptions near a window edge land in the next window",
            "FCFS victims are the most recently admitted requests, whose context can differ "
            "from the average; shared prefix blocks count once in usage (Ctx too small)",
        ]
        if fallbacks:
            assumptions.append(
                f"{fallbacks} interval(s) had no usable usage/running gauge before them: the "
                "window means were used"
            )

    base, base_how = _base_tokens(series, t0, t1, run, origin)
    result["processed_tokens"] = base
    result["params"]["processed_tokens_from"] = base_how
    if not math.isnan(base):
        for name in ("low", "high", "point"):
            r = result[name]
            denom = base + r
            result[f"ratio_{name}"] = r / denom if denom > 0 and not math.isnan(r) else nan
        assumptions.append(
            "ratio = recomputed / (" + base_how + " + recomputed), the tokens the engine "
            "processed (within one token per request)"
        )
    return result
