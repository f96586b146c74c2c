"""Single-variable controlled comparison: does the knee move right when one setting changes?

Same request set, same concurrency levels, one engine argument changed (first
``max_num_seqs``; also ``gpu_memory_utilization``, ``max_num_batched_tokens``, ``max_model_len``,
``scheduler_reserve_full_isl``, ``watermark``). The workflow's "knee" is where added concurrency
stops paying and the curve turns, so each variant's curve is read at two places
(:func:`kvpressure.analysis.knee.find_knee`):

* the **knee** (diminishing returns: where the rise bends over), and
* the **end of the sustained range** (the last level held within the plateau band of the peak;
  the next level is the onset of the decline). A curve that holds to its largest level has its
  sustained range extend past the range: its position is one level step past the largest level.
  A curve still rising at its largest level likewise has its knee past the range.

**The rule.** The knee moves right when either position moves right; it moves right beyond
noise when, for that position, the variant's bootstrap range (5th to 95th percentile) lies
entirely to the right of the baseline's. The decline disappearing (the baseline turns down
inside the range, the variant holds to its largest level) is therefore a move right, beyond
noise as soon as the baseline's turn is inside the range in (nearly) every bootstrap sample and
the variant's is not.

**Noise.** Run-to-run noise, as the workflow asks ("seeds or repeats"):

* with repeats (several rows per variant and level, e.g. one per workload seed), each level's
  rows are resampled with replacement (bootstrap) and both positions recomputed;
* without repeats, a parametric bootstrap adds normal noise to the level means: ``noise_sd``
  when given, else the curve's own noise estimate (``find_knee``'s roughness of the level means,
  which a smooth curve or the drop after the peak does not inflate); an exact curve (no
  roughness) has no noise and its shift stands as measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvpressure.analysis.knee import find_knee
from kvpressure.errors import InputError
from kvpressure.stages.results import KneeComparison, KneeShift, ThroughputKnee, VariantKnee

# Engine arguments a comparison may vary (and that runs.csv may carry as columns).
SETTING_COLUMNS = (
    "max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens", "max_model_len",
    "scheduler_reserve_full_isl", "watermark", "num_gpu_blocks", "block_size",
    "enable_chunked_prefill", "enable_prefix_caching", "policy", "long_prefill_token_threshold",
)


def _norm(v: object) -> object:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def variant_settings(
    runs: pd.DataFrame, variants: Mapping[str, Mapping] | None, group: str
) -> dict[str, dict]:
    """variant -> settings, from the variants table or from setting columns of ``runs``."""
    names = [str(v) for v in pd.unique(runs[group])]
    if variants is not None:
        missing = [n for n in names if n not in {str(k) for k in variants}]
        if missing:
            raise InputError(f"variants table: no settings for variant '{missing[0]}'")
        return {n: {k: _norm(v) for k, v in dict(variants[n]).items()} for n in names}
    cols = [c for c in SETTING_COLUMNS if c in runs.columns]
    out: dict[str, dict] = {}
    for n in names:
        part = runs[runs[group].astype(str) == n]
        s = {}
        for c in cols:
            vals = part[c].dropna().unique()
            if len(vals) > 1:
                raise InputError(f"runs: variant '{n}' has several values of '{c}'")
            if len(vals):
                s[c] = _norm(vals[0])
        out[n] = s
    return out


def differing_parameters(settings: Mapping[str, Mapping]) -> list[str]:
    keys = sorted({k for s in settings.values() for k in s})
    diff = []
    for k in keys:
        vals = {repr(_norm(s.get(k))) for s in settings.values()}
        if len(vals) > 1:
            diff.append(k)
    return diff


def _past_range(xs: np.ndarray) -> float:
    """Where a position past the largest level is placed: one level step beyond it."""
    step = xs[-1] - xs[-2] if len(xs) > 1 else 1.0
    return float(xs[-1] + step)


def _knee_pos(k: float | None, xs: np.ndarray) -> float:
    """Knee as a position on the x axis; a still-rising curve sits one step past the end."""
    return float(k) if k is not None else _past_range(xs)


def _turn_pos(res: ThroughputKnee | VariantKnee, xs: np.ndarray) -> float:
    """End of the sustained range as a position; a curve that never turns down sits one step
    past the end."""
    if res.decline_onset is None or res.sustained_end is None:
        return _past_range(xs)
    return float(res.sustained_end)


@dataclass
class _Noise:
    knees: np.ndarray
    turns: np.ndarray
    method: str


def _bootstrap(
    x: np.ndarray, y: np.ndarray, xs: np.ndarray, n_boot: int, rng: np.random.Generator,
    plateau_tol: float, noise_sd: float | None,
) -> _Noise:
    """Bootstrap positions of the knee and of the sustained range's end (``xs``: the x axis
    every variant shares, for the past-the-range position)."""
    res = find_knee(x, y, plateau_tol=plateau_tol, noise_sd=noise_sd)
    levels = np.unique(x)
    counts = np.array([(x == v).sum() for v in levels])
    knees, turns = [], []
    if (counts > 1).any():
        groups = [y[x == v] for v in levels]
        xx = np.concatenate([np.full(len(g), v) for g, v in zip(groups, levels, strict=True)])
        for _ in range(n_boot):
            yy = np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])
            r = find_knee(xx, yy, plateau_tol=plateau_tol, noise_sd=noise_sd)
            knees.append(_knee_pos(r.knee_x, xs))
            turns.append(_turn_pos(r, xs))
        per = (f"{int(counts.min())}" if counts.min() == counts.max()
               else f"{int(counts.min())}-{int(counts.max())}")
        return _Noise(np.array(knees), np.array(turns),
                      f"bootstrap over the repeated measurements of each level ({per} per level)")
    sigma = res.noise_sd or 0.0
    if sigma <= 0:
        return _Noise(np.full(1, _knee_pos(res.knee_x, xs)), np.full(1, _turn_pos(res, xs)),
                      "no noise (exact curve): the shift stands as measured")
    ym = np.array([p.y for p in res.points])
    for _ in range(n_boot):
        yy = ym + rng.normal(0.0, sigma, size=len(ym))
        r = find_knee(levels, yy, plateau_tol=plateau_tol, noise_sd=sigma)
        knees.append(_knee_pos(r.knee_x, xs))
        turns.append(_turn_pos(r, xs))
    where = ("the given noise" if noise_sd is not None
             else "the curve's own noise (the roughness of its level means)")
    return _Noise(np.array(knees), np.array(turns), f"parametric bootstrap with {where}")


def _range(v: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(v, 5)), float(np.percentile(v, 95))


def _moved(shift: float, new: tuple[float, float] | None, old: tuple[float, float] | None
           ) -> str | None:
    """The direction of a move beyond noise ("right" or "left": the ranges lie apart on the
    side of the shift), None for a move within noise or without a range to read it on."""
    if new is None or old is None:
        return None
    if shift > 0 and new[0] > old[1]:
        return "right"
    if shift < 0 and new[1] < old[0]:
        return "left"
    return None


def compare_variants(
    runs: pd.DataFrame,
    variants: Mapping[str, Mapping] | None = None,
    *,
    parameter: str | None = None,
    baseline: str | None = None,
    x: str = "concurrency",
    y: str = "output_throughput",
    group: str = "variant",
    n_boot: int = 100,
    seed: int = 0,
    plateau_tol: float = 0.05,
    noise_sd: float | None = None,
) -> KneeComparison:
    """Per-variant knee and sustained range, and whether the knee moved right beyond noise
    (the rule of the module docstring), for one changed parameter.

    ``runs`` may hold several rows per variant and level (repeats: workload seeds or repeated
    runs); ``noise_sd`` (standard deviation of one measurement, in units of ``y``) replaces the
    noise estimate of curves without repeats. Raises InputError when more than one parameter
    differs between variants (naming them), when none does, or when ``parameter`` is given and
    is not the one that differs.
    """
    for col in (group, x, y):
        if col not in runs.columns:
            raise InputError(f"runs: missing column '{col}'")
    settings = variant_settings(runs, variants, group)
    if len(settings) < 2:
        raise InputError(f"runs: a comparison needs at least two variants in column '{group}'")
    diff = differing_parameters(settings)
    if len(diff) > 1:
        raise InputError(
            "not a single-variable comparison: variants differ in "
            + ", ".join(diff) + "; change one parameter at a time"
        )
    if not diff:
        raise InputError("variants do not differ in any setting; nothing to compare")
    if parameter is not None and parameter != diff[0]:
        raise InputError(f"parameter '{parameter}' does not differ; the variants differ in {diff[0]}")
    param = diff[0]
    names = list(settings)
    base = baseline if baseline is not None else ("baseline" if "baseline" in names else names[0])
    if base not in settings:
        raise InputError(f"baseline variant '{base}' is not in column '{group}'")

    rng = np.random.default_rng(seed)
    # Past-the-range positions need one x axis for every variant.
    bx = np.unique(pd.to_numeric(runs[x], errors="coerce").dropna().to_numpy(float))
    curves: dict[str, VariantKnee] = {}
    boots: dict[str, _Noise] = {}
    for n in names:
        part = runs[runs[group].astype(str) == n]
        xv = pd.to_numeric(part[x], errors="coerce").to_numpy(float)
        yv = pd.to_numeric(part[y], errors="coerce").to_numpy(float)
        ok = np.isfinite(xv) & np.isfinite(yv)
        if ok.sum() == 0:
            raise InputError(f"runs: variant '{n}' has no numeric ({x}, {y}) rows")
        k = find_knee(xv[ok], yv[ok], plateau_tol=plateau_tol, noise_sd=noise_sd)
        b = _bootstrap(xv[ok], yv[ok], bx, n_boot, rng, plateau_tol, noise_sd)
        boots[n] = b
        curves[n] = VariantKnee(
            variant=n, settings=settings[n], knee_x=k.knee_x, peak_x=k.peak_x, peak_y=k.peak_y,
            declines=k.declines, decline_pct=k.decline_pct, knee_range=_range(b.knees),
            levels=len(k.points), points=k.points, sustained_end=k.sustained_end,
            decline_onset=k.decline_onset, sustained_range=_range(b.turns),
            repeats=max(p.n for p in k.points), noise_sd=k.noise_sd,
            noise_source=k.noise_source,
        )

    b0 = curves[base]
    shifts: list[KneeShift] = []
    for n in names:
        if n == base:
            continue
        c = curves[n]
        shift = _knee_pos(c.knee_x, bx) - _knee_pos(b0.knee_x, bx)
        turn_shift = _turn_pos(c, bx) - _turn_pos(b0, bx)
        knee_move = _moved(shift, c.knee_range, b0.knee_range)
        turn_move = _moved(turn_shift, c.sustained_range, b0.sustained_range)
        right_by = [name for name, m in (("knee", knee_move), ("sustained range", turn_move))
                    if m == "right"]
        moves_right = shift > 0 or turn_shift > 0
        v0, v1 = settings[base].get(param), settings[n].get(param)
        direction = None
        if isinstance(v0, int | float) and isinstance(v1, int | float) and not (
            isinstance(v0, bool) or isinstance(v1, bool)
        ):
            direction = "lower" if v1 < v0 else "higher"
        elif v0 != v1:
            direction = f"{v0} -> {v1}"
        shifts.append(KneeShift(
            variant=n, value=v1, baseline_value=v0, change=direction,
            knee_x=c.knee_x, baseline_knee_x=b0.knee_x, shift=shift,
            knee_beyond_noise=knee_move is not None,
            sustained_end=c.sustained_end, baseline_sustained_end=b0.sustained_end,
            decline_onset=c.decline_onset, baseline_decline_onset=b0.decline_onset,
            sustained_shift=turn_shift, sustained_beyond_noise=turn_move is not None,
            moves_right=moves_right, moved_right_by=right_by,
            beyond_noise=bool(right_by) if moves_right else (
                knee_move is not None or turn_move is not None),
            peak_gain_pct=(100.0 * (c.peak_y - b0.peak_y) / b0.peak_y
                           if b0.peak_y else math.nan),
        ))
    notes = []
    if any(v.knee_x is None for v in curves.values()):
        notes.append("a curve still rising at its last level has its knee past the range")
    if any(v.decline_onset is None for v in curves.values()):
        notes.append("a curve that holds to its last level has its sustained range extend past "
                     "the range")
    return KneeComparison(
        parameter=param, baseline=base, baseline_value=settings[base].get(param),
        variants=[curves[n] for n in names], shifts=shifts,
        knee_moves_right=any(s.moves_right for s in shifts),
        beyond_noise=any(bool(s.moved_right_by) for s in shifts),
        noise_method="; ".join(sorted({b.method for b in boots.values()})), notes=notes,
    )


def moved_right_by(shifts: Sequence[KneeShift]) -> list[str]:
    """What moved right beyond noise in any variant: "knee", "sustained range" (sorted)."""
    return sorted({b for s in shifts for b in s.moved_right_by})


def moved_right_words(by: list[str], past: bool = False) -> str:
    """What moved right beyond noise, in words that agree with the per-variant knees: when only
    the end of the sustained range moved, the knee did not move beyond noise, and saying "the
    knee moves" would contradict the "knee 16 -> 16, within noise" said of it."""
    if by and "knee" not in by:
        return ("the end of the sustained range moved right beyond noise (the knee itself did "
                "not move beyond noise)" if past else "the end of the sustained range moves right "
                "beyond noise (the knee itself does not move beyond noise)")
    how = f" ({' and '.join(by)})" if by else ""
    return f"the knee {'moved' if past else 'moves'} right beyond noise{how}"
