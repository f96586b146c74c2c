"""Comparisons a validation against a real server needs beyond the per-level errors.

On a small server the throughput of one level moves by several percent from run to run, so a
remedy's change read at one level (the focus) can be smaller than that noise and say nothing.
Averaged over every level at and past the measured knee, where the remedy is meant to act,
the noise of the levels partly cancels; the spread of the per-level changes is reported with
the mean so a reader sees how much cancelled. The same setup measured twice gives the noise
itself (``run_to_run``), the yardstick the twin's errors are read against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def past_knee(levels: Sequence[int], knee: int | None) -> list[int]:
    """The levels at and past ``knee`` (every level when the knee is unknown)."""
    chosen = sorted(int(c) for c in levels)
    return chosen if knee is None else [c for c in chosen if c >= knee]


def past_knee_change(baseline: Mapping[int, float], remedy: Mapping[int, float],
                     knee: int | None) -> dict[str, Any]:
    """A remedy's change in throughput over the levels at and past ``knee``.

    ``change_of_mean_pct`` compares the mean throughput of those levels (remedy against
    baseline, the levels both have); ``per_level_pct`` is each level's own change and
    ``spread_pct`` their min, max and standard deviation (``ddof=1``; NaN for one level).
    """
    levels = [c for c in past_knee(list(baseline), knee)
              if c in remedy and _finite(baseline[c]) and _finite(remedy[c]) and baseline[c]]
    if not levels:
        return {"levels": [], "change_of_mean_pct": math.nan, "per_level_pct": {},
                "spread_pct": {"min": math.nan, "max": math.nan, "std": math.nan}}
    base = np.array([float(baseline[c]) for c in levels])
    new = np.array([float(remedy[c]) for c in levels])
    per = 100.0 * (new / base - 1.0)
    return {
        "levels": levels,
        "change_of_mean_pct": float(100.0 * (new.mean() / base.mean() - 1.0)),
        "per_level_pct": dict(zip(levels, per.tolist(), strict=True)),
        "spread_pct": {"min": float(per.min()), "max": float(per.max()),
                       "std": float(per.std(ddof=1)) if len(per) > 1 else math.nan},
    }


def run_to_run(first: Mapping[int, Mapping[str, float]],
               second: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    """The same setup measured twice: per level, the second run's throughput against the
    first's (%) and the difference in preemptions; summarised as the mean and largest
    absolute throughput difference and the largest preemption difference."""
    rows = []
    for c in sorted(set(first) & set(second)):
        a, b = first[c], second[c]
        thr = (100.0 * (b["output_throughput"] / a["output_throughput"] - 1.0)
               if _finite(a.get("output_throughput")) and a["output_throughput"] else math.nan)
        pre = (float(b["preemptions"]) - float(a["preemptions"])
               if _finite(a.get("preemptions")) and _finite(b.get("preemptions")) else math.nan)
        rows.append({"concurrency": int(c), "throughput_diff_pct": thr,
                     "preemptions_first": a.get("preemptions"),
                     "preemptions_second": b.get("preemptions"), "preemptions_diff": pre})
    thr_all = np.array([r["throughput_diff_pct"] for r in rows], float)
    pre_all = np.array([r["preemptions_diff"] for r in rows], float)
    thr, pre = thr_all[np.isfinite(thr_all)], pre_all[np.isfinite(pre_all)]
    return {
        "per_level": rows,
        "throughput_mean_abs_diff_pct": float(np.abs(thr).mean()) if len(thr) else math.nan,
        "throughput_max_abs_diff_pct": float(np.abs(thr).max()) if len(thr) else math.nan,
        "preemptions_max_abs_diff": float(np.abs(pre).max()) if len(pre) else math.nan,
    }


def preemption_errors(measured: Mapping[int, float], twin: Mapping[int, float],
                      knee: int | None) -> dict[str, Any]:
    """The twin's preemptions against the measured ones per level (difference and %), and
    summed over the levels at and past ``knee``, where one level's few preemptions more or
    less are noise and the sum is what a remedy acts on."""
    per = {}
    for c in sorted(set(measured) & set(twin)):
        m, t = measured[c], twin[c]
        if not (_finite(m) and _finite(t)):
            continue
        per[int(c)] = {"measured": float(m), "twin": float(t), "diff": float(t) - float(m),
                       "error_pct": 100.0 * (float(t) / float(m) - 1.0) if m else math.nan}
    tail = [c for c in past_knee(list(per), knee)]
    sm = sum(per[c]["measured"] for c in tail)
    st = sum(per[c]["twin"] for c in tail)
    return {"per_level": per, "past_knee_levels": tail, "past_knee_measured": sm,
            "past_knee_twin": st,
            "past_knee_error_pct": 100.0 * (st / sm - 1.0) if sm else math.nan}


def paired_change(baseline: Sequence[float], remedy: Sequence[float],
                  confidence: float = 0.95) -> dict[str, Any]:
    """A remedy's change read from paired runs: ``baseline[i]`` and ``remedy[i]`` measured
    back to back, so a drift of the machine slower than one pair cancels in each pair's own
    change. The mean of the per-pair changes (%) with its two-sided Student-t interval, and
    the sign when the interval excludes 0 (``None`` when it does not: the runs cannot tell
    the change from nothing)."""
    from scipy import stats

    if len(baseline) != len(remedy):
        raise ValueError("paired_change: baseline and remedy need the same number of runs")
    pairs = [(float(a), float(b)) for a, b in zip(baseline, remedy, strict=True)
             if _finite(a) and _finite(b) and float(a)]
    per = np.array([100.0 * (b / a - 1.0) for a, b in pairs])
    n = len(per)
    if n == 0:
        return {"pairs": 0, "per_pair_pct": [], "mean_pct": math.nan,
                "interval_pct": [math.nan, math.nan], "sign": None}
    mean = float(per.mean())
    if n == 1:
        lo = hi = math.nan
    else:
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * per.std(ddof=1) / math.sqrt(n))
        lo, hi = mean - half, mean + half
    sign = None if not (lo > 0 or hi < 0) else (1 if lo > 0 else -1)
    return {"pairs": n, "per_pair_pct": per.tolist(), "mean_pct": mean,
            "interval_pct": [lo, hi], "sign": sign}
