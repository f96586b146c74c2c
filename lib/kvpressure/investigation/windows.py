"""Where the focus point's counters and gauges are read.

A simulated closed loop holds its concurrency until its last submission (:func:`steady_window`);
ingested data has a window per level from its bench result or its scrape log
(:func:`ingested_window`), with the gauges over the load's steady part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.jsonable import finite_or_none


def steady_window(requests: pd.DataFrame | None, series: pd.DataFrame) -> tuple[float, float]:
    """The span where the closed loop still holds its full concurrency.

    After the last request is submitted the number in flight only drains, which would dilute
    every gauge; the window ends at that submission (or the last scrape without requests.csv).
    """
    t = pd.to_numeric(series["t"], errors="coerce").dropna()
    if t.empty:
        raise InputError("series: no samples to take a window from")
    t0, t_last = float(t.min()), float(t.max())
    t1 = t_last
    if requests is not None and "arrival_time_s" in requests:
        last_submit = float(pd.to_numeric(requests["arrival_time_s"], errors="coerce").max())
        scrapes = sorted(float(x) for x in t.unique())
        # Snap to the first scrape at or after the last submission: windows end on samples.
        after = [x for x in scrapes if x >= last_submit]
        if after and after[0] > t0:
            t1 = after[0]
    return t0, t1


def crop(series: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """The window's samples plus a margin: the scrape before it (the counters' baseline) and a
    little of the load around it for the figures."""
    t = pd.to_numeric(series["t"], errors="coerce")
    times = np.sort(t.dropna().unique())
    step = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    pad = max(2.0 * step, 0.05 * (t1 - t0))
    return series[(t >= t0 - pad) & (t <= t1 + pad)].reset_index(drop=True)


@dataclass
class LevelWindow:
    """The focus level's window in ingested data, and what was told about its load."""

    series: pd.DataFrame
    """The level's samples (cut to the window and a margin when a log spans many levels)."""
    counters: tuple[float, float]
    gauges: tuple[float, float]
    origin: str
    """Where its counters count from: "first" (the window's first scrape) or "zero"."""
    idle: bool | None = None
    snapshot: bool = False
    notes: list[str] = field(default_factory=list)


def ingested_window(focus_row: Mapping[str, Any], series: pd.DataFrame | None, run_name: str,
                    level: int | None, *, shared_log: bool, log_origin: str,
                    bench_timezone: str = "") -> LevelWindow:
    """Where the focus level of ingested data is read.

    * a log shared by the levels of a load test: the counters over the level's bench window,
      the gauges over its steady part;
    * one dump: gauges at that instant, counters since the server started;
    * a log of one level: up to its last scrape, gauges over the steady part ``load_window``
      tells apart, counters from ``log_origin`` (ingestion's finding for the log);
    * no engine metrics: the bench result's window (a 1 s placeholder without a duration).
    """
    from kvpressure.ingestion.api import bench_tzinfo, bench_window
    from kvpressure.ingestion.load_window import clock as _clock
    from kvpressure.ingestion.load_window import is_idle, steady_part

    w0, w1 = finite_or_none(focus_row.get("t_start")), finite_or_none(focus_row.get("t_end"))
    s0 = finite_or_none(focus_row.get("t_steady_start"))
    s1 = finite_or_none(focus_row.get("t_steady_end"))
    t0: float
    t1: float
    g0: float
    g1: float
    origin, idle, snapshot, notes = "first", None, False, []
    if series is not None and not series.empty:
        scrape_times = pd.to_numeric(series["t"], errors="coerce").dropna().unique()
        if shared_log and w0 is not None and w1 is not None:
            series = crop(series, w0, w1)
            t0, t1 = w0, w1
            g0, g1 = (s0, s1) if s0 is not None and s1 is not None and s1 > s0 else (w0, w1)
            notes.append(
                f"counters over the level's window {_clock(t0)}-{_clock(t1)} (from its bench "
                f"result), gauges over its steady part {_clock(g0)}-{_clock(g1)} "
                f"({t1 - t0 - g1 + g0:.0f} s "
                "of ramp-up, drain and idle left out)")
        elif len(scrape_times) == 1:
            # One dump: gauges as they stood at that instant, counters since the server began.
            t0 = t1 = g0 = g1 = float(scrape_times[0])
            origin = "zero"
            snapshot = True
            notes.append(
                "one scrape: gauges at that instant, counters since the server started (no rate, "
                "no time series)")
        else:
            t0, t1 = steady_window(None, series)
            part = steady_part(series, concurrency=float(level) if level else None)
            g0, g1 = part.t0, part.t1
            notes.extend(part.notes)
            # The runs row of a whole log counts from the process start when ingestion found
            # that the log starts with it; the focus window, the same span, counts the same way.
            origin = log_origin
        idle = is_idle(series, t0 if t1 > t0 else None, t1)
        series = series.assign(run=run_name)
    else:
        series = pd.DataFrame(columns=["run", "t", "metric", "labels", "value"])
        w = bench_window({"date": focus_row.get("date"),
                          "duration_s": finite_or_none(focus_row.get("duration_s"))},
                         bench_tzinfo(bench_timezone or None))
        duration = finite_or_none(focus_row.get("duration_s")) or 0.0
        if duration <= 0:
            # A table of runs without durations (a spreadsheet): the window only names the
            # level; without engine metrics nothing is read over it.
            duration = 1.0
            notes.append("the runs table gives no duration: the level's window is a "
                                 "1 s placeholder (no engine metrics are read over it)")
        t0, t1 = (w[0], w[0] + duration) if w else (0.0, duration)
        g0, g1 = t0, t1
    return LevelWindow(series, (t0, t1), (g0, g1), origin, idle, snapshot, notes)
