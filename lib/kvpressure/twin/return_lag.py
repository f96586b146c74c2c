"""The real client's turnaround in engine steps (docs/scheduler.md#loop-closed-return).

A real closed loop's replacement reaches the engine some steps after the finish that freed its
client, and a real benchmark's first request reaches the engine alone. The twin counts that
lag in steps, not seconds, so that its decisions stay independent of the step time (the fit's
premise, ``basis.py``). Two estimates, best first:

* **from the server's step trace** (its iteration-details log): per level, the lag whose
  simulation schedules as many requests per step on average as the server did (every step a
  client is away, its slot is empty; where the waiting queue never empties, no lag changes a
  step and the level says nothing); the levels that say nothing take the turnaround in seconds
  of the ones that do, over their own step period. Whether the first request ran alone is read
  off each level's first logged step (where the twin's would take more than one);
* **from the client turnaround in seconds** (``turnaround.py``): the median client-side gap
  over the levels, over the fitted mean step time at each level, rounded. It misses the API server's
  share (inside TTFT), so it can only understate the lag.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.simulation.engine import simulate
from kvpressure.twin.workload import LevelWorkload

MAX_RETURN_STEPS = 16
# A level is informative when the longest lag changes its mean scheduled requests per step
# by at least this share of its concurrency.
MIN_EFFECT = 0.005


@dataclasses.dataclass
class ReturnLag:
    """What the twin's closed loop assumes about the clients' return, and why."""

    return_steps: dict[int, int]
    first_alone: bool
    source: str
    per_level: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def apply(self, workloads: Mapping[int, LevelWorkload]) -> dict[int, LevelWorkload]:
        return {c: dataclasses.replace(w, return_steps=self.return_steps.get(c, 0),
                                       first_alone=self.first_alone)
                for c, w in workloads.items()}


def level_steps(steps: pd.DataFrame, t_start: float, t_end: float) -> pd.DataFrame:
    """The level's logged steps, from its first prefill (the steps before belong to the
    previous level's drain)."""
    from kvpressure.ingestion.iteration_log import in_window

    real = in_window(steps, t_start - 1, t_end + 1).reset_index(drop=True)
    starts = real.index[real["context_requests"] > 0]
    return real.loc[starts[0]:].reset_index(drop=True) if len(starts) else real.iloc[:0]


def _mean_scheduled(settings: Mapping[str, Any], w: LevelWorkload) -> float:
    from kvpressure.twin.basis import build_scenario

    return float(np.mean(simulate(build_scenario(settings, w)).steps.columns[
        "num_scheduled_reqs"]))


def _calibrate(settings: Mapping[str, Any], w: LevelWorkload, target: float) -> int | None:
    """The lag whose simulation's mean scheduled requests per step is nearest ``target``;
    None when no lag up to ``MAX_RETURN_STEPS`` moves it."""
    at = {0: _mean_scheduled(settings, w)}
    last = _mean_scheduled(settings, dataclasses.replace(w, return_steps=MAX_RETURN_STEPS))
    if at[0] - last < MIN_EFFECT * w.concurrency:
        return None
    k = 0
    # More lag, fewer requests per step (a client away empties its slot): walk up until the
    # simulation schedules fewer than the server did.
    while k < MAX_RETURN_STEPS and at[k] > target:
        k += 1
        at[k] = _mean_scheduled(settings, dataclasses.replace(w, return_steps=k)) \
            if k < MAX_RETURN_STEPS else last
    if k and abs(at[k - 1] - target) <= abs(at[k] - target):
        k -= 1
    return k


def first_request_alone(windows: Mapping[int, pd.DataFrame], settings: Mapping[str, Any],
                        workloads: Mapping[int, LevelWorkload]) -> bool:
    """Whether, in most levels whose first step would take more than one request had all
    clients arrived together (the token budget may leave room for only one prompt), the
    server's first logged step prefilled a single request."""
    from kvpressure.twin.basis import build_scenario

    votes = []
    for c, real in windows.items():
        if c < 2:
            continue
        w = dataclasses.replace(workloads[c], return_steps=0, first_alone=False)
        together = simulate(build_scenario(settings, w)).steps.columns["admitted_new"][0]
        if together > 1:
            votes.append(int(real["context_requests"].iloc[0]) == 1)
    return 2 * sum(votes) > len(votes)


def from_step_trace(steps: pd.DataFrame, levels: pd.DataFrame, settings: Mapping[str, Any],
                    workloads: Mapping[int, LevelWorkload], return_steps: int | None = None
                    ) -> ReturnLag | None:
    """The lag per level from the server's own steps (``return_steps`` given: only whether
    the first request ran alone); None when no level's window holds steps."""
    windows = {int(r["concurrency"]): level_steps(steps, float(r["t_start"]), float(r["t_end"]))
               for _, r in levels.iterrows()
               if int(r["concurrency"]) in workloads
               and math.isfinite(float(r.get("t_start", math.nan)))
               and math.isfinite(float(r.get("t_end", math.nan)))}
    windows = {c: s for c, s in windows.items() if len(s)}
    if not windows:
        return None
    first_alone = first_request_alone(windows, settings, workloads)
    if return_steps is not None:
        return given(return_steps, list(workloads), first_alone)
    per: dict[int, dict[str, Any]] = {}
    lag_s: list[float] = []
    for c, real in sorted(windows.items()):
        target = float((real["context_requests"] + real["generation_requests"]).mean())
        w = dataclasses.replace(workloads[c], first_alone=first_alone)
        k = _calibrate(settings, w, target)
        row = levels[levels["concurrency"] == c].iloc[0]
        period = (float(row["t_end"]) - float(row["t_start"])) / len(real)
        per[c] = {"return_steps": k, "mean_scheduled_real": round(target, 3),
                  "step_period_s": period, "steps": len(real)}
        if k is not None:
            lag_s.append(k * period)
    turnaround = float(np.median(lag_s)) if lag_s else 0.0
    out: dict[int, int] = {}
    for c, d in per.items():
        if d["return_steps"] is None:
            d["return_steps"] = round(turnaround / d["step_period_s"]) if lag_s else 0
            d["how"] = "no lag changes this level (its waiting queue never empties)"
        else:
            d["how"] = "simulated requests per step matched to the server's"
        out[c] = int(d["return_steps"])
    source = (f"from the server's step trace (mean requests scheduled per step matched, "
              f"{len(lag_s)} of {len(per)} levels informative, about {turnaround * 1000:.0f} ms "
              "a return)")
    return ReturnLag(out, first_alone, source, per)


def from_turnaround(gaps_s: Mapping[int, float], step_s: Mapping[int, float]) -> ReturnLag:
    """The lag per level: the median client-side turnaround over the levels (one level's mean
    gap, from a few dozen requests, scatters by several milliseconds, more than a step) over
    the level's mean step time, rounded."""
    known = [g for g in gaps_s.values() if math.isfinite(g)]
    median = float(np.median(known)) if known else 0.0
    out: dict[int, int] = {}
    per: dict[int, dict[str, Any]] = {}
    for c, dt in step_s.items():
        k = int(round(median / dt)) if dt > 0 and math.isfinite(dt) else 0
        out[c] = max(0, min(k, MAX_RETURN_STEPS))
        per[c] = {"return_steps": out[c], "client_gap_s": gaps_s.get(c, math.nan),
                  "mean_step_s": dt}
    if not known:
        return ReturnLag(out, False, "none: the data measures no client turnaround (no bench "
                         "start times); the API server's share is not in it either", per)
    return ReturnLag(out, False, "from the client-side turnaround (bench start times and "
                     f"latencies, median {median * 1000:.1f} ms) over the fitted mean step time "
                     "of each level, rounded; it misses the API server's share, so it can "
                     "understate the lag", per)


def given(return_steps: int, levels: list[int], first_alone: bool = False) -> ReturnLag:
    return ReturnLag({c: int(return_steps) for c in levels}, first_alone,
                     f"given ({return_steps} steps at every level)")
