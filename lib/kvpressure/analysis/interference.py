"""Preemption vs prefill interference: two causes of a bad curve, recorded separately.

* Prefill interference: a long prompt chunk fills a step's token budget; every decode in that
  step waits for it, so ITL spikes line up with long-prompt arrivals while the KV pool is not
  full. Handled with chunked prefill / a smaller ``max_num_batched_tokens``.
* Preemption: the pool is full, a victim's blocks are freed and its tokens recomputed later
  (``vllm:num_preemptions_total`` rises with KV usage near 1). Handled by lowering concurrency
  or growing the pool.

Both can be present. From simulated steps (timed): a step is an ITL spike when it carries
decode tokens and lasts ``spike_factor`` times the median decode-only step or more; a spike is
prefill interference when the step packs a long prefill (``long_prefill_tokens``, default half
the largest step) with KV usage below ``kv_full``, and preemption-driven when KV is full and the
step recomputes or preempts. Each decode token sees its step's duration as its ITL. Reported:
the share of slow ITLs (spike steps) that are prefill interference, their share of all ITLs, and
the share of the ITL p95/p99 excess over a decode-only step they explain (the quantile again with
those steps at decode-only duration). Prefill interference is declared when it makes at least
``min_spike_share`` of the slow ITLs and ``min_itl_share`` of all ITLs (enough to move p99).

From series (real or simulated): each scrape interval is one window. An interval is a spike
when its ITL p99 (from the histogram increase) is ``spike_factor`` times the run's median
interval p99 or more; it is prefill interference when the prompt-token rate is high (``burst_factor`` x the
median rate) with KV usage below ``kv_full`` and no preemption, and preemption-driven when
preemptions rose or KV usage was at ``kv_full``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvpressure.analysis import _series as S
from kvpressure.analysis._steps import is_timed, require_columns, steps_in_window
from kvpressure.analysis.symptoms import KV_FULL_USAGE
from kvpressure.errors import InputError
from kvpressure.ingestion.counters import gauge_window
from kvpressure.ingestion.names import ITL, KV_USAGE, PREEMPTIONS, PROMPT_TOKENS
from kvpressure.stages.results import (
    Interference,
    NoEvidence,
    SeriesPreemptionEvidence,
    SeriesPrefillEvidence,
    SeriesThresholds,
    StepPreemptionEvidence,
    StepPrefillEvidence,
    StepThresholds,
)


def _nothing_yet(source: str, thresholds: StepThresholds | SeriesThresholds) -> Interference:
    """The judgement before any evidence: neither finding known, no evidence yet."""
    return Interference(source=source, prefill_interference=None, preemption=None,
                        prefill_evidence=NoEvidence(), preemption_evidence=NoEvidence(),
                        thresholds=thresholds, notes=[])


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cw = np.cumsum(w)
    if cw[-1] <= 0:
        return float("nan")
    return float(v[min(int(np.searchsorted(cw, q * cw[-1])), len(v) - 1)])


def interference_from_steps(
    steps: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    spike_factor: float = 1.5,
    long_prefill_tokens: int | None = None,
    kv_full: float = KV_FULL_USAGE,
    min_spike_share: float = 0.1,
    min_itl_share: float = 0.01,
    recompute_ratio: float = 0.05,
) -> Interference:
    """Prefill interference and preemption from timed simulation steps."""
    if not is_timed(steps):
        raise InputError("steps: interference needs time_s and step_duration_s (a timed run)")
    require_columns(steps, ("num_prefill_tokens", "num_decode_tokens", "kv_usage",
                            "preemptions", "recomputed_tokens", "num_scheduled_tokens"), "steps")
    st = steps_in_window(steps, (t0, t1))
    thr = StepThresholds(spike_factor=spike_factor, kv_full=kv_full,
                         min_spike_share=min_spike_share, min_itl_share=min_itl_share,
                         recompute_ratio=recompute_ratio)
    out = _nothing_yet("steps", thr)
    if st.empty:
        out.notes.append("no steps in the window")
        return out
    dur = st["step_duration_s"].to_numpy(float)
    pre = st["num_prefill_tokens"].to_numpy(float)
    dec = st["num_decode_tokens"].to_numpy(float)
    kv = st["kv_usage"].to_numpy(float)
    rec = st["recomputed_tokens"].to_numpy(float)
    pmt = st["preemptions"].to_numpy(float)
    sched = st["num_scheduled_tokens"].to_numpy(float)
    if long_prefill_tokens is None:
        long_prefill_tokens = max(1, int(0.5 * sched.max()))
    thr.long_prefill_tokens = long_prefill_tokens

    decode_only = (pre == 0) & (dec > 0)
    base = float(np.median(dur[decode_only])) if decode_only.any() else float(np.median(dur))
    spike = (dec > 0) & (dur >= spike_factor * base)
    new_prefill = np.maximum(pre - rec, 0.0)
    is_prefill = spike & (new_prefill >= long_prefill_tokens) & (kv < kv_full)
    is_preempt = spike & (kv >= kv_full) & ((rec > 0) | (pmt > 0))

    # Each decode token sees its step's duration as its ITL.
    has_dec = dec > 0
    dsum = dec.sum()
    slow_tokens = dec[spike].sum()
    share_prefill = float(dec[is_prefill].sum() / slow_tokens) if slow_tokens else 0.0
    share_preempt = float(dec[is_preempt].sum() / slow_tokens) if slow_tokens else 0.0
    token_share = float(dec[is_prefill].sum() / dsum) if dsum else 0.0
    mean_itl = float((dur * dec).sum() / dsum) if dsum else float("nan")

    def q(d: np.ndarray, p: float) -> float:
        return _weighted_quantile(d[has_dec], dec[has_dec], p) if has_dec.any() else float("nan")

    # How much of the tail the prefill spikes make: the quantile again with those steps at the
    # decode-only duration; the share of the excess over a decode step they account for.
    calm = np.where(is_prefill, base, dur)
    tail = {}
    for name, p in (("p95", 0.95), ("p99", 0.99)):
        with_, without = q(dur, p), q(calm, p)
        excess = with_ - base
        tail[name] = (with_, without, (with_ - without) / excess if excess > 0 else 0.0)

    out.prefill_evidence = StepPrefillEvidence.model_validate({
        "decode_step_s": base, "itl_mean_s": mean_itl,
        "itl_p95_s": tail["p95"][0], "itl_p99_s": tail["p99"][0],
        "itl_p99_without_prefill_spikes_s": tail["p99"][1],
        "share_of_itl_p95_excess": tail["p95"][2], "share_of_itl_p99_excess": tail["p99"][2],
        "spike_steps": int(spike.sum()), "prefill_spike_steps": int(is_prefill.sum()),
        "prefill_spike_magnitude": float(np.median(dur[is_prefill]) / base)
        if is_prefill.any() and base > 0 else None,
        "share_of_slow_itl": share_prefill, "share_of_all_itl": token_share,
        "kv_usage_in_prefill_spikes": float(kv[is_prefill].mean()) if is_prefill.any() else None,
        "arrivals_in_prefill_spikes": int(st["arrivals"].to_numpy()[is_prefill].sum())
        if "arrivals" in st else None,
    })
    total_sched = sched.sum()
    ratio = float(rec.sum() / total_sched) if total_sched else 0.0
    pre_steps = pmt > 0
    out.preemption_evidence = StepPreemptionEvidence(
        preemptions=int(pmt.sum()), recompute_ratio=ratio,
        kv_usage_at_preemption=float(kv[pre_steps].mean()) if pre_steps.any() else None,
        preempt_spike_steps=int(is_preempt.sum()), share_of_slow_itl=share_preempt,
    )
    out.prefill_interference = bool(
        is_prefill.any() and share_prefill >= min_spike_share and token_share >= min_itl_share
    )
    out.preemption = bool(pmt.sum() > 0 and ratio >= recompute_ratio)
    return out


def interference_from_series(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    spike_factor: float = 1.5,
    burst_factor: float = 2.0,
    kv_full: float = KV_FULL_USAGE,
    min_spike_share: float = 0.1,
) -> Interference:
    """The same judgement from scrape intervals of ``series``."""
    series = S.check_series(series)
    series = S.select_run(series, run)
    thr = SeriesThresholds(spike_factor=spike_factor, burst_factor=burst_factor,
                           kv_full=kv_full, min_spike_share=min_spike_share)
    out = _nothing_yet("series", thr)
    bucket_rows = series[series["metric"] == f"{ITL}_bucket"]
    if bucket_rows.empty:
        out.notes.append(f"no {ITL} histogram: ITL spikes cannot be seen")
    ts = np.sort(pd.to_numeric(series["t"]).unique())
    if t0 is not None:
        ts = ts[ts >= t0]
    if t1 is not None:
        ts = ts[ts <= t1]
    prompt = S.metric_values(series, PROMPT_TOKENS)
    preempt = S.metric_values(series, PREEMPTIONS)
    usage = S.metric_values(series, KV_USAGE, agg="mean")
    rows = []
    for a, b in zip(ts[:-1], ts[1:], strict=True):
        r: dict = {"t0": float(a), "t1": float(b)}
        if not bucket_rows.empty:
            h = S.histogram_window(series, ITL, (a, b))
            if h is not None and h[2] > 0:
                r["itl_mean_s"] = h[1] / h[2]
                r["itl_p99_s"] = S.histogram_quantile(0.99, h[0])
                r["itl_count"] = h[2]
        if not prompt.empty:
            r["prompt_rate"] = (S.counter_increase(prompt, (a, b)) or 0.0) / (b - a)
        if not preempt.empty:
            r["preemptions"] = S.counter_increase(preempt, (a, b))
        if not usage.empty:
            u = gauge_window(usage, a, b)[0]
            r["kv_usage"] = float(u.max()) if not u.empty else None
        rows.append(r)
    iv = pd.DataFrame(rows)
    if iv.empty:
        out.notes.append("fewer than two scrapes in the window")
        return out
    if "preemptions" in iv:
        total = float(iv["preemptions"].sum())
        kv_at = (iv.loc[iv["preemptions"] > 0, "kv_usage"].mean()
                 if "kv_usage" in iv and (iv["preemptions"] > 0).any() else None)
        out.preemption_evidence = SeriesPreemptionEvidence(
            preemptions=total, kv_usage_at_preemption=kv_at,
            intervals_with_preemptions=int((iv["preemptions"] > 0).sum()))
        out.preemption = total > 0
    else:
        out.notes.append(f"no {PREEMPTIONS}: preemption cannot be judged")
    if "itl_p99_s" not in iv or "prompt_rate" not in iv:
        return out
    # Against the run's typical interval p99 rather than the mean: both p99s carry the same
    # bucket interpolation, so a constant ITL never looks like a spike.
    ok = iv.dropna(subset=["itl_p99_s", "itl_mean_s"])
    base = float(np.median(ok["itl_p99_s"])) if not ok.empty else float("nan")
    spike = iv["itl_p99_s"] >= spike_factor * base
    rate_med = float(np.median(iv["prompt_rate"]))
    burst = iv["prompt_rate"] >= burst_factor * max(rate_med, 1e-9)
    kv_ok = iv["kv_usage"] < kv_full if "kv_usage" in iv else pd.Series(True, index=iv.index)
    no_pre = iv["preemptions"].fillna(0) == 0 if "preemptions" in iv else True
    prefill = spike & burst & kv_ok & no_pre
    n_spike = int(spike.sum())
    out.prefill_evidence = SeriesPrefillEvidence.model_validate({
        "intervals": len(iv), "itl_p99_median_s": base, "spike_intervals": n_spike,
        "prefill_spike_intervals": int(prefill.sum()),
        "share_of_spikes": float(prefill.sum() / n_spike) if n_spike else 0.0,
        "prompt_rate_median": rate_med,
        "itl_p99_in_prefill_spikes_s": float(iv.loc[prefill, "itl_p99_s"].median())
        if prefill.any() else None,
    })
    out.prefill_interference = bool(prefill.any() and prefill.sum() / n_spike >= min_spike_share)
    return out
