"""Why requests wait: capacity vs deferred, and the silent form of running out of KV blocks.

``vllm:num_requests_waiting_by_reason`` splits the queue: ``capacity`` (no room: blocks, token
budget, ``max_num_seqs``; every preempted request) and ``deferred`` (held by a transient
constraint: LoRA budget, remote KV transfer, grammar). The two are reported side by side and never
added: only capacity waiting says anything about KV pressure.

Running below ``max_num_seqs`` while capacity-waiting requests exist is the silent form of
running out of KV blocks: no error, the batch is simply smaller than configured. Running at
``max_num_seqs`` with a queue is the configured limit doing its job.

Every time fraction is time-weighted over gauge samples (or steps). Missing metrics give None,
never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvpressure.analysis import _series as S
from kvpressure.analysis._steps import is_timed, steps_in_window
from kvpressure.errors import InputError
from kvpressure.ingestion.counters import held_mean, held_range
from kvpressure.ingestion.names import RUNNING, WAITING, WAITING_BY_REASON
from kvpressure.jsonable import to_jsonable

STATES = (
    "idle",  # nothing running, nothing waiting
    "running_no_queue",  # running, nobody waiting
    "queue_at_max_num_seqs",  # waiting while running has reached the setting
    "queue_below_max_num_seqs",  # capacity waiting while running < setting: the silent form
    "deferred_only",  # only deferred requests wait
)


@dataclass
class WaitingReport:
    window: tuple[float | None, float | None]
    source: str
    samples: int
    max_num_seqs: int | None
    has_reason_split: bool
    frac_waiting: float | None = None
    frac_capacity: float | None = None
    frac_deferred: float | None = None
    mean_waiting: float | None = None
    mean_capacity: float | None = None
    mean_deferred: float | None = None
    max_waiting: float | None = None
    mean_running: float | None = None
    max_running: float | None = None
    frac_silent: float | None = None
    frac_at_limit: float | None = None
    states: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return to_jsonable(self)


def _fill(
    out: WaitingReport,
    w: np.ndarray,
    running: np.ndarray | None,
    waiting: np.ndarray | None,
    capacity: np.ndarray | None,
    deferred: np.ndarray | None,
) -> WaitingReport:
    def frac(mask: np.ndarray) -> float:
        return held_mean(mask, w)

    mean = frac

    if waiting is not None:
        out.frac_waiting, out.mean_waiting = frac(waiting > 0), mean(waiting)
        out.max_waiting = float(waiting.max()) if waiting.size else None
    if capacity is not None:
        out.frac_capacity, out.mean_capacity = frac(capacity > 0), mean(capacity)
    if deferred is not None:
        out.frac_deferred, out.mean_deferred = frac(deferred > 0), mean(deferred)
    if running is not None:
        out.mean_running = mean(running)
        out.max_running = float(running.max()) if running.size else None
    queue = capacity if capacity is not None else waiting
    if running is None or queue is None:
        return out
    if capacity is None:
        out.notes.append(
            "no vllm:num_requests_waiting_by_reason: all waiting treated as capacity for the "
            "silent-form test (deferred cannot be told apart)"
        )
    if out.max_num_seqs is None:
        out.notes.append("max_num_seqs unknown: the silent form cannot be tested")
        return out
    below = running < out.max_num_seqs
    out.frac_silent = frac((queue > 0) & below)
    out.frac_at_limit = frac((queue > 0) & ~below)
    waiting_any = waiting if waiting is not None else queue
    deferred_only = (waiting_any > 0) & (queue <= 0)
    out.states = {
        "idle": frac((running <= 0) & (waiting_any <= 0)),
        "running_no_queue": frac((running > 0) & (waiting_any <= 0)),
        "queue_at_max_num_seqs": out.frac_at_limit,
        "queue_below_max_num_seqs": out.frac_silent,
        "deferred_only": frac(deferred_only),
    }
    return out


def waiting_from_series(
    series: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    run: str | None = None,
    max_num_seqs: int | None = None,
) -> WaitingReport:
    """Waiting reasons and the silent form from the gauges of ``series``."""
    series = S.check_series(series)
    series = S.select_run(series, run)
    window = (t0, t1)
    running = S.metric_values(series, RUNNING)
    waiting = S.metric_values(series, WAITING)
    cap = S.metric_values(series, WAITING_BY_REASON, {"reason": "capacity"})
    dfr = S.metric_values(series, WAITING_BY_REASON, {"reason": "deferred"})
    frame = pd.concat(
        {"running": running, "waiting": waiting, "capacity": cap, "deferred": dfr}, axis=1
    ).sort_index().ffill()
    lo, hi, w = held_range(frame.index.to_numpy(dtype=float), t0, t1)
    frame = frame.iloc[lo:hi]
    out = WaitingReport(
        window=window, source="series", samples=len(frame), max_num_seqs=max_num_seqs,
        has_reason_split=not cap.empty,
    )
    if frame.empty:
        out.notes.append("no running/waiting gauges in the window")
        return out

    def col(name: str, present: bool) -> np.ndarray | None:
        if not present:
            return None
        return frame[name].fillna(0.0).to_numpy(dtype=float)

    return _fill(
        out, w, col("running", not running.empty), col("waiting", not waiting.empty),
        col("capacity", not cap.empty), col("deferred", not dfr.empty),
    )


def waiting_from_steps(
    steps: pd.DataFrame,
    t0: float | None = None,
    t1: float | None = None,
    *,
    max_num_seqs: int | None = None,
) -> WaitingReport:
    """The same from simulated steps (state after each step's output, as the gauges show it)."""
    w_steps = steps_in_window(steps, (t0, t1))
    rcol = "num_running_after" if "num_running_after" in steps else "num_running"
    wcol = "num_waiting_after" if "num_waiting_after" in steps else "num_waiting"
    for c in (rcol, wcol):
        if c not in steps.columns:
            raise InputError(f"steps: missing column '{c}'")
    out = WaitingReport(
        window=(t0, t1), source="steps", samples=len(w_steps), max_num_seqs=max_num_seqs,
        has_reason_split="num_waiting_deferred" in steps.columns,
    )
    if w_steps.empty:
        return out
    w = (
        w_steps["step_duration_s"].to_numpy(dtype=float)
        if is_timed(w_steps) else np.ones(len(w_steps))
    )
    running = w_steps[rcol].to_numpy(dtype=float)
    waiting = w_steps[wcol].to_numpy(dtype=float)
    deferred = (
        w_steps["num_waiting_deferred"].to_numpy(dtype=float)
        if out.has_reason_split else None
    )
    capacity = waiting - deferred if deferred is not None else None
    return _fill(out, w, running, waiting, capacity, deferred)
