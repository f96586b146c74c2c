"""Reading the canonical ``series`` table: one metric, one window, counters and histograms.

Small private helpers shared by the analysis modules, thin wrappers over
``kvpressure.ingestion.counters`` (label selection, counter increase with resets, histogram
buckets and quantiles; gauges are read with its ``gauge_window`` and ``held_mean``). They never invent a value: a metric that
is absent gives ``None`` (or an empty Series), which the callers turn into "no data".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.counters import (
    bucket_quantile,
    histogram_buckets,
    increase,
    select,
    window_increase,
)
from kvpressure.ingestion.labels import parse_labels
from kvpressure.jsonable import finite_or_none

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


def has_metric(series: pd.DataFrame, metric: str, match: Mapping[str, str] | None = None) -> bool:
    return bool(select(series, metric, match))


def metric_values(
    series: pd.DataFrame,
    metric: str,
    match: Mapping[str, str] | None = None,
    *,
    agg: str = "sum",
    exclude: tuple[str, ...] = (),
) -> pd.Series:
    """One metric as a value-per-time Series (index ``t``, sorted), from ingestion's ``select``.

    Rows with other label sets (several engines, several models) are combined per timestamp with
    ``agg`` ("sum" for counts and counters, "mean" for fractions such as KV usage). Label keys in
    ``exclude`` (e.g. ``le``) must be absent for a row to count, so ``_bucket`` rows never leak
    into a plain query.
    """
    parts = [s for key, s in select(series, metric, match).items()
             if not any(k in parse_labels(key) for k in exclude)]
    if not parts:
        return pd.Series(dtype=float)
    grouped = pd.concat(parts).groupby(level=0)
    out = grouped.mean() if agg == "mean" else grouped.sum(min_count=1)
    return out.sort_index().astype(float)


def counter_increase(s: pd.Series, window: Window = (None, None),
                     origin: str = "first") -> float | None:
    """Increase of a cumulative counter over ``(t0, t1]`` (ingestion's reset-aware
    ``increase``: baseline = last sample at or before ``t0``, a drop is a restart from zero;
    ``origin="zero"`` with an open start counts from the server's start).
    ``None`` when the counter is absent."""
    if s.empty:
        return None
    return finite_or_none(
        increase(s.index.to_numpy(dtype=float), s.to_numpy(dtype=float), *window, origin)
    )


def histogram_window(
    series: pd.DataFrame, base: str, window: Window = (None, None), origin: str = "first"
) -> tuple[dict[float, float], float, float] | None:
    """Bucket increases (le -> cumulative count), sum and count of a histogram over a window."""
    buckets = histogram_buckets(series, base, *window, origin=origin)
    if buckets.empty:
        return None
    total_sum = window_increase(series, f"{base}_sum", *window, origin=origin)
    total_count = window_increase(series, f"{base}_count", *window, origin=origin)
    if math.isnan(total_count):
        total_count = float(buckets.iloc[-1])
    return (
        {float(k): float(v) for k, v in buckets.items()},
        0.0 if math.isnan(total_sum) else float(total_sum),
        float(total_count),
    )


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile`` on window bucket counts; None when empty."""
    return finite_or_none(bucket_quantile(q, pd.Series(dict(buckets)).sort_index()))
