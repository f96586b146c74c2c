"""Reading the simulation's ``steps`` table over a window."""

from __future__ import annotations

import pandas as pd

from kvpressure.errors import InputError

Window = tuple[float | None, float | None]


def require_columns(frame: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{name}: missing column '{missing[0]}'" + (
            f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""))


def is_timed(steps: pd.DataFrame) -> bool:
    return "time_s" in steps.columns and "step_duration_s" in steps.columns


def output_times(steps: pd.DataFrame) -> pd.Series:
    """When each step's outputs are stamped: ``time_s + step_duration_s``.

    That is also when the Prometheus view sees the step (gauges after ``update_from_output``),
    so a window ``(t0, t1]`` selects the same steps from ``steps`` and from ``series``.
    """
    return steps["time_s"].astype(float) + steps["step_duration_s"].astype(float)


def steps_in_window(steps: pd.DataFrame, window: Window) -> pd.DataFrame:
    """Steps inside ``(t0, t1]``: in seconds when timed, else in step numbers (inclusive)."""
    t0, t1 = window
    if t0 is None and t1 is None:
        return steps
    if is_timed(steps):
        key = output_times(steps)
        mask = pd.Series(True, index=steps.index)
        if t0 is not None:
            mask &= key > t0
        if t1 is not None:
            mask &= key <= t1
    else:
        key = steps["step"].astype(float)
        mask = pd.Series(True, index=steps.index)
        if t0 is not None:
            mask &= key >= t0
        if t1 is not None:
            mask &= key <= t1
    return steps[mask]
