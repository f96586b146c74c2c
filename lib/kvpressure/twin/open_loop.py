"""The twin of an open loop: requests arriving at a measured rate, not sent by C clients.

In a closed loop the scheduler's decisions do not depend on the step time, so one simulation
per coefficient prices every set of coefficients (``basis.py``). In an open loop they do: a
slower step lets more requests arrive before the next one, so the batch, the preemptions and
the queue all move with the time model. Two consequences:

* **the fit needs the server's step trace** (``step_trace.py``): every logged step gives its
  work and its time, whatever the arrivals did; the levels' aggregates alone would need a
  simulation inside the optimiser's loop and cannot tell a slow step from a queue;
* **every prediction is a simulation** with the fitted coefficients, and the uncertainty is
  the spread over ``BAND_DRAWS`` replays, each with one bootstrap draw of the coefficients and
  its own seeded scatter of the step times, as wide as the trace's steps scatter around the
  fitted model (``TwinFit.step_noise``: the relative RMS residual of their elapsed times).
  Near the knee an open loop's preemptions swing with a few steps' timing, on the real server
  as in the twin; the replays show how far, and the verdict reads the measured preemptions
  against their range.

``ttft_offset`` (what the client and API server add to every first token) is fitted on the
levels' mean TTFT with the step time from the trace, at the point coefficients; every draw
keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.twin.fit import PARAMETERS, FitRefused, TwinFit
from kvpressure.twin.simulate import simulate_level
from kvpressure.twin.step_time import COEFFICIENTS
from kvpressure.twin.step_trace import (
    StepTraceFit,
    fit_step_trace,
    level_windows,
    ttft_offset,
)
from kvpressure.twin.workload import LevelWorkload

BAND_DRAWS = 12
"""Replays simulated for an interval (the first bootstrap draws: they are independent)."""
MAX_NOISE = 0.5
"""The step-time scatter replays use at most (a trace the model fits badly is no measure of
its noise)."""


def fit_open_loop(steps: pd.DataFrame | None, measured_levels: pd.DataFrame,
                  settings: Mapping[str, Any], workloads: Mapping[float, LevelWorkload], *,
                  priors: Mapping[str, float] | None = None, prior_source: str = "profile",
                  bootstrap: int = 200, seed: int = 0) -> TwinFit:
    """The open-loop twin's fit: the step time from the trace inside the levels' windows, then
    ``ttft_offset`` from the levels simulated with it (see the module docstring)."""
    if steps is None:
        raise FitRefused(
            "an open loop's step time is fitted on the server's own steps, and there is no "
            "step trace: start vLLM with --enable-logging-iteration-details and give its log "
            "(kvpressure twin --server-log LOG, or kvpressure ingest it with the bench results "
            "and the scrape log). In an open loop the "
            "scheduler's decisions move with the step time, so the per-rate aggregates cannot "
            "fit it alone; closed loops (vllm bench serve --max-concurrency C) can")
    trace = fit_step_trace(steps, windows=level_windows(measured_levels), priors=priors,
                           prior_source=prior_source, bootstrap=bootstrap, seed=seed)
    return _with_offset(trace, measured_levels, settings, workloads)


def _with_offset(trace: StepTraceFit, measured_levels: pd.DataFrame,
                 settings: Mapping[str, Any], workloads: Mapping[float, LevelWorkload]
                 ) -> TwinFit:
    coef = {p: trace.theta[p] for p in COEFFICIENTS}
    sims = {}
    for _, m in measured_levels.iterrows():
        x = float(m["request_rate"])
        if x in workloads:
            sims[x] = simulate_level(settings, workloads[x], coef)
    pairs = [(float(m["ttft_mean_s"]), sims[float(m["request_rate"])]["ttft_mean_s"])
             for _, m in measured_levels.iterrows()
             if float(m["request_rate"]) in sims and m["ttft_mean_s"] > 0]
    offset, src = 0.0, "default 0 (no TTFT measured)"
    if pairs:
        offset = float(ttft_offset(np.array([a for a, _ in pairs]),
                                   np.array([b for _, b in pairs]))[0])
        src = ("fitted (on the levels' mean TTFT, the step time from the trace, at the point "
               "coefficients)")
    theta = {**trace.theta, "ttft_offset": offset}
    source = {**trace.source, "ttft_offset": src}
    samples = (np.column_stack([trace.samples, np.full(len(trace.samples), offset)])
               if len(trace.samples) else np.empty((0, len(PARAMETERS))))
    interval = {**trace.interval, "ttft_offset": (offset, offset)}
    rows = []
    for _, m in measured_levels.iterrows():
        x = float(m["request_rate"])
        if x not in sims:
            continue
        s = sims[x]
        got = {"time_per_output_token": (1.0 / m["output_throughput"],
                                         1.0 / s["output_throughput"]),
               "itl_mean_s": (m["itl_mean_s"], s["itl_mean_s"]),
               "ttft_mean_s": (m["ttft_mean_s"], s["ttft_mean_s"] + offset)}
        for stat, (mv, tv) in got.items():
            if isinstance(mv, float) and math.isfinite(mv) and mv > 0:
                rows.append({"request_rate": x, "stat": stat, "measured": float(mv),
                             "twin": float(tv), "error_pct": 100.0 * (tv - mv) / mv})
    table = pd.DataFrame(rows, columns=["request_rate", "stat", "measured", "twin",
                                        "error_pct"])
    free = [p for p in PARAMETERS if source[p].startswith(("step trace", "fitted"))]
    notes = [f"step time from the server's step trace: {trace.steps} steps, relative RMS "
             f"residual of the elapsed time {100 * trace.residual_rel:.0f}%", *trace.notes,
             "open loop: the TTFT offset is fitted at the point coefficients and kept by "
             f"every draw; intervals come from {BAND_DRAWS} replays, each simulated"]
    noise = min(trace.residual_rel, MAX_NOISE)
    notes.append(f"replays scatter each step's time by {100 * noise:.0f}% (log-normal), the "
                 "spread of the traced steps around the fitted model")
    return TwinFit(theta, source, free, interval, samples, table, {},
                   sorted(sims), notes, noise)


def simulated_draws(settings: Mapping[str, Any], workload: LevelWorkload, fit: TwinFit,
                    n: int = BAND_DRAWS) -> list[dict[str, Any]]:
    """The level replayed ``n`` times: the ``i``-th with the ``i``-th bootstrap draw of the
    coefficients and step-time scatter seeded ``i + 1`` (the same seeds for every setting, so
    a remedy's change is read draw by draw)."""
    out = []
    k = len(COEFFICIENTS)
    for i, row in enumerate(fit.samples[:n]):
        coef = dict(zip(COEFFICIENTS, row[:k].tolist(), strict=True))
        out.append(simulate_level(settings, workload, coef, float(row[k]),
                                  noise=fit.step_noise, seed=i + 1))
    return out
