"""Linear statistics of a closed-loop level: one simulation per step-time coefficient.

In a closed loop without think time the scheduler's decisions (what runs, what is preempted,
when a client resubmits) follow from the steps alone, never from their durations. With the
twin's step time linear in its coefficients, every time a simulation reports (each request's
TTFT and end, the run's duration, its mean ITL) is then the same combination of the times of
one simulation per coefficient with that coefficient set to 1 and the rest to 0. So a level is
simulated once per coefficient, and the fit, its bootstrap and any prediction for another set
of coefficients are matrix products, with no simulation in the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpressure.errors import InputError
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.scenario import SETTING_NAMES, load_scenario
from kvpressure.twin.step_time import COEFFICIENTS, TwinStepTime
from kvpressure.twin.workload import LevelWorkload


def build_scenario(settings: Mapping[str, Any], workload: LevelWorkload, name: str = "twin"
                   ) -> Any:
    """The scenario of one level, a closed loop or an open loop in time; prompts vLLM would
    refuse (not shorter than ``max_model_len``) are left out, as the server never schedules
    them."""
    mml = int(settings["max_model_len"])
    requests = [r for r in workload.requests() if r["prompt_len"] < mml]
    what = (f"request rate {workload.request_rate:g}" if workload.open_loop
            else f"concurrency {workload.concurrency}")
    if not requests:
        raise InputError(f"{what}: every prompt is at least max_model_len {mml} tokens long")
    mode = ({"type": "open"} if workload.open_loop else
            {"type": "closed", "concurrency": int(workload.concurrency),
             "return_steps": int(workload.return_steps),
             "first_alone": bool(workload.first_alone)})
    return load_scenario({
        "name": f"{name}/" + (f"r{workload.request_rate:g}" if workload.open_loop
                              else f"c{workload.concurrency}"),
        "seed": 0,
        "mode": mode,
        "settings": {k: v for k, v in settings.items() if k in SETTING_NAMES},
        "requests": requests,
    })


@dataclass
class LevelBasis:
    """What one level's simulations give; time columns have one entry per coefficient."""

    concurrency: int
    num_requests: int
    output_tokens: int
    steps: int
    preemptions: int
    recomputed_tokens: int
    scheduled_tokens: int
    mean_running: float
    max_running: int
    duration: np.ndarray
    """(K,) duration of the level per unit of each coefficient."""
    itl_mean: np.ndarray
    ttft: np.ndarray
    """(requests, K) time to first token of each request."""
    e2e: np.ndarray
    prefill_time: np.ndarray
    """(requests, K) first token minus the start of the step that first scheduled it."""
    decode_time: np.ndarray
    """(requests, K) last token minus first token."""

    def time(self, name: str, theta: np.ndarray) -> Any:
        """A time statistic for coefficients ``theta`` (K,) or samples (B, K)."""
        return getattr(self, name) @ np.asarray(theta, dtype=float).T

    @property
    def recompute_ratio(self) -> float:
        return self.recomputed_tokens / self.scheduled_tokens if self.scheduled_tokens else 0.0


def _request_times(result: Any) -> tuple[np.ndarray, ...]:
    steps = result.steps.columns
    step_ids = np.asarray(steps["step"], dtype=np.int64)
    starts = np.asarray(steps["time_s"], dtype=float)
    reqs = result.requests
    ttft = np.array([r.first_token_time_s - r.submit_time_s for r in reqs])
    e2e = np.array([r.finish_time_s - r.submit_time_s for r in reqs])
    first = np.array([r.first_token_time_s for r in reqs])
    sched_step = np.array([r.first_sched_step for r in reqs], dtype=np.int64)
    idx = np.clip(np.searchsorted(step_ids, sched_step), 0, len(step_ids) - 1)
    prefill = first - starts[idx]
    decode = np.array([r.last_token_time_s - r.first_token_time_s for r in reqs])
    return ttft, e2e, prefill, decode


def simulate_basis(settings: Mapping[str, Any], workload: LevelWorkload) -> LevelBasis:
    """Simulate the level once per coefficient (event-driven path) and keep its statistics."""
    if workload.open_loop:
        raise InputError(f"request rate {workload.request_rate:g}: an open loop's decisions "
                         "depend on the step time, so it has no linear basis; simulate it with "
                         "the fitted coefficients (simulate.simulate_level)")
    scenario = build_scenario(settings, workload)
    cols: dict[str, list[Any]] = {k: [] for k in ("duration", "itl_mean", "ttft", "e2e",
                                                  "prefill_time", "decode_time")}
    decisions = None
    for name in COEFFICIENTS:
        result = simulate(scenario, cost_model=TwinStepTime.basis(name), fast_path="leap")
        s = result.summary
        ttft, e2e, prefill, decode = _request_times(result)
        cols["duration"].append(s["duration_s"])
        cols["itl_mean"].append(s["itl_mean_s"])
        cols["ttft"].append(ttft)
        cols["e2e"].append(e2e)
        cols["prefill_time"].append(prefill)
        cols["decode_time"].append(decode)
        here = (s["steps"], s["preemptions"], s["recomputed_tokens"])
        if decisions is None:
            decisions = (s, here)
        elif decisions[1] != here:  # pragma: no cover - the engine's closed loop is time-free
            raise RuntimeError("closed-loop decisions changed with the step time")
    assert decisions is not None  # COEFFICIENTS is never empty
    s = decisions[0]
    return LevelBasis(
        concurrency=workload.concurrency,
        num_requests=int(s["num_requests"]),
        output_tokens=int(s["total_output_tokens"]),
        steps=int(s["steps"]),
        preemptions=int(s["preemptions"]),
        recomputed_tokens=int(s["recomputed_tokens"]),
        scheduled_tokens=int(s["total_scheduled_tokens"]),
        mean_running=float(s["mean_running"]),
        max_running=int(s["max_running"]),
        duration=np.asarray(cols["duration"], dtype=float),
        itl_mean=np.asarray(cols["itl_mean"], dtype=float),
        ttft=np.column_stack(cols["ttft"]),
        e2e=np.column_stack(cols["e2e"]),
        prefill_time=np.column_stack(cols["prefill_time"]),
        decode_time=np.column_stack(cols["decode_time"]),
    )
