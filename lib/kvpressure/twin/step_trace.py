"""The twin's step time fitted on the server's own steps (vLLM's iteration-details log).

Where the level fit (``fit.py``) has a handful of per-level aggregates, a server started with
``--enable-logging-iteration-details`` logs every engine step: its prefill tokens, its decoding
requests and its elapsed time (``ingestion.iteration_log``). Two fits, both non-negative least
squares on the step's work (``1``, ``num_prefill_tokens``, ``num_decode_tokens``: one token per
decoding sequence):

* **the logged elapsed time** of each step, a few thousand rows: vLLM times only the wait for the
  model's output, so this is the forward pass;
* **what the elapsed time leaves out** (scheduling, output processing, the frontend's share of
  the cores): per second of the log in which the engine was busy throughout (the seconds before
  and after it have steps too), ``1 s - sum(elapsed)`` over its steps is the same linear form
  summed over them. Fitted on those seconds and added to the first fit, the coefficients
  price the step *period*, which is what the twin's clock advances by.

The log gives no context lengths, so ``t_decode_ctx`` and ``t_prefill_attn`` are not fitted
(the profile's roofline where a profile is given, else 0; the twin says which). Uncertainty: a
bootstrap over steps and busy seconds together (drawn with replacement, refitted, seeded).
:func:`twin_fit` turns the result into the ``TwinFit`` the twin predicts with; only
``ttft_offset`` (the client and API server's share of TTFT) is then fitted on the levels.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.twin.basis import LevelBasis
from kvpressure.twin.fit import (
    MIN_UNIQUE,
    PARAMETERS,
    FitRefused,
    TwinFit,
    bootstrap_intervals,
    design,
    solve_nonnegative,
    uniqueness,
)
from kvpressure.twin.step_time import COEFFICIENTS

TRACED = ("t0", "t_prefill_token", "t_decode_seq")
MIN_STEPS = 30
MIN_BUSY_SECONDS = 3


@dataclass
class StepTraceFit:
    theta: dict[str, float]
    """The five step-time coefficients (seconds per unit of work)."""
    source: dict[str, str]
    interval: dict[str, tuple[float, float]]
    samples: np.ndarray
    """(B, len(COEFFICIENTS)) bootstrap draws."""
    elapsed: dict[str, float]
    """The forward-pass part (fit of the logged elapsed time alone)."""
    outside: dict[str, float]
    """The part outside the logged elapsed time (fit on the busy seconds)."""
    steps: int
    busy_seconds: int
    residual_rel: float
    """Relative RMS residual of the elapsed fit (RMS / mean elapsed)."""
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {p: {"value": self.theta[p], "p05": self.interval[p][0],
                    "p95": self.interval[p][1], "source": self.source[p],
                    "elapsed_part": self.elapsed.get(p, 0.0),
                    "outside_part": self.outside.get(p, 0.0)}
                for p in COEFFICIENTS}


def _features(frame: pd.DataFrame) -> np.ndarray:
    return np.column_stack([np.ones(len(frame)),
                            frame["num_prefill_tokens"].to_numpy(float),
                            frame["num_decode_tokens"].to_numpy(float)])


def busy_seconds(steps: pd.DataFrame) -> pd.DataFrame:
    """Per second of the log in which the engine never fell idle: the number of steps, their
    summed work and summed elapsed time.

    A second counts when the seconds on both sides have steps too, and no step in it, nor the
    first step of the next second, may have followed an idle engine. The engine idles only
    with no request at all, so a step with a *generation* request (one that was in the engine
    before it: decoding, or resumed after a preemption) followed a busy engine; a step of
    context requests alone may be the first after a wait for arrivals (an open loop's gaps, a
    lone client's turnaround), whose idle time would otherwise be priced as step overhead."""
    sec = np.floor(steps["t"].to_numpy(float)).astype(np.int64)
    may_idle = (steps["generation_requests"].to_numpy() == 0
                if "generation_requests" in steps else np.zeros(len(steps), dtype=bool))
    g = pd.DataFrame({"second": sec, "n": 1, "prefill": steps["num_prefill_tokens"].to_numpy(),
                      "decode": steps["num_decode_tokens"].to_numpy(),
                      "elapsed": steps["elapsed_s"].to_numpy(float), "may_idle": may_idle})
    per = g.groupby("second").agg(n=("n", "sum"), prefill=("prefill", "sum"),
                                  decode=("decode", "sum"), elapsed=("elapsed", "sum"),
                                  may_idle=("may_idle", "any"))
    opens_idle = g.groupby("second")["may_idle"].first()
    have = set(per.index)
    inner = [s for s in per.index if s - 1 in have and s + 1 in have
             and not per.at[s, "may_idle"] and not opens_idle.at[s + 1]]
    return per.loc[inner].drop(columns="may_idle").reset_index()


def fit_step_trace(steps: pd.DataFrame, *, windows: list[tuple[float, float]] | None = None,
                   priors: Mapping[str, float] | None = None, prior_source: str = "profile",
                   bootstrap: int = 200, seed: int = 0) -> StepTraceFit:
    """Fit the step-time coefficients on ``steps`` (``iteration_log.iteration_steps``), only
    those inside ``windows`` (unix ``(start, end)`` pairs: the measured levels) when given."""
    from kvpressure.ingestion.iteration_log import in_window

    work = steps[~steps["dummy"] & ((steps["num_prefill_tokens"] + steps["num_decode_tokens"])
                                    > 0)]
    if windows:
        work = pd.concat([in_window(work, a, b) for a, b in windows]).drop_duplicates("line")
    if len(work) < MIN_STEPS:
        raise FitRefused(f"the step trace has {len(work)} step(s) inside the measured levels' "
                         f"time windows: at least {MIN_STEPS} are needed to fit the step time "
                         "on them (is the server log from the same run?)")
    notes: list[str] = []
    a = _features(work)
    y = work["elapsed_s"].to_numpy(float)
    distinct = uniqueness(a)
    keep = [j for j in range(3) if distinct[j] >= MIN_UNIQUE]
    if 0 not in keep:
        raise FitRefused("the step trace cannot tell the per-step cost from the per-token and "
                         "per-sequence ones (its steps all have the same mix of work)")
    theta = dict.fromkeys(COEFFICIENTS, 0.0)
    source = dict.fromkeys(COEFFICIENTS, "")
    for j, p in enumerate(TRACED):
        if j not in keep:
            why = f"the traced steps never vary its work apart from the others ({p})"
            theta[p] = float((priors or {}).get(p, 0.0))
            source[p] = (f"{prior_source} (not identifiable: {why})" if priors and p in priors
                         else f"default 0 (not identifiable: {why}; no profile)")
    for p in ("t_decode_ctx", "t_prefill_attn"):
        why = "the iteration log gives no context lengths"
        theta[p] = float((priors or {}).get(p, 0.0))
        source[p] = (f"{prior_source} (not in the step trace: {why})" if priors and p in priors
                     else f"default 0 (not in the step trace: {why}; no profile)")
    x_el = solve_nonnegative(a[:, keep], y)
    resid = y - a[:, keep] @ x_el
    residual_rel = float(np.sqrt(np.mean(resid ** 2)) / np.mean(y)) if np.mean(y) > 0 else 0.0

    busy = busy_seconds(work)
    if windows:
        # A second is busy only if the whole second lies inside a level (its steps were kept).
        busy = busy[[any(a_ <= s and s + 1 <= b_ for a_, b_ in windows)
                     for s in busy["second"]]]
    b_rows = busy[["n", "prefill", "decode"]].to_numpy(float)[:, keep]
    gap = 1.0 - busy["elapsed"].to_numpy(float)
    out_idx: list[int] = []
    if len(busy) < MIN_BUSY_SECONDS:
        x_out = np.zeros(len(keep))
        notes.append(f"only {len(busy)} second(s) of the log are busy throughout: the time "
                     "outside the logged elapsed time is not fitted (taken as 0), so the step "
                     "period is underestimated by the scheduling and output processing")
    else:
        # Seconds sum many steps: their per-step and per-sequence parts move apart only where
        # the batch size changes between seconds (between levels); a term they cannot tell
        # apart from the others is left out of this part.
        sub = [k for k, d in enumerate(uniqueness(b_rows)) if d >= MIN_UNIQUE or k == 0]
        x_out = np.zeros(len(keep))
        x_out[sub] = solve_nonnegative(b_rows[:, sub], gap)
        b_rows = b_rows[:, sub]
        out_idx = sub
    for k, j in enumerate(keep):
        theta[TRACED[j]] = float(x_el[k] + x_out[k])
        source[TRACED[j]] = (f"step trace ({len(work)} steps' elapsed time, {len(busy)} busy "
                             "seconds for the time outside it)")

    rng = np.random.default_rng(seed)
    draws = np.tile(np.array([theta[p] for p in COEFFICIENTS]), (max(bootstrap, 0), 1))
    cols = [COEFFICIENTS.index(TRACED[j]) for j in keep]
    for b in range(max(bootstrap, 0)):
        pick = rng.integers(0, len(work), size=len(work))
        xb = solve_nonnegative(a[pick][:, keep], y[pick])
        if out_idx:
            sp = rng.integers(0, len(busy), size=len(busy))
            xb[out_idx] += solve_nonnegative(b_rows[sp], gap[sp])
        draws[b, cols] = xb
    interval = bootstrap_intervals(draws, COEFFICIENTS, {COEFFICIENTS[i] for i in cols}, theta)
    gaps = np.diff(work["iteration"].to_numpy())
    skipped = int(np.sum(gaps[gaps > 1] - 1)) if len(gaps) else 0
    if skipped:
        notes.append(f"{skipped} iteration index(es) missing between the traced steps (steps "
                     "without tokens, or lines outside the levels)")
    return StepTraceFit(theta, source, interval, draws,
                        {TRACED[j]: float(x_el[k]) for k, j in enumerate(keep)},
                        {TRACED[j]: float(x_out[k]) for k, j in enumerate(keep)},
                        len(work), len(busy), residual_rel, notes)


def ttft_offset(measured: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """The constant added to every predicted mean TTFT that minimises the squared relative
    errors against ``measured`` (rows), at least 0; ``predicted`` (rows, draws) gives one
    offset per draw."""
    w = 1.0 / np.asarray(measured, float)[:, None]
    pred = np.asarray(predicted, float).reshape(len(w), -1)
    return np.maximum(0.0, (w * (1.0 - pred * w)).sum(0) / (w * w).sum(0))


def twin_fit(trace: StepTraceFit, measured_levels: pd.DataFrame,
             bases: Mapping[int, LevelBasis]) -> TwinFit:
    """The twin's fit with the step time from the trace; ``ttft_offset`` (a constant added to
    every TTFT) is the one parameter fitted on the levels, by least squares on the relative
    TTFT errors, at least 0."""
    rows = design(measured_levels, bases)
    coef = np.array([trace.theta[p] for p in COEFFICIENTS])
    tt = rows[rows["stat"] == "ttft_mean_s"]
    offset, src = 0.0, "default 0 (no TTFT measured)"
    offsets = np.zeros(len(trace.samples))
    if len(tt):
        core = tt[list(COEFFICIENTS)].to_numpy(float)
        y = tt["y"].to_numpy(float)

        def solve(c: np.ndarray) -> np.ndarray:
            return ttft_offset(y, core @ np.atleast_2d(c).T)

        offset = float(solve(coef)[0])
        src = "fitted (on the levels' mean TTFT, the step time from the trace)"
        if len(trace.samples):
            offsets = solve(trace.samples)
    theta = {**trace.theta, "ttft_offset": offset}
    source = {**trace.source, "ttft_offset": src}
    samples = np.column_stack([trace.samples, offsets]) if len(trace.samples) else (
        np.empty((0, len(PARAMETERS))))
    interval = {**trace.interval}
    interval["ttft_offset"] = ((float(np.percentile(offsets, 5)),
                                float(np.percentile(offsets, 95))) if len(offsets) and len(tt)
                               else (offset, offset))
    vec = np.array([theta[p] for p in PARAMETERS])
    table = rows[["concurrency", "stat", "y"]].rename(columns={"y": "measured"}).copy()
    table["twin"] = rows[list(PARAMETERS)].to_numpy(float) @ vec
    table["error_pct"] = 100.0 * (table["twin"] - table["measured"]) / table["measured"]
    free = [p for p in PARAMETERS if source[p].startswith(("step trace", "fitted"))]
    levels = sorted(int(c) for c in rows["concurrency"].unique())
    notes = [f"step time from the server's step trace: {trace.steps} steps, relative RMS "
             f"residual of the elapsed time {100 * trace.residual_rel:.0f}%", *trace.notes]
    if not math.isfinite(offset):  # pragma: no cover - y > 0 is guaranteed by design()
        raise FitRefused("the TTFT offset is not finite")
    return TwinFit(theta, source, free, interval, samples, table,
                   {}, levels, notes)


SERVER_LOG = "server.log"


def find_step_trace(run_dir: Path, server_log: str | Path | None = None,
                    near: float | None = None, ingested: Sequence[Path] = ()
                    ) -> pd.DataFrame | None:
    """The server's step trace: from ``server_log`` when given (it must exist), else from
    ``server.log`` in ``run_dir`` or its parent (a sweep folder whose ``report/`` was passed),
    else from the first of the server logs the run was ingested from (``ingested``: a log
    given to ``report --source``) that has iteration details; None when there is no log or it
    has no iteration-details line.

    vLLM's log lines carry no year. ``near`` (unix time of the first measured level) sets it:
    a log copied or checked out later has a modification time that says nothing of when it
    was written. The server started before the measurement, so a first step after ``near``
    (by more than a day, the slack for a log written in another zone) means the log began the
    year before."""
    from kvpressure.errors import InputError

    if server_log is not None:
        path = Path(server_log)
        if not path.is_file():
            raise InputError(f"--server-log {path}: no such file")
    else:
        found = [p / SERVER_LOG for p in (run_dir, run_dir.parent)
                 if (p / SERVER_LOG).is_file()]
        for path in [*found[:1], *(p for p in ingested if p.is_file())]:
            steps = _read_steps(path, near)
            if len(steps):
                return steps
        return None
    steps = _read_steps(path, near)
    return steps if len(steps) else None


def _read_steps(path: Path, near: float | None) -> pd.DataFrame:
    from kvpressure.ingestion.iteration_log import iteration_steps

    if near is None or not math.isfinite(near):
        return iteration_steps(path)
    year = _dt.datetime.fromtimestamp(near).year
    steps = iteration_steps(path, year=year)
    if len(steps) and steps["t"].iloc[0] > near + 86400.0:
        steps = iteration_steps(path, year=year - 1)
    return steps


def level_windows(levels: pd.DataFrame) -> list[tuple[float, float]]:
    """The measured levels' ``(t_start, t_end)`` unix windows; refused when none has one."""
    windows = [(float(r["t_start"]), float(r["t_end"])) for _, r in levels.iterrows()
               if math.isfinite(r["t_start"]) and math.isfinite(r["t_end"])]
    if not windows:
        raise FitRefused("the measured levels have no start and end times, so the server's "
                         "step trace cannot be matched to them")
    return windows


def fit_on_levels(steps: pd.DataFrame, measured_levels: pd.DataFrame,
                  bases: Mapping[int, LevelBasis], *, priors: Mapping[str, float] | None = None,
                  prior_source: str = "profile", bootstrap: int = 200, seed: int = 0
                  ) -> TwinFit:
    """The twin's fit from the steps logged inside the measured levels' windows."""
    trace = fit_step_trace(steps, windows=level_windows(measured_levels), priors=priors,
                           prior_source=prior_source, bootstrap=bootstrap, seed=seed)
    return twin_fit(trace, measured_levels, bases)
