"""Reading the canonical ``series`` table: one metric, one window, counters and histograms.

Small private helpers shared by the analysis modules, on top of ``kvpressure.ingestion.counters``
(counter increase with resets, histogram buckets and quantiles). They never invent a value: a metric that
is absent gives ``None`` (or an empty Series), which the callers turn into "no data".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.counters import (
    bucket_quantile,
    histogram_buckets,
    increase,
    window_increase,
)
from kvpressure.ingestion.labels import parse_labels

SERIES_COLUMNS = ("run", "t", "metric", "labels", "value")

Window = tuple[float | None, float | None]


def check_series(series: pd.DataFrame, name: str = "series") -> pd.DataFrame:
    """The series table with its required columns, or InputError naming the missing one."""
    if not isinstance(series, pd.DataFrame):
        raise InputError(f"{name}: expected a DataFrame with columns {', '.join(SERIES_COLUMNS)}")
    for col in ("t", "metric", "value"):
        if col not in series.columns:
            raise InputError(f"{name}: missing column '{col}'")
    # A series.csv read back with pandas turns empty label strings into NaN; the canonical
    # form is "" (and a NaN key would drop the rows from label-grouped lookups).
    # Ingestion stores run/metric/labels as categoricals; plain strings keep label parsing and
    # comparisons simple.
    if "labels" not in series.columns:
        series = series.assign(labels="")
    fix = {c: series[c].astype(object).where(series[c].notna(), "").astype(str)
           for c in ("labels", "metric", "run") if c in series.columns
           and (isinstance(series[c].dtype, pd.CategoricalDtype) or series[c].isna().any())}
    return series.assign(**fix) if fix else series


def select_run(series: pd.DataFrame, run: str | None) -> pd.DataFrame:
    """Rows of one run; with ``run=None`` the table must hold a single run."""
    if "run" not in series.columns or series.empty:
        return series
    if run is None:
        runs = series["run"].dropna().unique()
        if len(runs) > 1:
            raise InputError(
                f"series holds {len(runs)} runs ({', '.join(map(str, runs[:5]))}...); "
                "pass run= to choose one"
            )
        return series
    out = series[series["run"].astype(str) == str(run)]
    if out.empty:
        raise InputError(f"series: no rows for run '{run}'")
    return out


def _label_mask(frame: pd.DataFrame, match: Mapping[str, str]) -> pd.Series:
    if not match:
        return pd.Series(True, index=frame.index)
    labels = frame["labels"] if "labels" in frame.columns else pd.Series("", index=frame.index)
    parsed = labels.map(parse_labels)
    return parsed.map(lambda d: all(d.get(k) == str(v) for k, v in match.items()))


def has_metric(series: pd.DataFrame, metric: str, match: Mapping[str, str] | None = None) -> bool:
    rows = series[series["metric"] == metric]
    if rows.empty:
        return False
    return bool(_label_mask(rows, match or {}).any())


def metric_values(
    series: pd.DataFrame,
    metric: str,
    match: Mapping[str, str] | None = None,
    *,
    agg: str = "sum",
    exclude: tuple[str, ...] = (),
) -> pd.Series:
    """One metric as a value-per-time Series (index ``t``, sorted).

    Rows with other label sets (several engines, several models) are combined per timestamp with
    ``agg`` ("sum" for counts and counters, "mean" for fractions such as KV usage). Label keys in
    ``exclude`` (e.g. ``le``) must be absent for a row to count, so ``_bucket`` rows never leak
    into a plain query.
    """
    rows = series[series["metric"] == metric]
    if rows.empty:
        return pd.Series(dtype=float)
    rows = rows[_label_mask(rows, match or {})]
    if exclude and "labels" in rows.columns:
        keep = rows["labels"].map(parse_labels).map(lambda d: not any(k in d for k in exclude))
        rows = rows[keep]
    if rows.empty:
        return pd.Series(dtype=float)
    values = pd.to_numeric(rows["value"], errors="coerce")
    grouped = values.groupby(pd.to_numeric(rows["t"], errors="coerce"))
    out = grouped.mean() if agg == "mean" else grouped.sum(min_count=1)
    return out.sort_index().astype(float)


def in_window(s: pd.Series, window: Window) -> pd.Series:
    t0, t1 = window
    mask = np.ones(len(s), dtype=bool)
    if t0 is not None:
        mask &= s.index.to_numpy() > t0
    if t1 is not None:
        mask &= s.index.to_numpy() <= t1
    return s[mask]


def window_bounds(series: pd.DataFrame, window: Window) -> tuple[float, float]:
    """The window with ``None`` ends replaced by the series' first and last timestamps."""
    t = pd.to_numeric(series["t"], errors="coerce")
    t0 = float(t.min()) if window[0] is None else float(window[0])
    t1 = float(t.max()) if window[1] is None else float(window[1])
    return t0, t1


def counter_increase(s: pd.Series, window: Window = (None, None)) -> float | None:
    """Increase of a cumulative counter over ``(t0, t1]`` (ingestion's reset-aware
    ``increase``: baseline = last sample at or before ``t0``, a drop is a restart from zero).
    ``None`` when the counter is absent."""
    if s.empty:
        return None
    inc = increase(s.index.to_numpy(dtype=float), s.to_numpy(dtype=float), *window)
    return None if math.isnan(inc) else inc


def time_weights(idx: np.ndarray) -> np.ndarray:
    """How long each gauge sample stands for: the interval up to the next sample.

    The last sample gets the median interval. Uniform scrapes give equal weights, so a
    time fraction is then the plain fraction of samples.
    """
    if len(idx) == 0:
        return np.array([])
    if len(idx) == 1:
        return np.array([1.0])
    gaps = np.diff(idx.astype(float))
    return np.append(gaps, np.median(gaps))


def time_fraction(mask: pd.Series) -> float:
    """Time-weighted fraction of samples where ``mask`` is true."""
    if mask.empty:
        return float("nan")
    w = time_weights(mask.index.to_numpy())
    total = w.sum()
    return float((w * mask.to_numpy(dtype=bool)).sum() / total) if total > 0 else float("nan")


def gauge_mean(s: pd.Series) -> float | None:
    if s.empty:
        return None
    w = time_weights(s.index.to_numpy())
    return float(np.average(s.to_numpy(dtype=float), weights=w))


def histogram_window(
    series: pd.DataFrame, base: str, window: Window = (None, None)
) -> tuple[dict[float, float], float, float] | None:
    """Bucket increases (le -> cumulative count), sum and count of a histogram over a window."""
    buckets = histogram_buckets(series, base, *window)
    if buckets.empty:
        return None
    total_sum = window_increase(series, f"{base}_sum", *window)
    total_count = window_increase(series, f"{base}_count", *window)
    if math.isnan(total_count):
        total_count = float(buckets.iloc[-1])
    return (
        {float(k): float(v) for k, v in buckets.items()},
        0.0 if math.isnan(total_sum) else float(total_sum),
        float(total_count),
    )


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` on window bucket counts; None when empty."""
    v = bucket_quantile(q, pd.Series(dict(buckets)).sort_index())
    return None if math.isnan(v) else float(v)
