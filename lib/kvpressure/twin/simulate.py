"""One level of the twin, simulated with given step-time coefficients (event-driven, seeded
by its fixed request set), with the latency percentiles the fit report compares."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvpressure.simulation.engine import simulate
from kvpressure.simulation.outputs import percentile
from kvpressure.twin.basis import build_scenario
from kvpressure.twin.step_time import TwinStepTime
from kvpressure.twin.workload import LevelWorkload


class TokenGaps:
    """Recorder of every inter-token gap (value, how many tokens had it), for the ITL
    percentiles the simulation summary does not carry (the median)."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.values: list[float] = []
        self.weights: list[int] = []

    def _token(self, req: Any, t: float) -> None:
        key = id(req)
        prev = self.last.get(key)
        if prev is not None:
            self.values.append(t - prev)
            self.weights.append(1)
        self.last[key] = t

    def on_output(self, req: Any, t: float, new_tokens: int, finished: bool) -> None:
        self._token(req, t)

    def on_decode_tokens(self, reqs: Any, t: float) -> None:
        for r in reqs:
            self._token(r, t)

    def on_decode_leap(self, reqs: Any, times: Any) -> None:
        times = np.asarray(times, dtype=float)
        if not len(times):
            return
        for r in reqs:
            self._token(r, float(times[0]))
            self.last[id(r)] = float(times[-1])
        if len(times) > 1:
            self.values.extend(np.diff(times).tolist())
            self.weights.extend([len(reqs)] * (len(times) - 1))

    def quantile(self, q: float) -> float:
        return percentile(self.values, self.weights, q)


def simulate_level(settings: Mapping[str, Any], workload: LevelWorkload,
                   coefficients: Mapping[str, float], ttft_offset: float = 0.0, *,
                   noise: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """Throughput, preemptions, recompute and latency percentiles of one level; ``noise`` and
    ``seed`` scatter the step times (``TwinStepTime``)."""
    gaps = TokenGaps()
    result = simulate(build_scenario(settings, workload),
                      cost_model=TwinStepTime(coefficients, noise, seed), recorder=gaps,
                      fast_path="leap")
    s = result.summary
    ttft = np.array([r.first_token_time_s - r.submit_time_s for r in result.requests])
    ttft = ttft + ttft_offset
    # The request path's time (ttft_offset) is in every request's end-to-end latency too.
    e2e = np.array([r.finish_time_s - r.submit_time_s for r in result.requests]) + ttft_offset
    # TPOT as vllm bench serve has it: a request's decode time over its tokens after the first.
    tpot = [(r.finish_time_s - r.first_token_time_s) / (r.num_output_tokens - 1)
            for r in result.requests if r.num_output_tokens > 1]
    return {
        "concurrency": workload.concurrency,
        **({"request_rate": workload.request_rate} if workload.open_loop else {}),
        "num_requests": s["num_requests"],
        "duration_s": s["duration_s"],
        "output_throughput": s["output_throughput"],
        "total_token_throughput": s["total_token_throughput"],
        "preemptions": s["preemptions"],
        "recomputed_tokens": s["recomputed_tokens"],
        "recompute_ratio": s["recompute_ratio"],
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p50_s": percentile(ttft.tolist(), None, 0.50),
        "ttft_p95_s": percentile(ttft.tolist(), None, 0.95),
        "ttft_p99_s": percentile(ttft.tolist(), None, 0.99),
        "itl_mean_s": s["itl_mean_s"],
        "itl_p50_s": gaps.quantile(0.50),
        "itl_p95_s": gaps.quantile(0.95),
        "itl_p99_s": gaps.quantile(0.99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else math.nan,
        "tpot_p99_s": percentile(tpot, None, 0.99) if tpot else math.nan,
        "e2e_mean_s": float(e2e.mean()),
        "e2e_p99_s": percentile(e2e.tolist(), None, 0.99),
        "mean_running": s["mean_running"],
        "max_running": s["max_running"],
        "engine_steps": s["steps"],
        "tokens_per_step": s["total_scheduled_tokens"] / s["steps"] if s["steps"] else 0.0,
    }
