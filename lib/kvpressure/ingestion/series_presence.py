"""Series that appear or vanish during a log: said per series, never silently.

A counter absent from some scrapes is still counted right across the gap (the increase is
between the samples either side), but one that vanishes before the log ends counts only up to
its last sample, and one that appears late counts only from its first: the user must know which
series cover less than the run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvpressure.ingestion.labels import format_labels, parse_labels

# More lines than this would bury the rest of the report; the count says how many were left.
MAX_LINES = 20


def _series_key(metric: str, labels: str) -> str:
    """A histogram's buckets vanish together: one line per series without ``le``."""
    have = {k: v for k, v in parse_labels(labels).items() if k != "le"}
    base = metric.removesuffix("_bucket")
    return f"{base}{{{format_labels(have)}}}" if have else base


def presence_notes(frame: pd.DataFrame, times: np.ndarray, run: str) -> list[str]:
    """One note per series that is missing from some of the run's scrapes."""
    if frame.empty or len(times) < 2:
        return []
    labels = frame["labels"].astype("string").fillna("").astype(str)
    groups = frame.assign(labels=labels).groupby(["metric", "labels"], sort=True)["t"]
    stats = groups.agg(["min", "max", "nunique"])
    first_t, last_t = float(times[0]), float(times[-1])
    notes: dict[str, str] = {}
    for (metric, label_text), row in stats.iterrows():
        t_min, t_max, seen = float(row["min"]), float(row["max"]), int(row["nunique"])
        if seen >= len(times):
            continue
        key = _series_key(str(metric), str(label_text))
        if key in notes:
            continue
        parts = []
        if t_min > first_t:
            parts.append(f"appears at t={t_min:g} (the log starts at {first_t:g})")
        if t_max < last_t:
            parts.append(f"vanishes after t={t_max:g} (the log ends at {last_t:g}); its "
                         "increase covers only until then")
        inside = int(np.searchsorted(times, t_max, "right") - np.searchsorted(times, t_min))
        if seen < inside:
            parts.append(f"absent from {inside - seen} of the {inside} scrapes in between "
                         "(counted across the gap)")
        if parts:
            notes[key] = f"run {run}: series {key} " + "; ".join(parts)
    return list(notes.values())


def as_warnings(notes: list[str], run: str) -> list[str]:
    """The notes for the console: the first ``MAX_LINES``, then how many more."""
    if len(notes) <= MAX_LINES:
        return list(notes)
    return notes[:MAX_LINES] + [f"run {run}: {len(notes) - MAX_LINES} more series with gaps "
                                "(ingest.json: series_presence)"]
