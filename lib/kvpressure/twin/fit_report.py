"""Measured against twin, level by level, and the verdict on how far the twin can be trusted.

The tolerances are the issue's targets for a twin a capacity planner may act on: output
throughput within 15% at every level, preemptions within 10% (or 2 preemptions, whichever is
larger: a handful of preemptions is within run-to-run noise), the knee (where growth stops)
within one level, where "the knee" is the record's knee of each curve (``analysis.knee``, the one
the report's knee stage finds; a curve without one counts as past its last level). Latency percentiles are shown with their errors and, beyond 25%, named as a
caveat of any latency limit checked on the twin.

Past the pool's capacity a level's preemptions are not one number the data pins down. An open
loop's swing from run to run with a few steps' timing (a cascade starts a few steps earlier or
later: ``open_loop.py``'s replays); a closed loop's with the order in which the requests it
sends at once reach the engine, which no result records (``LevelWorkload.redrawn``: the same
lengths in other orders move a level's count by up to a fifth). The measured count is checked
against the range of the twin's replays, with the same tolerance on each side. Where
the replays themselves span more than a factor of ``UNSTABLE_RANGE``, the count is not a
property of the level but of one run's timing: a measured count outside them is named as a
caveat, not held against the fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

THROUGHPUT_TOL_PCT = 15.0
PREEMPTION_TOL_PCT = 10.0
PREEMPTION_TOL_ABS = 2.0
LATENCY_TOL_PCT = 25.0
KNEE_TOL_LEVELS = 1
PLATEAU_TOL_PCT = 5.0
UNSTABLE_RANGE = 2.0
COMPARED = ("output_throughput", "preemptions", "ttft_p50_s", "ttft_p95_s", "itl_p50_s",
            "itl_p95_s", "mean_running", "tokens_per_step")


@dataclass
class FitVerdict:
    fits: bool
    text: str
    throughput_max_error_pct: float | None
    preemption_misses: list[dict[str, Any]] = field(default_factory=list)
    throughput_misses: list[dict[str, Any]] = field(default_factory=list)
    latency_caveats: list[str] = field(default_factory=list)
    knee: dict[str, Any] = field(default_factory=dict)
    preemptions_unstable: list[dict[str, Any]] = field(default_factory=list)
    """Levels whose preemptions the twin's replays cannot pin down (see the module docstring)."""


def _err(twin: float, measured: float) -> float:
    if not (isinstance(measured, float | int) and math.isfinite(measured) and measured != 0):
        return math.nan
    if not math.isfinite(twin):
        return math.nan
    return 100.0 * (twin - measured) / measured


def comparison_table(measured_levels: pd.DataFrame, twin_levels: Mapping[Any, dict[str, Any]],
                     throughput_band: Mapping[Any, tuple[float, float]],
                     key: str = "concurrency",
                     preemption_range: Mapping[Any, tuple[float, float]] | None = None
                     ) -> pd.DataFrame:
    """One row per level (``key``: concurrency, or the request rate of an open loop):
    ``<stat>_measured``, ``<stat>_twin``, ``<stat>_error_pct``; the recompute range measured
    (ratio low..high) against the twin's exact ratio; the bootstrap band of the twin's
    throughput; with ``preemption_range``, the twin's preemptions over its replays
    (``preemptions_twin_low``, ``preemptions_twin_high``)."""
    from kvpressure.twin.measured import level_value

    rows = []
    for _, m in measured_levels.iterrows():
        c = level_value(m[key], key)
        t = twin_levels.get(c)
        if t is None:
            continue
        row: dict[str, Any] = {key: c}
        for stat in COMPARED:
            mv = float(m[stat]) if stat in m and pd.notna(m[stat]) else math.nan
            tv = float(t[stat])
            row[f"{stat}_measured"] = mv
            row[f"{stat}_twin"] = tv
            row[f"{stat}_error_pct"] = _err(tv, mv)
        lo, hi = throughput_band.get(c, (math.nan, math.nan))
        row["output_throughput_twin_p05"], row["output_throughput_twin_p95"] = lo, hi
        if preemption_range is not None:
            plo, phi = preemption_range.get(c, (math.nan, math.nan))
            # The point prediction is one more replay: the range holds it.
            row["preemptions_twin_low"] = min(plo, row["preemptions_twin"])
            row["preemptions_twin_high"] = max(phi, row["preemptions_twin"])
        rlo, rhi = float(m["recompute_ratio_low"]), float(m["recompute_ratio_high"])
        row["recompute_ratio_measured_low"], row["recompute_ratio_measured_high"] = rlo, rhi
        row["recompute_ratio_twin"] = float(t["recompute_ratio"])
        row["recompute_twin_in_range"] = (
            bool(rlo - 1e-9 <= t["recompute_ratio"] <= rhi + 1e-9)
            if math.isfinite(rlo) and math.isfinite(rhi) else None)
        rows.append(row)
    return pd.DataFrame(rows)


def growth_stops(x: list[Any], y: list[float], tol_pct: float = PLATEAU_TOL_PCT) -> Any:
    """The first level whose throughput is within ``tol_pct`` of the curve's peak: where
    growth stops. On the plateaus these curves often have, a knee finder's corner moves with
    noise of a few percent; the first level to reach the plateau does not."""
    pts = [(a, float(b)) for a, b in zip(x, y, strict=True) if math.isfinite(float(b))]
    if not pts:
        return None
    peak = max(b for _, b in pts)
    return next(a for a, b in sorted(pts) if b >= (1.0 - tol_pct / 100.0) * peak)


def _knee_name(at: str, knee: Any) -> str:
    return "none (still rising)" if knee is None else f"{at}{knee:g}"


def record_knee(x: list[Any], y: list[float]) -> Any:
    """The knee the record finds on the curve (``analysis.knee.find_knee``), as one of ``x``;
    None when it finds none (still rising) or there are fewer than 3 levels."""
    from kvpressure.analysis.knee import find_knee

    pts = [(a, float(b)) for a, b in zip(x, y, strict=True) if math.isfinite(float(b))]
    if len(pts) < 3:
        return None
    knee = find_knee([a for a, _ in pts], [b for _, b in pts]).knee_x
    if knee is None:
        return None
    return min((a for a, _ in pts), key=lambda a: abs(float(a) - knee))


def verdict(table: pd.DataFrame, key: str = "concurrency") -> FitVerdict:
    """The fit's verdict from the comparison table (see the module docstring); levels are
    named ``c=8`` or, in an open loop (``key`` ``request_rate``), ``rate=3``."""
    from kvpressure.twin.measured import level_value

    levels = [level_value(v, key) for v in table[key]]
    at = "c=" if key == "concurrency" else "rate="
    thr_err = table["output_throughput_error_pct"].to_numpy(float)
    finite = np.isfinite(thr_err)
    max_err = float(np.max(np.abs(thr_err[finite]))) if finite.any() else None
    thr_miss = [{key: c, "error_pct": round(float(e), 1)}
                for c, e in zip(levels, thr_err, strict=True)
                if math.isfinite(e) and abs(e) > THROUGHPUT_TOL_PCT]
    pre_miss = []
    unstable = []
    ranged = "preemptions_twin_low" in table.columns
    for c, (_, r) in zip(levels, table.iterrows(), strict=True):
        mv, tv = r["preemptions_measured"], r["preemptions_twin"]
        if not math.isfinite(mv):
            continue
        lo, hi = (r["preemptions_twin_low"], r["preemptions_twin_high"]) if ranged else (
            math.nan, math.nan)
        if math.isfinite(lo) and math.isfinite(hi):
            outside = (mv < lo - max(PREEMPTION_TOL_PCT / 100.0 * lo, PREEMPTION_TOL_ABS)
                       or mv > hi + max(PREEMPTION_TOL_PCT / 100.0 * hi, PREEMPTION_TOL_ABS))
            if outside and hi > UNSTABLE_RANGE * lo + PREEMPTION_TOL_ABS:
                unstable.append({key: c, "measured": mv, "twin": tv, "twin_range": [lo, hi]})
            elif outside:
                pre_miss.append({key: c, "measured": mv, "twin": tv, "twin_range": [lo, hi]})
        elif abs(tv - mv) > max(PREEMPTION_TOL_PCT / 100.0 * mv, PREEMPTION_TOL_ABS):
            pre_miss.append({key: c, "measured": mv, "twin": tv})
    mk = record_knee(levels, table["output_throughput_measured"].tolist())
    tk = record_knee(levels, table["output_throughput_twin"].tolist())
    knee = {"measured": mk, "twin": tk, "levels_apart": None, "ok": True,
            "rule": "the record's knee of each curve (analysis.knee; none: past the last level)"}
    if len(levels) >= 3 and (mk is not None or tk is not None):
        where = {c: i for i, c in enumerate(levels)}
        apart = abs(where.get(mk, len(levels)) - where.get(tk, len(levels)))
        knee["levels_apart"] = apart
        knee["ok"] = apart <= KNEE_TOL_LEVELS
    caveats = []
    for stat in ("ttft_p95_s", "itl_p95_s"):
        e = table[f"{stat}_error_pct"].to_numpy(float)
        e = e[np.isfinite(e)]
        if len(e) and np.max(np.abs(e)) > LATENCY_TOL_PCT:
            caveats.append(f"{stat.removesuffix('_s').replace('_', ' ').upper()} off by up to "
                           f"{np.max(np.abs(e)):.0f}%")
    fits = max_err is not None and not thr_miss and not pre_miss and knee["ok"]
    if max_err is None:
        text = "does not fit: no measured throughput to compare"
    elif fits:
        measured_pre = np.isfinite(table["preemptions_measured"].to_numpy(float)).any()
        pre = (f"preemptions within {PREEMPTION_TOL_PCT:g}% or {PREEMPTION_TOL_ABS:g}"
               + (" of the range of the twin's replays" if ranged else "")
               if measured_pre else "preemptions not measured (no scrapes), not checked")
        text = (f"twin fits within {math.ceil(max_err)}% (output throughput, every level); "
                f"{pre}; knee within {KNEE_TOL_LEVELS} level")
    else:
        misses: list[str] = []
        if thr_miss:
            misses.append("throughput at " + ", ".join(
                f"{at}{m[key]:g} ({m['error_pct']:+.0f}%)" for m in thr_miss))
        if pre_miss:
            misses.append("preemptions at " + ", ".join(
                f"{at}{m[key]:g} ({m['measured']:.0f} measured, {m['twin']:.0f} twin"
                + (f", {m['twin_range'][0]:.0f}-{m['twin_range'][1]:.0f} over its replays"
                   if "twin_range" in m else "") + ")"
                for m in pre_miss))
        if not knee["ok"]:
            misses.append(f"knee at {_knee_name(at, mk)} measured, {_knee_name(at, tk)} twin")
        text = "does not fit: " + "; ".join(misses)
    if unstable:
        text += ("; caveat: preemptions swing with the steps' timing at " + ", ".join(
            f"{at}{m[key]:g} (the twin's replays {m['twin_range'][0]:.0f}-"
            f"{m['twin_range'][1]:.0f}, measured {m['measured']:.0f})" for m in unstable)
            + ": one run cannot check them")
    if caveats:
        text += "; latency caveat: " + ", ".join(caveats)
    return FitVerdict(fits, text, max_err, pre_miss, thr_miss, caveats, knee, unstable)
