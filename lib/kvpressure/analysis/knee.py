"""Knee, peak, plateau, sustained range and decline of a throughput-vs-concurrency curve.

Published sweeps have few points (5 to 30 levels), uneven steps (1, 2, 4, 8, ... or 16, 24, 32,
48, 64) and noise; some repeat each level (several runs, or workload seeds of a simulation). The
method:

1. Levels: repeated measurements of one x are averaged; their spread gives the noise (pooled
   standard deviation of one measurement). Without repeats (and without a given ``noise_sd``)
   the noise is read from the roughness of the level means: each level against the straight line
   through its two neighbours (a second difference, scaled to the noise of one level and taken
   relative to the level, since throughput noise grows with throughput). A straight rise and a
   held plateau leave second differences of zero; the corner at the knee, or one noisy level,
   moves three consecutive ones. The estimate is the median absolute second difference with
   the largest and its two neighbours left out (when any remain), scaled to a standard
   deviation: a scale of all of them breaks down when three of a sweep's handful are moved,
   and the plateau band then reaches a level that is clearly below the peak. Only the levels up
   to the plateau's end (the rising part and the levels held within ``plateau_tol`` of the
   peak) are used when there are four or more, otherwise every level; the drop after the peak
   is left out. A broken-stick residual, by contrast, counts the shape of a curve that rises,
   peaks and falls (or bends smoothly) as noise. ``noise_source`` says which estimate was used.
2. Peak: the highest mean. Plateau: the contiguous run of levels around the peak whose mean is
   within ``band = max(plateau_tol * peak, z * noise / sqrt(n))`` of it.
3. Knee (where added concurrency stops paying), from three levels on (one level is a point, two
   are a slope: ``knee_x`` is None and a note says so): a continuous two-segment ("broken-stick")
   least-squares fit whose breakpoint is one of the levels up to the peak; the fit uses the points
   up to the plateau's end (all points when the plateau is only the peak, so a falling tail is
   the second segment). It uses every point at once and so holds up under noise better than
   curvature alone. Kneedle (``kneed``, concave increasing, on the points up to the plateau's
   end) is run too: when it lands within one level of the broken-stick knee its answer is kept
   (it is the usual definition), otherwise the broken-stick knee is kept and Kneedle's answer is
   reported beside it.
4. A curve still rising at its last level (the second segment keeps at least half the first
   segment's slope and the peak is the last point) has no knee within the range: ``knee_x`` is
   None.
5. Sustained range (where the curve turns): ``sustained_end`` is the largest level at or after
   the peak whose mean is still within ``band`` of the peak; ``decline_onset`` the next level,
   where the curve has turned down for good (None when the curve holds to the largest level: the
   turn, if any, lies past the range). A single low level followed by a recovery does not end
   the sustained range.
6. Decline: peak minus the end of the curve (mean of the last two levels after the peak, so a
   dip that recovers does not count); ``declines`` when that exceeds both ``min_decline_pct`` of
   the peak and ``z`` times the noise of a difference of two levels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.jsonable import to_jsonable
from kvpressure.stages.results import CurvePoint, LatencyKnee, LatencyPoint, ThroughputKnee

# One level is a point and two are a slope: a bend needs a third.
MIN_KNEE_LEVELS = 3
CLI_KEYS = ("knee_x", "peak_x", "peak_y", "plateau", "declines", "decline_pct", "points")


def knee_summary(knee: ThroughputKnee, group: object = None) -> dict[str, Any]:
    """The JSON object of ``kvpressure knee`` (docs/interfaces.md#knee-json)."""
    d = to_jsonable(knee.model_dump())
    return {"group": group, **{k: d[k] for k in CLI_KEYS}}


def few_levels_note(levels: int) -> str:
    """Why a curve of fewer than ``MIN_KNEE_LEVELS`` levels has no knee."""
    if levels == 0:
        return "no level with a known concurrency and throughput: no curve, no knee"
    if levels == 1:
        return "1 level: a point, not a curve; no knee (a knee needs at least 3 levels)"
    return (f"{levels} levels: a slope, not a bend; no knee (a knee needs at least "
            f"{MIN_KNEE_LEVELS} levels)")


def _aggregate(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xs = np.unique(x)
    means = np.array([y[x == v].mean() for v in xs])
    counts = np.array([(x == v).sum() for v in xs])
    sds = np.array([y[x == v].std(ddof=1) if (x == v).sum() > 1 else np.nan for v in xs])
    return xs, means, counts, sds


# Second differences needed for a noise estimate: two on the rising part (four levels; rough,
# but a sweep often has no more before its peak), three over every level (where the drop after
# the peak is one of them). A sweep of fewer than five levels in all gives none: on a short
# sweep that starts near zero (1.4 tok/s at one client, 1,000 at 32) a relative difference at
# the low end would pass for noise as large as the peak.
_MIN_HELD_RESIDUALS = 2
_MIN_RESIDUALS = 3
_MIN_LEVELS = 5
# Median of |N(0, 1)|: the median absolute value of normal noise is 0.6745 standard deviations.
_MAD_NORMAL = 0.6745


def _relative_second_differences(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each interior level minus the straight line through its two neighbours, divided by the
    standard deviation that difference has when every level carries unit noise (uneven level
    steps weigh the neighbours unevenly), relative to the level: throughput noise grows with
    throughput. Levels at or below zero are left out."""
    h_left, h_right = x[1:-1] - x[:-2], x[2:] - x[1:-1]
    w_left, w_right = h_right / (h_left + h_right), h_left / (h_left + h_right)
    r = (y[1:-1] - (w_left * y[:-2] + w_right * y[2:])) / np.sqrt(1 + w_left**2 + w_right**2)
    ok = y[1:-1] > 0
    return r[ok] / y[1:-1][ok]


def _exact_zero(rel: float) -> float:
    # Rounding leaves ~1e-14 on an exactly straight curve; that is no noise.
    return 0.0 if rel < 1e-9 else rel


def robust_roughness(r: np.ndarray) -> float:
    """Noise of one level (relative) from second differences ``r``: the median absolute second
    difference, scaled to a standard deviation for normal noise, after leaving out the largest
    and its two neighbours when any remain.

    A straight rise and a held plateau leave second differences of zero; a corner (the knee) or
    one noisy level moves three consecutive ones (its own fully, its neighbours' by half). A
    scale of all of them breaks down when three of a sweep's handful are moved: the band grows
    past levels that are clearly below the peak. Leaving out that window keeps the estimate to
    what the rest of the curve shows.
    """
    a = np.abs(np.asarray(r, dtype=float))
    i = int(np.argmax(a))
    keep = np.ones(len(a), dtype=bool)
    keep[max(0, i - 1): i + 2] = False
    rest = a[keep] if keep.sum() >= 1 else a
    return float(np.median(rest) / _MAD_NORMAL)


def roughness_noise(x: np.ndarray, y: np.ndarray, plateau_tol: float = 0.05
                    ) -> tuple[float | None, str]:
    """Noise of one level of a curve without repeats, relative to the level (multiply by the
    peak for the noise there), read from its roughness, and where it was read (step 1 of the
    module docstring); None with too few levels.

    ``x`` sorted and distinct, ``y`` the level means.
    """
    if len(x) < _MIN_LEVELS:
        return None, (f"unknown (only {len(x)} levels, {_MIN_LEVELS} needed); min_decline_pct "
                      "and plateau_tol alone decide")
    ipeak = int(np.argmax(y))
    end = ipeak
    while end < len(y) - 1 and y[end + 1] >= y[ipeak] * (1 - plateau_tol):
        end += 1
    held = _relative_second_differences(x[: end + 1], y[: end + 1]) if end >= 2 else None
    if held is not None and len(held) >= _MIN_HELD_RESIDUALS:
        return _exact_zero(robust_roughness(held)), (
            "roughness: median absolute second difference of the level means (the largest "
            "and its neighbours left out) up to the plateau's end (the rising part and the levels held near "
            f"the peak; {len(held)} differences)")
    every = _relative_second_differences(x, y) if len(x) >= 3 else np.empty(0)
    if len(every) >= _MIN_RESIDUALS:
        return _exact_zero(robust_roughness(every)), (
            "roughness: median absolute second difference of the level means (the largest "
            "and its neighbours left out) over every level (fewer than 4 levels up to the plateau's end)")
    return None, "unknown (too few levels); min_decline_pct and plateau_tol alone decide"


def _broken_stick(
    x: np.ndarray, y: np.ndarray, max_break: int
) -> tuple[int, float, float, float] | None:
    """Best breakpoint index, slopes before/after and SSE; None with < 3 points."""
    n = len(x)
    if n < 3:
        return None
    best = None
    for i in range(1, min(max_break, n - 2) + 1):
        k = x[i]
        a = np.c_[np.ones(n), np.minimum(x, k), np.maximum(x - k, 0.0)]
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        sse = float(((a @ coef - y) ** 2).sum())
        if best is None or sse < best[3] - 1e-12 * max(1.0, abs(sse)):
            best = (i, float(coef[1]), float(coef[2]), sse)
    return best


def _kneedle(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3:
        return None
    try:
        from kneed import KneeLocator
    except ImportError:  # pragma: no cover - kneed is a declared dependency
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kl = KneeLocator(x, y, curve="concave", direction="increasing", S=1.0)
        except (ValueError, ZeroDivisionError):
            return None
    return None if kl.knee is None else float(kl.knee)


def find_knee(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    plateau_tol: float = 0.05,
    min_decline_pct: float = 2.0,
    z: float = 2.0,
    noise_sd: float | None = None,
) -> ThroughputKnee:
    """Locate the knee of ``y`` (throughput) over ``x`` (concurrency).

    ``x`` may repeat (several measurements per level). ``noise_sd`` overrides the noise
    estimate (standard deviation of one measurement, in units of ``y``; 0 for an exact curve).
    """
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    if xa.shape != ya.shape:
        raise InputError(f"find_knee: x has {xa.size} values, y has {ya.size}")
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    if xa.size == 0:
        raise InputError("find_knee: no finite (x, y) points")
    if not 0 <= plateau_tol < 1:
        raise InputError(f"find_knee: plateau_tol must be in [0, 1), got {plateau_tol}")
    order = np.argsort(xa, kind="stable")
    xs, ym, counts, sds = _aggregate(xa[order], ya[order])
    notes: list[str] = []
    points = [
        CurvePoint(x=float(a), y=float(b), n=int(c), sd=None if math.isnan(s) else float(s))
        for a, b, c, s in zip(xs, ym, counts, sds, strict=True)
    ]

    ipeak = int(np.argmax(ym))
    peak_x, peak_y = float(xs[ipeak]), float(ym[ipeak])

    # Noise of one measurement: pooled spread of repeats when present, else the roughness of
    # the level means.
    source = "given"
    sigma = noise_sd
    if sigma is None and np.any(counts > 1):
        rep = counts > 1
        sigma = float(np.sqrt(np.sum((counts[rep] - 1) * sds[rep] ** 2) / np.sum(counts[rep] - 1)))
        source = "spread of repeated measurements"
    elif sigma is None:
        rel, source = roughness_noise(xs, ym, plateau_tol)
        sigma = None if rel is None else rel * abs(peak_y)
    # Standard error of a level mean (levels may have different repeat counts).
    n_typ = float(np.median(counts))

    def plateau_band(sig: float | None) -> float:
        se = 0.0 if sig is None else sig / math.sqrt(n_typ)
        return max(plateau_tol * abs(peak_y), z * se)

    def plateau_of(band: float) -> tuple[int, int]:
        lo = hi = ipeak
        while lo > 0 and ym[lo - 1] >= peak_y - band:
            lo -= 1
        while hi < len(xs) - 1 and ym[hi + 1] >= peak_y - band:
            hi += 1
        return lo, hi

    band = plateau_band(sigma)
    lo, hi = plateau_of(band)
    fit_n = hi + 1 if hi - lo >= 1 or hi == len(xs) - 1 else len(xs)
    fit = _broken_stick(xs[:fit_n], ym[:fit_n], max_break=ipeak)

    knee_bs = float(xs[fit[0]]) if fit is not None else None
    knee_kn = _kneedle(xs[: hi + 1], ym[: hi + 1])
    still_rising = False
    if fit is not None and ipeak == len(xs) - 1 and fit[1] > 0 and fit[2] >= 0.5 * fit[1]:
        still_rising = True
    if still_rising:
        knee, method = None, "none: still rising at the largest level"
        notes.append("throughput still grows at the largest level; no knee inside the range")
    elif len(xs) < MIN_KNEE_LEVELS:
        knee, method = None, f"none: {len(xs)} level{'s' if len(xs) > 1 else ''}"
        notes.append(few_levels_note(len(xs)))
    elif knee_kn is not None and knee_bs is not None and abs(
        int(np.searchsorted(xs, knee_kn)) - int(np.searchsorted(xs, knee_bs))
    ) <= 1:
        knee, method = knee_kn, "kneedle (agrees with the broken-stick fit)"
    else:
        knee, method = knee_bs, "broken-stick fit"
        if knee_kn is not None:
            notes.append(f"kneedle put the knee at {knee_kn:g}, away from the fit's {knee_bs:g}")
    if knee is not None and knee > peak_x:
        knee = peak_x

    # The last level still within the band of the peak: the curve has turned after it.
    held = ipeak + int(np.flatnonzero(ym[ipeak:] >= peak_y - band)[-1])
    sustained_end = float(xs[held])
    decline_onset = float(xs[held + 1]) if held + 1 < len(xs) else None

    after = ym[ipeak + 1 :]
    # The end of the sweep (mean of the last two levels after the peak, which halves the noise
    # of a single level) against the peak: a dip that recovers is not a decline.
    end_level = float(after[-2:].mean()) if after.size else peak_y
    decline_abs = max(peak_y - end_level, 0.0)
    decline_pct = 100.0 * decline_abs / peak_y if peak_y > 0 else 0.0
    noise_floor = 0.0 if sigma is None else z * sigma * math.sqrt(2.0 / n_typ)
    declines = bool(after.size and decline_pct >= min_decline_pct and decline_abs > noise_floor)
    if MIN_KNEE_LEVELS <= len(xs) < 5:
        notes.append(f"only {len(xs)} levels: knee and decline are rough")

    return ThroughputKnee(
        knee_x=knee,
        peak_x=peak_x,
        peak_y=peak_y,
        plateau=(float(xs[lo]), float(xs[hi])),
        declines=declines,
        decline_pct=round(decline_pct, 3),
        points=points,
        method=method,
        knee_kneedle=knee_kn,
        knee_broken_stick=knee_bs,
        noise_sd=sigma,
        noise_source=source,
        still_rising=still_rising,
        sustained_end=sustained_end,
        decline_onset=decline_onset,
        plateau_band=band,
        notes=notes,
        same_schedule_from=None,
    )


def _cell_reason(value: object, column: str) -> str | None:
    """Why one cell of a curve column cannot be a point, or None."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return f"{column} {value!r} is not a number"
    elif isinstance(value, bool) or value is None:
        return f"no {column}"
    else:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return f"{column} {value!r} is not a number"
    if math.isnan(number):
        return f"no {column}"
    if math.isinf(number):
        return f"{column} is {'inf' if number > 0 else '-inf'}"
    return None


# What the engine did at a level, independent of how long clients queued before admission.
ENGINE_COLUMNS = ("output_throughput", "preemptions", "recomputed_tokens", "itl_mean_s",
                  "itl_p95_s", "mean_running")


def same_schedule_from(curve: pd.DataFrame, x: str = "concurrency") -> float | None:
    """The smallest level from which every larger level gave the same engine-side numbers
    (``ENGINE_COLUMNS``, equal to 1e-9), or None.

    A closed loop whose waiting queue never empties hands the scheduler the same requests in the
    same order whatever the client count, so its schedule stops depending on the level: those
    levels are one measurement, not a trend (a curve "falling by 96" that fell at 48). Measured
    data never repeats to 1e-9, so this names only such exact repeats.
    """
    cols = [c for c in ENGINE_COLUMNS if c in curve.columns]
    if len(curve) < 2 or "output_throughput" not in cols:
        return None
    part = curve.sort_values(x)
    values = part[cols].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    levels = pd.to_numeric(part[x]).to_numpy(float)
    first = None
    for i in range(len(values) - 2, -1, -1):
        same = np.allclose(values[i], values[i + 1], rtol=1e-9, atol=0.0, equal_nan=True)
        if not same:
            break
        first = levels[i]
    return None if first is None else float(first)


def knee_of_runs(runs: pd.DataFrame, x: str = "concurrency", y: str = "output_throughput", *,
                 plateau_tol: float = 0.05, where: str = "runs") -> ThroughputKnee:
    """The knee of one curve of a runs table: the function ``kvpressure knee`` and the report's
    knee stage share. Rows the curve cannot use (a level such as "off", an ``inf`` or missing
    throughput) are left out and named in ``notes``; a ``y`` named like a latency or a per-user
    rate is refused (InputError)."""
    from kvpressure.ingestion.bench_tables import throughput_problem

    why = throughput_problem(y)
    if why:
        raise InputError(f"{where}: --y {y}: {why}")
    for col in (x, y):
        if col not in runs.columns:
            raise InputError(f"{where}: missing column '{col}'")
    labels = (runs["source"].astype(str).tolist() if "source" in runs.columns
              else [f"row {i + 1}" for i in range(len(runs))])
    keep, left_out = [], []
    for i, (xv, yv) in enumerate(zip(runs[x].tolist(), runs[y].tolist(), strict=True)):
        reason = _cell_reason(xv, x) or _cell_reason(yv, y)
        if reason:
            left_out.append(f"{labels[i]}: {reason}")
        keep.append(reason is None)
    if not any(keep):
        raise InputError(f"{where}: no row with a numeric {x} and {y} ("
                         + "; ".join(left_out[:5]) + ")")
    part = runs[keep]
    res = find_knee(pd.to_numeric(part[x]).to_numpy(float), pd.to_numeric(part[y]).to_numpy(float),
                    plateau_tol=plateau_tol)
    if left_out:
        res.notes.insert(0, f"{len(left_out)} row(s) left out of the curve: "
                         + "; ".join(left_out))
    ys = [p.y for p in res.points]
    if len(ys) >= 3 and all(b < a for a, b in zip(ys, ys[1:], strict=False)):
        res.notes.append(f"{y} falls from the first level on: a latency or a per-user rate "
                         "would look like this; check that it is the server's throughput")
    return res


# A latency knee: the last level whose latency is within this factor of the lightest load's.
LATENCY_FACTOR = 2.0


def latency_knee(x: Sequence[float], y: Sequence[float],
                 factor: float = LATENCY_FACTOR) -> LatencyKnee | None:
    """Where a latency curve against offered load turns up: ``knee_x`` is the last level whose
    latency is still within ``factor`` times the latency at the lightest load, ``turn_x`` the
    next level (where requests start to queue: the load is more than the server drains).

    Latency against offered load is flat while the server keeps up, climbs steeply once it is
    saturated, and may flatten again when a finite request set has queued whole; a band around
    the unloaded latency names the turn on any of those shapes, where a line fit would chase
    the steep part. Repeats of a level are averaged first. None with fewer than
    ``MIN_KNEE_LEVELS`` levels with a latency; ``knee_x`` None when the latency is past the band
    from the second level on, ``turn_x`` None when it stays inside the band to the last."""
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    if keep.sum() == 0:
        return None
    lx, ly, _, _ = _aggregate(xs[keep], ys[keep])
    if len(lx) < MIN_KNEE_LEVELS:
        return None
    base = float(ly[0])
    limit = factor * base
    past = [i for i in range(len(lx)) if ly[i] > limit]
    first = past[0] if past else None
    return LatencyKnee(
        knee_x=None if first == 1 else float(lx[(first or len(lx)) - 1]),
        turn_x=None if first is None else float(lx[first]), base=base, factor=factor,
        limit=limit,
        points=[LatencyPoint(x=float(a), y=float(b)) for a, b in zip(lx, ly, strict=True)])
