"""Repeated points in the runs table: the base-seed points and the per-level means.

A simulated sweep may run every point with several workload seeds (columns ``seed`` and
``repeat``; repeat 0 is the experiment's own seed and the only one with a point folder). Two
kinds of consumers, and the one rule each follows:

* one curve per variant (the knee, the symptoms' curve, the remedies' what-if, the record's
  throughput by concurrency, the figures): every repeat, averaged level by level
  (:func:`level_means`), with the spread between repeats as a band; ``find_knee`` and
  ``compare_variants`` take the repeated rows themselves and average them the same way;
* one point's files (the focus point's scrapes, steps and requests): repeat 0
  (:func:`base_repeat`).

Runs without a ``repeat`` column (ingested data) are all repeat 0; several rows of one level
there are averaged like repeats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

REPEAT = "repeat"
# The columns whose spread over repeats the figures draw as a band.
BAND_COLUMNS = ("output_throughput",)


def repeats_of(runs: pd.DataFrame) -> int:
    """How many times each point was run (1 without a ``repeat`` column)."""
    if REPEAT not in runs.columns or runs.empty:
        return 1
    return int(pd.to_numeric(runs[REPEAT], errors="coerce").nunique())


def base_repeat(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of repeat 0 (the experiment's own seed): every row without a ``repeat`` column."""
    if REPEAT not in runs.columns:
        return runs.reset_index(drop=True)
    return runs[pd.to_numeric(runs[REPEAT], errors="coerce") == 0].reset_index(drop=True)


def _finite_mean(values: pd.Series) -> float:
    # numpy's mean of the finite values in table order, as find_knee averages a level: the
    # curve and the knee's peak then agree to the last bit.
    v = values.to_numpy(float)
    v = v[np.isfinite(v)]
    return float(np.mean(v)) if len(v) else float("nan")


def level_means(runs: pd.DataFrame, columns: Sequence[str], x: str = "concurrency",
                by: Sequence[str] = ("variant",), band: Sequence[str] = BAND_COLUMNS
                ) -> pd.DataFrame:
    """One row per (``by``..., ``x``): the mean of each of ``columns`` over the repeats, plus
    ``repeats`` (rows averaged) and, for each ``band`` column, ``<col>_sd`` (standard deviation
    between repeats, 0 for one row), ``<col>_min`` and ``<col>_max``. Sorted by ``by`` then
    ``x``; columns absent from ``runs`` are left out."""
    keys = [c for c in (*by, x) if c in runs.columns]
    cols = [c for c in columns if c in runs.columns and c not in keys]
    num = runs[keys + cols].copy()
    for c in cols:
        num[c] = pd.to_numeric(num[c], errors="coerce")
    grouped = num.groupby(keys, sort=True, dropna=False)
    out = grouped[cols].agg(_finite_mean) if cols else grouped.size().to_frame("n")[[]]
    out["repeats"] = grouped.size()
    for c in band:
        if c in cols:
            out[f"{c}_sd"] = grouped[c].std(ddof=1).fillna(0.0)
            out[f"{c}_min"] = grouped[c].min()
            out[f"{c}_max"] = grouped[c].max()
    return out.reset_index()
