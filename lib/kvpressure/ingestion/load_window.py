"""When the server was under load: the part of a window where a level's load actually ran.

A real sweep never fills its bench windows edge to edge. ``vllm bench serve`` stamps its
``date`` to the second after the run, the clients ramp up over the first seconds, the closed loop
drains once the last prompts are sent, and the server idles between levels while the next client
starts. A gauge averaged over such a window mixes the loaded engine with the idle one (a pool
that reads 0.9-1.0 whenever it is loaded averages 0.74), so gauges are read over the **steady
part** only: the scrapes where the requests in the engine (running + waiting) are at the level's
load. Counters need no trimming: an idle scrape adds nothing to an increase.

The rule (one for every consumer): a scrape is at load when running + waiting reaches
``STEADY_FRACTION`` of the level's concurrency (of the window's own high load, the 90th
percentile of its loaded scrapes, when the concurrency is not known); the steady part runs from
the first such scrape to the last. A window with fewer than two such scrapes keeps its loaded
scrapes, and failing those the whole window: each fallback is said in the notes.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvpressure.ingestion.counters import select, window_increase
from kvpressure.ingestion.names import GENERATION_TOKENS, RUNNING, WAITING

# In a closed loop at concurrency C the engine holds C requests between a finish and the
# client's next submission; scrapes catch the brief dips, and the API server holds a few
# requests it is still tokenizing. Three quarters of C separates that from ramp-up and drain.
STEADY_FRACTION = 0.75


@dataclass
class LoadWindow:
    """The steady part of ``[t0, t1]`` and how it was found."""

    t0: float
    t1: float
    loaded_scrapes: int
    steady_scrapes: int
    notes: list[str] = field(default_factory=list)


def clock(t: float) -> str:
    """A wall-clock time as a reader finds it in the server's logs (seconds of a relative
    clock, as a simulation's, as such)."""
    if t < 1e9:
        return f"{t:.0f} s"
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%H:%M:%S UTC")


def in_engine(series: pd.DataFrame, run: str | None = None) -> pd.Series:
    """Running + waiting at each scrape (all engines added); empty when neither is exported.

    A scrape that lacks one of the two counts the one it has.
    """
    parts = [
        pd.concat(list(p.values()), axis=1).sum(axis=1, min_count=1)
        for p in (select(series, RUNNING, run=run), select(series, WAITING, run=run)) if p
    ]
    if not parts:
        return pd.Series(dtype=float)
    total = pd.concat(parts, axis=1).sum(axis=1, min_count=1).dropna()
    return total.sort_index()


def steady_part(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    concurrency: float | None = None,
    run: str | None = None,
) -> LoadWindow:
    """The steady part of ``[t0, t1]`` (open ends: the whole series) by the module's rule."""
    n = in_engine(series, run)
    times = pd.to_numeric(series["t"], errors="coerce").dropna()
    lo = float(times.min()) if t0 is None and len(times) else t0
    hi = float(times.max()) if t1 is None and len(times) else t1
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        raise ValueError("steady_part: no samples")
    whole = LoadWindow(float(lo), float(hi), 0, 0)
    if n.empty:
        whole.notes.append(f"{RUNNING} and {WAITING} not exported: gauges over the whole window")
        return whole
    inside = n[(n.index >= lo) & (n.index <= hi)]
    loaded = inside[inside > 0]
    whole.loaded_scrapes = int(len(loaded))
    if loaded.empty:
        whole.notes.append("no request ran or waited in the window")
        return whole
    if concurrency and concurrency > 0 and math.isfinite(concurrency):
        level, what = float(concurrency), f"concurrency {concurrency:g}"
    else:
        level, what = float(np.percentile(loaded.to_numpy(), 90)), "the window's high load"
    at_load = inside[inside >= STEADY_FRACTION * level]
    if len(at_load) >= 2:
        out = LoadWindow(float(at_load.index[0]), float(at_load.index[-1]), len(loaded),
                         len(at_load))
        if out.t0 > lo or out.t1 < hi:
            out.notes.append(
                f"gauges over the steady part {clock(out.t0)}-{clock(out.t1)} ({len(at_load)} "
                f"scrapes with running + waiting >= {STEADY_FRACTION:g} x {what}); ramp-up, "
                "drain and idle seconds left out")
        return out
    if len(loaded) >= 2:
        out = LoadWindow(float(loaded.index[0]), float(loaded.index[-1]), len(loaded),
                         len(at_load))
        out.notes.append(
            f"fewer than two scrapes reach {STEADY_FRACTION:g} x {what}: gauges over the "
            f"loaded scrapes {clock(out.t0)}-{clock(out.t1)}")
        return out
    whole.steady_scrapes = int(len(at_load))
    whole.notes.append("one loaded scrape in the window: gauges over the whole window")
    return whole


def is_idle(series: pd.DataFrame, t0: float | None = None, t1: float | None = None,
            run: str | None = None) -> bool | None:
    """Whether nothing ran or waited at any scrape of ``[t0, t1]``; None when the engine's
    queue gauges are not exported (idleness then cannot be told)."""
    n = in_engine(series, run)
    if n.empty:
        return None
    lo = -math.inf if t0 is None else t0
    hi = math.inf if t1 is None else t1
    inside = n[(n.index >= lo) & (n.index <= hi)]
    if inside.empty:
        return None
    if (inside > 0).any():
        return False
    # Short requests can start and finish between two scrapes: tokens generated inside the
    # window are load the gauges did not catch.
    generated = window_increase(series, GENERATION_TOKENS, t0, t1, run=run)
    return not (generated > 0)
