"""Paired rounds: a baseline and its remedy measured back to back, the change read per round.

The machine's speed drifts between runs by as much as a small remedy changes throughput. Run
both arms at a level back to back, once per round, and a drift slower than a round cancels in
that round's own change (remedy over baseline); the order of the arms rotates from one round
(and level) to the next, so a drift within a round cancels over the rounds too. The change is
the mean over the rounds with its two-sided Student-t interval (``paired_change``); it has a
sign only when the interval excludes 0.

A prediction held when the measured interval covers it, when the measured mean falls inside
the prediction's own interval (the band the twin claimed, coefficients, length draws and noise)
with a measured sign that agrees, or when the two agree within ``HELD_TOLERANCE_PP`` points with
the same sign. A measured interval that holds 0 is "no measurable effect", whatever the mean's
sign.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvpressure.twin.validation import paired_change

HELD_TOLERANCE_PP = 10.0
NO_EFFECT = "no measurable effect"


def arm_order(arms: Sequence[str], round_index: int, level_index: int = 0) -> list[str]:
    """The arms in the order they run at one level of one round: rotated by one each round
    and each level, so every arm runs first equally often."""
    arms = list(arms)
    shift = (round_index + level_index) % len(arms)
    return arms[shift:] + arms[:shift]


def plan(levels: Sequence[int], rounds: int, arms: Sequence[str],
         start_round: int = 0) -> list[tuple[int, int, str]]:
    """``(round, level, arm)`` in the order they run, for rounds ``start_round`` to
    ``rounds - 1``."""
    return [(r, c, arm) for r in range(start_round, rounds)
            for k, c in enumerate(levels) for arm in arm_order(arms, r, k)]


def paired_values(runs: Sequence[Mapping[str, Any]], level: int, baseline: str, remedy: str,
                  column: str = "output_throughput") -> tuple[list[float], list[float], list[int]]:
    """The rounds at ``level`` where both arms finished: ``(baseline values, remedy values,
    rounds)``, in round order. A round with one arm missing (stopped part way) is no pair."""
    by: dict[tuple[int, str], float] = {}
    for run in runs:
        if run["concurrency"] == level and run.get(column) is not None:
            by[(int(run["round"]), str(run["arm"]))] = float(run[column])
    rounds = sorted({r for r, arm in by if arm == baseline} & {r for r, arm in by if arm == remedy})
    return [by[(r, baseline)] for r in rounds], [by[(r, remedy)] for r in rounds], rounds


def measured_change(runs: Sequence[Mapping[str, Any]], level: int, baseline: str = "baseline",
                    remedy: str = "remedy", confidence: float = 0.95) -> dict[str, Any]:
    """The remedy's change in output throughput at ``level`` over the paired rounds: mean %,
    its Student-t interval, the sign when the interval excludes 0, the rounds used."""
    base, rem, rounds = paired_values(runs, level, baseline, remedy)
    out = paired_change(base, rem, confidence)
    out["rounds"] = rounds
    lo, hi = out["interval_pct"]
    out["effect"] = (None if not (math.isfinite(lo) and math.isfinite(hi))
                     else NO_EFFECT if out["sign"] is None
                     else "raises" if out["sign"] > 0 else "lowers")
    return out


def prediction_held(measured: Mapping[str, Any], predicted_pct: float,
                    predicted_interval: Sequence[float] | None = None,
                    tolerance_pp: float = HELD_TOLERANCE_PP) -> tuple[bool | None, str]:
    """Whether a predicted change held against a measured one (module docstring), with why.
    ``None`` when fewer than two rounds give no interval."""
    mean = float(measured["mean_pct"])
    lo, hi = (float(x) for x in measured["interval_pct"])
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(predicted_pct)):
        return None, "not known: an interval needs at least two paired rounds"
    if lo <= predicted_pct <= hi:
        return True, "the measured interval covers the prediction"
    sign = measured.get("sign")
    if predicted_interval is not None and sign is not None:
        p_lo, p_hi = (float(x) for x in predicted_interval)
        if p_lo <= mean <= p_hi and (sign > 0) == (predicted_pct > 0):
            return True, (f"the measured {mean:+.1f}% lies inside the predicted interval "
                          f"({p_lo:+.1f} to {p_hi:+.1f})")
    near = abs(mean - predicted_pct) <= tolerance_pp
    same_sign = (mean > 0) == (predicted_pct > 0) and mean != 0 and predicted_pct != 0
    if near and same_sign:
        return True, f"within {tolerance_pp:g} points of the prediction, with its sign"
    if sign is None:
        return False, (f"{NO_EFFECT} measured (the interval holds 0), the twin predicted "
                       f"{predicted_pct:+.1f}%")
    return False, (f"measured {mean:+.1f}% is {abs(mean - predicted_pct):.1f} points from the "
                   f"predicted {predicted_pct:+.1f}%" + ("" if same_sign else ", the other sign"))


def known(measured: Mapping[str, Any], width_pct: float | None) -> bool:
    """The stopping rule of ``--until-known``: the interval excludes 0, or its full width
    (high minus low, in points) is narrower than ``width_pct``."""
    lo, hi = (float(x) for x in measured["interval_pct"])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    if lo > 0 or hi < 0:
        return True
    return width_pct is not None and (hi - lo) < width_pct


def time_estimate(round_s: float, done_rounds: int, max_rounds: int) -> dict[str, float]:
    """What the rounds left will take at most, from one round's time."""
    left = max(0, max_rounds - done_rounds)
    return {"round_s": round_s, "rounds_left_at_most": left, "worst_case_s": left * round_s}
