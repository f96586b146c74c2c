"""How far a measured change can be read: the run-to-run noise of a level's throughput, and a
predicted change's interval with it.

A remedy is checked by measuring the server twice, once with it; each measurement moves by the
run-to-run noise, so a predicted change smaller than that noise is no measurable effect,
whatever its sign. The noise, best first:

1. repeats of a level in the runs table (several runs of one level): their pooled relative
   standard deviation;
2. the scatter of the measured levels around the fitted twin (the throughput errors over at
   least 3 levels): measured, and an upper bound, for it holds the twin's own error too. The
   twin was fitted on those very levels and took up part of each one's noise: a level whose
   throughput row has leverage ``h`` in the fit (``fit.row_leverage``) scatters by
   ``sqrt(1 - h)`` of its noise, so the squared errors are summed over ``n - sum(h)``
   degrees of freedom, not ``n`` (without the leverages, the root mean square over ``n - 1``);
3. otherwise estimated at ``ESTIMATED_SD_PCT`` (said so).

A standard deviation estimated from a few values is itself uncertain: the band of a measured
one takes Student's t quantile at its degrees of freedom (6 levels: 2.02, against the normal
1.645), so a twin fitted on few levels does not claim a narrower band than its data holds.

A predicted change's 90% interval adds, in quadrature on each side, the spread over the fit's
coefficient draws, the spread over versions of the level the data cannot tell apart (its
request lengths drawn again where they are a draw, a closed loop's requests sent at once in
another order: ``LevelWorkload.redrawn``) and the noise of a paired measurement (``sqrt(2)`` times
one run's: a change is measured between two server runs, each with its own noise). A setting
that changes nothing (the current settings measured again, a restart) has no coefficient or
version spread but keeps that noise: its interval is ``+-`` the paired half-width, never [0, 0].
Where the data has only the mean lengths, the interval is stretched to hold 0: the twin cannot
tell the sign of a change that the length spread drives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

ESTIMATED_SD_PCT = 3.0
Z90 = 1.645
RAISES, LOWERS, NO_EFFECT = "raises", "lowers", "no measurable effect"


@dataclass(frozen=True)
class RunNoise:
    throughput_sd_pct: float
    """One run's throughput standard deviation at a level, % of the level's throughput."""
    source: str
    measured: bool
    dof: float | None = None
    """Degrees of freedom of a measured standard deviation (not a whole number where a fit
    spent some: ``n - sum(h)``); None for an estimate."""

    @property
    def quantile(self) -> float:
        """The two-sided 90% quantile the band takes: Student's t at ``dof``, else normal."""
        if self.dof is None:
            return Z90
        from scipy.stats import t

        return float(t.ppf(0.95, self.dof))

    @property
    def change_halfwidth_pct(self) -> float:
        """Half the 90% band of a change measured between two runs."""
        return self.quantile * math.sqrt(2.0) * self.throughput_sd_pct

    def to_dict(self) -> dict[str, Any]:
        return {"throughput_sd_pct": self.throughput_sd_pct, "source": self.source,
                "measured": self.measured, "dof": self.dof, "quantile": self.quantile,
                "change_halfwidth_pct": self.change_halfwidth_pct}


def run_to_run_noise(runs: pd.DataFrame, key: str, fit_table: pd.DataFrame | None,
                     leverage: Mapping[Any, float] | None = None) -> RunNoise:
    """The run-to-run noise of the measured levels (module docstring); ``leverage`` is each
    fitted level's throughput-row leverage (``TwinFit.throughput_leverage``; a level not in it
    was not fitted on: 0)."""
    if key in runs and "output_throughput" in runs:
        frame = pd.DataFrame({"x": pd.to_numeric(runs[key], errors="coerce"),
                              "y": pd.to_numeric(runs["output_throughput"], errors="coerce")})
        frame = frame.dropna()
        rel = [(g["y"] / g["y"].mean() - 1.0).to_numpy() for _, g in frame.groupby("x")
               if len(g) > 1 and g["y"].mean() > 0]
        dof = sum(len(r) - 1 for r in rel)
        if dof >= 1:
            sd = 100.0 * math.sqrt(sum(float((r ** 2).sum()) for r in rel) / dof)
            return RunNoise(sd, f"measured: repeats of {len(rel)} level(s) in the runs table "
                            f"({dof} degree(s) of freedom)", True, dof)
    if fit_table is not None and "output_throughput_error_pct" in fit_table:
        err = fit_table["output_throughput_error_pct"].to_numpy(float)
        ok = np.isfinite(err)
        if ok.sum() >= 3 and leverage is not None and key in fit_table:
            spent = float(sum(leverage.get(c, 0.0) for c in fit_table[key][ok]))
            left = float(ok.sum()) - spent
            if left >= 1.0:
                sd = float(np.sqrt(np.sum(err[ok] ** 2) / left))
                return RunNoise(sd, f"measured: the scatter of the {int(ok.sum())} measured "
                                f"levels around the fitted twin, over the {left:.1f} degrees "
                                "of freedom its fit left (an upper bound: it holds the twin's "
                                "own error)", True, left)
        err = err[ok]
        if len(err) >= 3:
            sd = float(np.sqrt(np.mean(err ** 2)))
            return RunNoise(sd, f"measured: the scatter of the {len(err)} measured levels around "
                            "the fitted twin (an upper bound: it holds the twin's own error)",
                            True, len(err) - 1)
    return RunNoise(ESTIMATED_SD_PCT, f"estimated at {ESTIMATED_SD_PCT:g}% (the data has no "
                    "repeats and too few levels to measure it)", False)


def change_interval(point: float, coef_p05: float, coef_p95: float,
                    draws: np.ndarray | None, noise: RunNoise, spread_known: bool
                    ) -> tuple[float, float, str]:
    """``(low, high, effect)`` of a predicted change in % (module docstring); ``effect`` is
    RAISES or LOWERS when the interval excludes 0, else NO_EFFECT."""
    d = Z90 * float(np.std(draws, ddof=1)) if draws is not None and len(draws) > 1 else 0.0
    h = noise.change_halfwidth_pct
    lo = point - math.sqrt(max(point - coef_p05, 0.0) ** 2 + d ** 2 + h ** 2)
    hi = point + math.sqrt(max(coef_p95 - point, 0.0) ** 2 + d ** 2 + h ** 2)
    if not spread_known:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    effect = RAISES if lo > 0 else LOWERS if hi < 0 else NO_EFFECT
    return lo, hi, effect


def effect_text(point: float, lo: float, hi: float, effect: str, noise: RunNoise,
                spread_known: bool) -> str:
    """A predicted change as a reader should take it: a signed percentage only outside the
    noise."""
    if effect != NO_EFFECT:
        return f"{point:+.1f}% (90% interval with run-to-run noise {lo:+.1f}% to {hi:+.1f}%)"
    if not spread_known:
        return ("no measurable effect predicted: the request lengths' spread is not in the data, "
                "so the twin cannot tell this change's sign")
    return (f"no measurable effect (inside the run-to-run noise: 90% interval {lo:+.1f}% to "
            f"{hi:+.1f}%, a paired measurement moves by ±{noise.change_halfwidth_pct:.1f}%)")
