"""Fit the twin's step-time coefficients to a measured curve, with bootstrap uncertainty.

Per level, each measured time statistic is a linear function of the coefficients (``basis.py``):

* ``time_per_output_token`` = duration / output tokens (the throughput; weighted double);
* ``itl_mean_s`` (or ``tpot_mean_s`` when the ITL is missing);
* ``ttft_mean_s``, plus a constant ``ttft_offset``: what the client and API server add to every
  request's first token (tokenization, HTTP), outside the engine loop the twin models;
* ``prefill_time_mean_s`` and ``decode_time_mean_s`` (``vllm:request_prefill_time_seconds``,
  ``vllm:request_decode_time_seconds``) where the scrapes cover the level.

Rows are relative (each divided by its measured value) and solved by non-negative least
squares. Before fitting, each coefficient's column must carry information the others do not:
the part of it outside their span must be at least ``MIN_UNIQUE`` of its length. When one is
not, a second-order term it is confounded with is fixed first (``DROP_FIRST``), else the
coefficient itself, one at a time; a fixed coefficient is set from the profile's roofline
(``step_time.profile_priors``) or, without a profile, to 0; the twin says which. Too few
levels is refused outright. The uncertainty is a bootstrap over levels: the levels are drawn
with replacement and the free coefficients refitted, ``bootstrap`` times, seeded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.twin.basis import LevelBasis
from kvpressure.twin.step_time import COEFFICIENTS

PARAMETERS = (*COEFFICIENTS, "ttft_offset")
MIN_LEVELS = 3
MIN_UNIQUE = 0.03
# Which parameter gives way first when two cannot be told apart: second-order terms before
# the primary per-token, per-sequence and per-step costs.
DROP_FIRST = ("t_prefill_attn", "t_decode_ctx", "ttft_offset", "t_prefill_token",
              "t_decode_seq", "t0")
ROW_WEIGHTS = {"time_per_output_token": 2.0, "itl_mean_s": 1.0, "tpot_mean_s": 1.0,
               "ttft_mean_s": 1.0, "prefill_time_mean_s": 1.0, "decode_time_mean_s": 1.0}


class FitRefused(InputError):
    """The data cannot support a fit (too few levels, no throughput)."""


@dataclass
class TwinFit:
    theta: dict[str, float]
    source: dict[str, str]
    """Per parameter: ``fitted``, ``profile (...)`` or ``default 0 (...)``."""
    free: list[str]
    interval: dict[str, tuple[float, float]]
    """5th and 95th percentile of the bootstrap, per parameter (fixed ones: the value)."""
    samples: np.ndarray
    """(B, len(PARAMETERS)) bootstrap draws, the fixed parameters constant."""
    rows: pd.DataFrame
    """One row per fitted statistic and level: measured, fitted, error %."""
    uniqueness: dict[str, float]
    levels: list[Any]
    notes: list[str] = field(default_factory=list)
    step_noise: float = 0.0
    """Relative scatter of the server's step times around the model's (an open loop's draws
    replay with it; 0 where it is not measured or does not matter)."""
    throughput_leverage: dict[Any, float] | None = None
    """Per fitted level, the leverage of its throughput row in the fit (``row_leverage``):
    how much of that level's own measurement the fitted curve took up, so how much its
    scatter around the twin understates the level's noise (``noise.run_to_run_noise``).
    None where the fit is not a least-squares fit on the levels' rows."""

    def vector(self) -> np.ndarray:
        return np.array([self.theta[p] for p in PARAMETERS])

    def step_coefficients(self) -> dict[str, float]:
        return {k: self.theta[k] for k in COEFFICIENTS}

    def describe(self) -> dict[str, Any]:
        from kvpressure.twin.step_time import UNITS

        return {p: {"value": self.theta[p], "p05": self.interval[p][0],
                    "p95": self.interval[p][1], "source": self.source[p],
                    "unit": UNITS.get(p, "s per request (client and API server)"),
                    "uniqueness": self.uniqueness.get(p)}
                for p in PARAMETERS}


def _stat_row(basis: LevelBasis, stat: str) -> np.ndarray:
    """The stat's coefficients over ``PARAMETERS`` (the last one is ``ttft_offset``)."""
    if stat == "time_per_output_token":
        core = basis.duration / basis.output_tokens
    elif stat in ("itl_mean_s", "tpot_mean_s"):
        core = basis.itl_mean
    elif stat == "ttft_mean_s":
        core = basis.ttft.mean(axis=0)
    elif stat == "prefill_time_mean_s":
        core = basis.prefill_time.mean(axis=0)
    elif stat == "decode_time_mean_s":
        core = basis.decode_time.mean(axis=0)
    else:  # pragma: no cover - the stats are this module's own
        raise KeyError(stat)
    return np.append(core, 1.0 if stat == "ttft_mean_s" else 0.0)


def design(measured_levels: pd.DataFrame, bases: Mapping[int, LevelBasis]) -> pd.DataFrame:
    """One row per (level, statistic) the data has: ``concurrency, stat, y, weight`` and one
    column per parameter."""
    out = []
    for _, m in measured_levels.iterrows():
        c = int(m["concurrency"])
        if c not in bases:
            continue
        b = bases[c]
        wanted = {"time_per_output_token": 1.0 / m["output_throughput"]
                  if m["output_throughput"] > 0 else math.nan}
        for stat in ("itl_mean_s", "ttft_mean_s", "prefill_time_mean_s", "decode_time_mean_s"):
            wanted[stat] = m[stat]
        if not (m["itl_mean_s"] > 0) and m["tpot_mean_s"] > 0:
            wanted["tpot_mean_s"] = m["tpot_mean_s"]
        for stat, y in wanted.items():
            if isinstance(y, float) and math.isfinite(y) and y > 0:
                row = {"concurrency": c, "stat": stat, "y": float(y),
                       "weight": ROW_WEIGHTS[stat]}
                row.update(zip(PARAMETERS, _stat_row(b, stat), strict=True))
                out.append(row)
    return pd.DataFrame(out, columns=["concurrency", "stat", "y", "weight", *PARAMETERS])


def uniqueness(a: np.ndarray) -> np.ndarray:
    """Per column: length of its part outside the span of the other columns / its length."""
    norms = np.linalg.norm(a, axis=0)
    out = np.zeros(a.shape[1])
    for j in range(a.shape[1]):
        if norms[j] == 0:
            continue
        others = np.delete(a, j, axis=1)
        if others.shape[1] == 0:
            out[j] = 1.0
            continue
        coef, *_ = np.linalg.lstsq(others, a[:, j], rcond=None)
        out[j] = float(np.linalg.norm(a[:, j] - others @ coef) / norms[j])
    return out


def _to_drop(full: np.ndarray, free: list[str], worst: int, u: np.ndarray) -> str:
    """Which parameter to fix when ``free[worst]`` is not distinct enough: of the ones that
    rank below it (``DROP_FIRST``), the first whose removal makes it distinct; else itself. A
    primary cost confounded with a second-order one keeps the primary one."""
    rank = {p: i for i, p in enumerate(DROP_FIRST)}
    for cand in sorted(free, key=rank.__getitem__):
        if rank[cand] >= rank[free[worst]]:
            break
        rest = [p for p in free if p != cand]
        u2 = uniqueness(full[:, [PARAMETERS.index(p) for p in rest]])
        if u2[rest.index(free[worst])] >= MIN_UNIQUE:
            return cand
    return free[worst]


def row_leverage(a: np.ndarray) -> np.ndarray:
    """Each row's leverage in the least-squares fit on the columns of ``a``: the diagonal of
    the hat matrix ``a pinv(a)``, what the fitted value at a row moves per unit of its own
    measurement. They sum to the rank of ``a``: the degrees of freedom the fit spent."""
    if a.size == 0:
        return np.zeros(a.shape[0])
    return np.einsum("ij,ji->i", a, np.linalg.pinv(a))


def solve_nonnegative(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on columns scaled to unit length (coefficients that differ by
    orders of magnitude, seconds per step against seconds per token, converge alike)."""
    from scipy.optimize import nnls

    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(a / scale, y, maxiter=50 * a.shape[1])
    return x / scale


def bootstrap_intervals(draws: np.ndarray, names: Sequence[str], varied: set[str],
                        theta: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """The 5-95% interval of each name's column of bootstrap ``draws``; a name the bootstrap did
    not vary (fixed, or no draws) gets its point value at both ends."""
    interval = {}
    for j, p in enumerate(names):
        if p in varied and len(draws):
            lo, hi = np.percentile(draws[:, j], [5, 95])
            interval[p] = (float(lo), float(hi))
        else:
            interval[p] = (theta[p], theta[p])
    return interval


def fit_step_time(measured_levels: pd.DataFrame, bases: Mapping[int, LevelBasis], *,
                  priors: Mapping[str, float] | None = None, prior_source: str = "profile",
                  bootstrap: int = 200, seed: int = 0, min_levels: int = MIN_LEVELS,
                  fixed: Mapping[str, float] | None = None) -> TwinFit:
    """Fit ``PARAMETERS`` to the measured levels; see the module docstring.

    ``priors`` (from ``step_time.profile_priors``) stand in for coefficients the data cannot
    identify; ``fixed`` pins parameters to given values (never fitted).
    """
    rows = design(measured_levels, bases)
    levels = sorted(rows.loc[rows["stat"] == "time_per_output_token", "concurrency"].unique())
    if len(levels) < min_levels:
        have = ", ".join(str(int(c)) for c in levels) or "none"
        raise FitRefused(
            f"the twin's step time cannot be fitted from {len(levels)} level(s) with a measured "
            f"throughput (concurrency {have}): it needs at least {min_levels}, so that the "
            "per-step, per-token and per-sequence costs can be told apart and the fit checked "
            "across levels")
    rows = rows[rows["concurrency"].isin(levels)].reset_index(drop=True)
    notes: list[str] = []
    theta: dict[str, float] = {}
    source: dict[str, str] = {}
    free = [p for p in PARAMETERS if p not in (fixed or {})]
    for p, v in (fixed or {}).items():
        theta[p], source[p] = float(v), "given"
    if "ttft_mean_s" not in set(rows["stat"]) and "ttft_offset" in free:
        free.remove("ttft_offset")
        theta["ttft_offset"], source["ttft_offset"] = 0.0, "default 0 (no TTFT measured)"
    w = (rows["weight"] / rows["y"]).to_numpy(float)
    y_rel = rows["weight"].to_numpy(float)
    full = rows[list(PARAMETERS)].to_numpy(float) * w[:, None]
    uniq_all: dict[str, float] = {}
    while free:
        idx = [PARAMETERS.index(p) for p in free]
        u = uniqueness(full[:, idx])
        for p, v in zip(free, u, strict=True):
            uniq_all[p] = float(v)
        worst = int(np.argmin(u))
        too_many = len(free) >= len(rows)
        if u[worst] >= MIN_UNIQUE and not too_many:
            break
        drop = _to_drop(full, free, worst, u) if not too_many else free[-1]
        k = free.index(drop)
        free.pop(k)
        why = ("the data never exercises it" if u[k] == 0 else
               "more unknowns than measured statistics" if too_many else
               f"only {100 * u[k]:.1f}% of its effect is distinct from the other terms"
               if k == worst else
               f"it cannot be told apart from {free[worst if worst < k else worst - 1]}")
        if priors and drop in priors:
            theta[drop], source[drop] = float(priors[drop]), (
                f"{prior_source} (not identifiable: {why})")
        else:
            theta[drop], source[drop] = 0.0, f"default 0 (not identifiable: {why}; no profile)"
    if not free or "t0" not in free and "t_decode_seq" not in free:
        raise FitRefused("the measured levels identify neither the per-step nor the "
                         "per-sequence cost: no step time can be fitted from them")
    fixed_vec = np.array([theta.get(p, 0.0) if p not in free else 0.0 for p in PARAMETERS])
    idx = [PARAMETERS.index(p) for p in free]
    target = y_rel - full @ fixed_vec
    x = solve_nonnegative(full[:, idx], target)
    for p, v in zip(free, x, strict=True):
        theta[p], source[p] = float(v), "fitted"
    # The fit spent a degree of freedom on each coefficient off its bound of 0 (a coefficient
    # held at 0 fits nothing): the leverage of the throughput rows on those columns.
    active = [idx[i] for i, v in enumerate(x) if v > 0]
    lev = row_leverage(full[:, active])
    thr_rows = np.flatnonzero((rows["stat"] == "time_per_output_token").to_numpy())
    throughput_leverage = {int(rows["concurrency"].iloc[i]): float(lev[i]) for i in thr_rows}
    # Bootstrap over levels.
    rng = np.random.default_rng(seed)
    conc = rows["concurrency"].to_numpy()
    by_level = [np.nonzero(conc == c)[0] for c in levels]
    draws = np.tile(np.array([theta[p] for p in PARAMETERS]), (max(bootstrap, 0), 1))
    for b in range(max(bootstrap, 0)):
        pick = rng.integers(0, len(levels), size=len(levels))
        sel = np.concatenate([by_level[i] for i in pick])
        xb = solve_nonnegative(full[sel][:, idx], target[sel])
        draws[b, idx] = xb
    interval = bootstrap_intervals(draws, PARAMETERS, set(free), theta)
    vec = np.array([theta[p] for p in PARAMETERS])
    fitted = rows[list(PARAMETERS)].to_numpy(float) @ vec
    table = rows[["concurrency", "stat", "y"]].rename(columns={"y": "measured"}).copy()
    table["twin"] = fitted
    table["error_pct"] = 100.0 * (fitted - table["measured"]) / table["measured"]
    if len(levels) < 2 * len(free):
        notes.append(f"{len(levels)} levels for {len(free)} fitted parameters: the bootstrap "
                     "over levels is coarse, read its intervals as indicative")
    return TwinFit(theta, source, free, interval, draws, table, uniq_all,
                   [int(c) for c in levels], notes, throughput_leverage=throughput_leverage)
