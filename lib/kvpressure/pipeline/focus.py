"""The focus level: the concurrency whose counters the investigation reads, and why that one."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvpressure.errors import InputError


def focus_level(baseline_runs: pd.DataFrame, requested: float | None = None,
                x: str = "concurrency") -> tuple[Any, str]:
    """The concurrency whose counters the investigation reads, and why that one.

    ``requested`` wins when it is a swept level; otherwise the first level past the knee of the
    baseline curve (the last level when the knee is the last level or there is none). Repeated
    rows of a level (workload seeds) are averaged, as the knee stage does.
    """
    from kvpressure.analysis.knee import find_knee

    if x != "concurrency":
        return _focus_rate(baseline_runs, requested, x)
    levels = sorted(int(c) for c in pd.to_numeric(baseline_runs["concurrency"]).dropna().unique())
    if not levels:
        raise InputError("runs: no concurrency levels to focus on")
    if requested:
        if int(requested) not in levels:
            raise InputError(
                f"focus_concurrency {requested}: not a swept level; levels are "
                f"{', '.join(map(str, levels))}"
            )
        return int(requested), "given as a parameter"
    if len(levels) == 1:
        return levels[0], "the only level measured"
    if len(levels) < 3:
        return levels[-1], "the largest level (too few levels for a knee)"
    knee = find_knee(baseline_runs["concurrency"], baseline_runs["output_throughput"])
    if knee.knee_x is None:
        return levels[-1], "the largest level (throughput still rising: no knee in range)"
    past = [c for c in levels if c > knee.knee_x]
    if not past:
        return levels[-1], f"the largest level (the knee, {knee.knee_x:g}, is the last level)"
    return past[0], f"the first level past the knee at concurrency {knee.knee_x:g}"


def _focus_rate(baseline_runs: pd.DataFrame, requested: float | None, x: str
                ) -> tuple[float, str]:
    """The concurrency rule on a request-rate axis: the first offered load past the knee."""
    from kvpressure.analysis.knee import find_knee
    from kvpressure.pipeline.sentences import level_words

    word = level_words(x)
    levels = sorted(float(r) for r in pd.to_numeric(baseline_runs[x]).dropna().unique())
    if not levels:
        raise InputError(f"runs: no {word.plural} to focus on")
    if requested:
        if float(requested) not in levels:
            raise InputError(
                f"focus_{x} {requested:g}: not a swept level; levels are "
                f"{', '.join(f'{v:g}' for v in levels)}")
        return float(requested), "given as a parameter"
    if len(levels) == 1:
        return levels[0], "the only level measured"
    if len(levels) < 3:
        return levels[-1], "the largest level (too few levels for a knee)"
    knee = find_knee(baseline_runs[x], baseline_runs["output_throughput"])
    if knee.knee_x is None:
        return levels[-1], "the largest level (throughput still rising: no knee in range)"
    past = [r for r in levels if r > knee.knee_x]
    if not past:
        return levels[-1], f"the largest level (the knee, {knee.knee_x:g}, is the last level)"
    return past[0], f"the first level past the knee at {word.singular} {knee.knee_x:g}"
