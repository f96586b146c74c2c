"""The focus level: the concurrency whose counters the investigation reads, and why that one."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvpressure.errors import InputError


def focus_level(baseline_runs: pd.DataFrame, requested: float | None = None,
                x: str = "concurrency") -> tuple[Any, str]:
    """The level whose counters the investigation reads (a concurrency, or a request rate on
    that axis), and why that one.

    ``requested`` wins when it is a swept level; otherwise the first level past the knee of the
    baseline curve (the last level when the knee is the last level or there is none). Repeated
    rows of a level (workload seeds) are averaged, as the knee stage does.
    """
    from kvpressure.analysis.knee import find_knee
    from kvpressure.words import level_words

    word = level_words(x)
    closed = x == "concurrency"
    as_level: Any = int if closed else float
    shown: Any = str if closed else (lambda v: f"{v:g}")
    levels = sorted(as_level(v) for v in pd.to_numeric(baseline_runs[x]).dropna().unique())
    if not levels:
        raise InputError(f"runs: no {word.plural} to focus on")
    if requested:
        if as_level(requested) not in levels:
            raise InputError(
                f"focus_{x} {shown(requested)}: not a swept level; levels are "
                f"{', '.join(shown(v) for v in levels)}"
            )
        return as_level(requested), "given as a parameter"
    if len(levels) == 1:
        return levels[0], "the only level measured"
    if len(levels) < 3:
        return levels[-1], "the largest level (too few levels for a knee)"
    knee = find_knee(baseline_runs[x], baseline_runs["output_throughput"])
    if knee.knee_x is None:
        return levels[-1], "the largest level (throughput still rising: no knee in range)"
    past = [c for c in levels if c > knee.knee_x]
    if not past:
        return levels[-1], f"the largest level (the knee, {knee.knee_x:g}, is the last level)"
    return past[0], f"the first level past the knee at {word.singular} {knee.knee_x:g}"
