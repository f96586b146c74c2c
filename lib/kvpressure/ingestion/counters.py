"""Reading counters, gauges and histograms out of the ``series`` table over a time window.

Counter increase follows Prometheus' ``increase()`` on the raw samples, with two deliberate
differences, both so that consecutive windows add up to the whole:

* the baseline is the last sample at or before ``t0`` (not the first sample inside the window);
* no extrapolation to the window edges: the result is a sum of observed differences.

A drop in a counter is a reset (the server restarted and counted from zero): the value after
the drop is all increase, as in Prometheus.

A gauge over a window ``[t0, t1]`` is the step function its samples draw: each sample holds until
the next one. The samples that describe the window are the last one at or before ``t0`` (the
value the window starts with) and every one in ``(t0, t1]``; the mean is time-weighted, each
sample by how long it holds inside the window (the last one until ``t1``), so missing scrapes
hold the previous value instead of biasing the mean. Every consumer (``runs``, the record, the
symptom checklist, waiting reasons) reads gauges through ``gauge_window``. NaN samples are left
out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.labels import parse_labels

LabelMatch = Mapping[str, str] | str | None

# Gauges whose label sets are averaged rather than added (a fraction per engine).
_MEAN_GAUGES = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"})


def _match(labels: LabelMatch) -> dict[str, str]:
    if labels is None:
        return {}
    if isinstance(labels, str):
        return parse_labels(labels)
    return {str(k): str(v) for k, v in labels.items()}


def select(
    series: pd.DataFrame, metric: str, labels: LabelMatch = None, run: str | None = None
) -> dict[str, pd.Series]:
    """Rows of ``metric`` as one time-sorted Series per label set (key: the labels string).

    ``labels`` keeps the label sets that contain every given ``k=v``.
    """
    for col in ("t", "metric", "value"):
        if col not in series.columns:
            raise InputError(f"series: missing column '{col}'")
    rows = series[series["metric"] == metric]
    if run is not None and "run" in rows.columns:
        rows = rows[rows["run"] == run]
    elif "run" in rows.columns and len(rows) and rows["run"].nunique() > 1:
        raise InputError(
            f"series holds several runs for {metric} ({', '.join(map(str, rows['run'].unique()[:5]))}); "
            "pass run="
        )
    if rows.empty:
        return {}
    want = _match(labels)
    # a series.csv read back by pandas has NaN where the labels string was empty
    label_col = rows["labels"].astype("string").fillna("").astype(str) if "labels" in rows.columns else pd.Series("", index=rows.index)
    out: dict[str, pd.Series] = {}
    for key, group in rows.groupby(label_col, sort=True, observed=True):
        key = str(key)
        if want:
            have = parse_labels(key)
            if any(have.get(k) != v for k, v in want.items()):
                continue
        s = pd.Series(group["value"].to_numpy(dtype=float), index=group["t"].to_numpy(dtype=float))
        out[key] = s.sort_index(kind="stable")
    return out


def increase(
    t: np.ndarray, v: np.ndarray, t0: float | None, t1: float | None, origin: str = "first"
) -> float:
    """Reset-aware increase of one counter series over ``(t0, t1]`` (arrays sorted by ``t``).

    ``origin="zero"``: when the window starts at or before the first sample, the counter is
    taken to have been 0 then (the log starts with the process), so the first value counts.
    """
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(v) == 0:
        return math.nan
    hi = len(v) if t1 is None else int(np.searchsorted(t, t1, side="right"))
    if t0 is None:
        lo, from_zero = 0, origin == "zero"
    else:
        lo = int(np.searchsorted(t, t0, side="right")) - 1
        from_zero = origin == "zero" and lo < 0
        lo = max(lo, 0)
    seg = v[lo:hi]
    if len(seg) == 0:
        return 0.0
    if from_zero:
        seg = np.concatenate(([0.0], seg))
    return float(_reset_aware_diff(seg).sum())


def _reset_aware_diff(v: np.ndarray) -> np.ndarray:
    d = np.diff(v)
    return np.where(d >= 0, d, v[1:])


def interval_increases(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Reset-aware increase over each scrape interval ``(t[i], t[i + 1]]`` (length
    ``len(v) - 1``)."""
    return _reset_aware_diff(v)


def window_increase(
    series: pd.DataFrame,
    metric: str,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
    origin: str = "first",
) -> float:
    """Increase of a counter over ``(t0, t1]``, summed over its matching label sets.

    NaN when the metric is absent (missing is not zero).
    """
    parts = select(series, metric, labels, run)
    if not parts:
        return math.nan
    vals = [increase(s.index.to_numpy(), s.to_numpy(), t0, t1, origin) for s in parts.values()]
    vals = [x for x in vals if not math.isnan(x)]
    return float(sum(vals)) if vals else math.nan


def held_range(
    t: np.ndarray, t0: float | None = None, t1: float | None = None
) -> tuple[int, int, np.ndarray]:
    """The samples at sorted times ``t`` that describe ``[t0, t1]`` (the module's rule), as the
    index range ``[lo, hi)``, and how long each holds inside the window. Open ends: the first
    or last sample."""
    lo = 0 if t0 is None else max(int(np.searchsorted(t, t0, side="right")) - 1, 0)
    hi = len(t) if t1 is None else int(np.searchsorted(t, t1, side="right"))
    if hi <= lo:
        return lo, lo, np.array([])
    held = t[lo:hi].astype(float)
    start = held[0] if t0 is None else max(float(t0), held[0])
    end = held[-1] if t1 is None else max(float(t1), start)
    until = np.clip(np.append(held[1:], end), start, end)
    return lo, hi, until - np.clip(held, start, end)


def gauge_window(
    s: pd.Series, t0: float | None = None, t1: float | None = None
) -> tuple[pd.Series, np.ndarray]:
    """One gauge's samples (index ``t``, sorted; NaN left out) that describe ``[t0, t1]`` and
    their hold times (``held_range``)."""
    s = s[~np.isnan(s.to_numpy(dtype=float))]
    lo, hi, w = held_range(s.index.to_numpy(dtype=float), t0, t1)
    return s.iloc[lo:hi], w


def held_mean(values: pd.Series | np.ndarray, weights: np.ndarray) -> float:
    """Mean of ``gauge_window``'s samples by their hold times; a window of one instant (all
    weights zero) gives the plain mean of its samples, an empty one NaN."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan
    total = float(weights.sum())
    return float(np.dot(weights, v) / total) if total > 0 else float(v.mean())


def gauge_mean(
    series: pd.DataFrame,
    metric: str,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
    agg: str | None = None,
    how: str = "time",
) -> float:
    """Mean of a gauge over ``[t0, t1]``: time-weighted (``how="time"``) or per sample, over
    the samples ``gauge_window`` picks.

    Several label sets (engines) are added (``agg="sum"``: requests running on all engines)
    or averaged (``agg="mean"``, the default for KV usage).
    """
    parts = select(series, metric, labels, run)
    if not parts:
        return math.nan
    agg = agg or ("mean" if metric in _MEAN_GAUGES else "sum")
    means = []
    for s in parts.values():
        held, w = gauge_window(s, t0, t1)
        means.append(held_mean(held, w if how == "time" else np.ones(len(held))))
    means = [m for m in means if not math.isnan(m)]
    if not means:
        return math.nan
    return float(sum(means) if agg == "sum" else np.mean(means))


def gauge_max(
    series: pd.DataFrame,
    metric: str,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
) -> float:
    """Largest sampled value (label sets added per timestamp)."""
    parts = select(series, metric, labels, run)
    if not parts:
        return math.nan
    total = pd.concat([gauge_window(s, t0, t1)[0] for s in parts.values()]).groupby(level=0).sum(
        min_count=1
    )
    return float(total.max()) if len(total) else math.nan


def histogram_buckets(
    series: pd.DataFrame,
    metric_base: str,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
    origin: str = "first",
) -> pd.Series:
    """Cumulative bucket counts gained over the window, indexed by upper bound (``le``)."""
    parts = select(series, f"{metric_base}_bucket", labels, run)
    per_le: dict[float, float] = {}
    for key, s in parts.items():
        le = parse_labels(key).get("le")
        if le is None:
            continue
        inc = increase(s.index.to_numpy(), s.to_numpy(), t0, t1, origin)
        if not math.isnan(inc):
            bound = float(le)
            per_le[bound] = per_le.get(bound, 0.0) + inc
    if not per_le:
        return pd.Series(dtype=float)
    out = pd.Series(per_le).sort_index()
    # Buckets read at slightly different moments can be non-monotonic; Prometheus does the same.
    return pd.Series(np.maximum.accumulate(out.to_numpy()), index=out.index)


def bucket_quantile(q: float, buckets: pd.Series) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative buckets (index: upper bounds)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if buckets.empty or not math.isinf(buckets.index[-1]):
        return math.nan
    bounds = buckets.index.to_numpy(dtype=float)
    counts = buckets.to_numpy(dtype=float)
    total = counts[-1]
    if total <= 0 or len(bounds) < 2:
        return math.nan
    rank = q * total
    b = int(np.searchsorted(counts, rank, side="left"))
    b = min(b, len(counts) - 1)
    if b == len(bounds) - 1:  # the +Inf bucket: the highest finite bound
        return float(bounds[-2])
    if b == 0 and bounds[0] <= 0:
        return float(bounds[0])
    start = 0.0 if b == 0 else float(bounds[b - 1])
    end = float(bounds[b])
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return end
    return start + (end - start) * (rank - below) / in_bucket


def histogram_quantile(
    series: pd.DataFrame,
    metric_base: str,
    q: float,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
    origin: str = "first",
) -> float:
    """Quantile ``q`` of the observations made in the window, interpolated within buckets
    as Prometheus does (label sets other than ``le`` added, as ``sum by (le)``)."""
    buckets = histogram_buckets(series, metric_base, t0, t1, labels, run=run, origin=origin)
    return bucket_quantile(q, buckets)


def histogram_mean(
    series: pd.DataFrame,
    metric_base: str,
    t0: float | None = None,
    t1: float | None = None,
    labels: LabelMatch = None,
    *,
    run: str | None = None,
    origin: str = "first",
) -> float:
    """Mean observation in the window: increase of ``_sum`` / increase of ``_count``."""
    total = window_increase(series, f"{metric_base}_sum", t0, t1, labels, run=run, origin=origin)
    count = window_increase(
        series, f"{metric_base}_count", t0, t1, labels, run=run, origin=origin
    )
    if math.isnan(total) or math.isnan(count) or count <= 0:
        return math.nan
    return total / count
