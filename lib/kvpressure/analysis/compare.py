"""Single-variable controlled comparison: does the knee move right when one setting changes?

Same request set, same concurrency levels, one engine argument changed (first
``max_num_seqs``; also ``gpu_memory_utilization``, ``max_num_batched_tokens``, ``max_model_len``,
``scheduler_reserve_full_isl``, ``watermark``). Each variant's curve gets its knee; the shift of
the knee is judged against run-to-run noise:

* with repeats (several rows per variant and level, e.g. one per seed), each level is resampled
  with replacement (bootstrap) and the knee recomputed;
* without repeats, a parametric bootstrap adds the curve's own noise estimate (``find_knee``'s
  ``noise_sd``) to the level means.

A shift is beyond noise when the variant's bootstrap knee range (5th-95th percentile) lies
entirely beyond the baseline's. A curve still rising at its last level has its knee beyond the
range (reported as ``None`` and ranked past the largest level).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvpressure.analysis.knee import find_knee
from kvpressure.analysis.recompute import to_jsonable
from kvpressure.errors import InputError

# Engine arguments a comparison may vary (and that runs.csv may carry as columns).
SETTING_COLUMNS = (
    "max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens", "max_model_len",
    "scheduler_reserve_full_isl", "watermark", "num_gpu_blocks", "block_size",
    "enable_chunked_prefill", "enable_prefix_caching", "policy", "long_prefill_token_threshold",
)


@dataclass
class VariantCurve:
    variant: str
    settings: dict
    knee_x: float | None
    peak_x: float
    peak_y: float
    declines: bool
    decline_pct: float
    knee_range: tuple[float, float]
    levels: int
    points: list[dict] = field(default_factory=list)


@dataclass
class Comparison:
    parameter: str
    baseline: str
    baseline_value: object
    variants: list[VariantCurve]
    shifts: list[dict]
    knee_moves_right: bool
    beyond_noise: bool
    noise_method: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return to_jsonable(self)


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


def _knee_pos(k: float | None, xs: np.ndarray) -> float:
    """Knee as a position on the x axis; a still-rising curve sits one step past the end."""
    if k is not None:
        return float(k)
    step = xs[-1] - xs[-2] if len(xs) > 1 else 1.0
    return float(xs[-1] + step)


def _bootstrap_knees(
    x: np.ndarray, y: np.ndarray, n_boot: int, rng: np.random.Generator, plateau_tol: float
) -> tuple[np.ndarray, str]:
    xs = np.unique(x)
    res = find_knee(x, y, plateau_tol=plateau_tol)
    repeats = any((x == v).sum() > 1 for v in xs)
    knees = []
    if repeats:
        groups = [y[x == v] for v in xs]
        for _ in range(n_boot):
            yy = np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])
            xx = np.concatenate([np.full(len(g), v) for g, v in zip(groups, xs, strict=True)])
            knees.append(_knee_pos(find_knee(xx, yy, plateau_tol=plateau_tol).knee_x, xs))
        return np.array(knees), "bootstrap over repeated measurements per level"
    sigma = res.noise_sd or 0.0
    ym = np.array([p["y"] for p in res.points])
    if sigma <= 0:
        return np.full(1, _knee_pos(res.knee_x, xs)), "no noise estimate (exact curve)"
    for _ in range(n_boot):
        yy = ym + rng.normal(0.0, sigma, size=len(ym))
        knees.append(_knee_pos(find_knee(xs, yy, plateau_tol=plateau_tol).knee_x, xs))
    return np.array(knees), "parametric bootstrap with the curve's residual noise"


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
) -> Comparison:
    """Per-variant knee and whether it moved right beyond noise, for one changed parameter.

    Raises InputError when more than one parameter differs between variants (naming them), when
    none does, or when ``parameter`` is given and is not the one that differs.
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
    curves: dict[str, VariantCurve] = {}
    boots: dict[str, np.ndarray] = {}
    methods = set()
    for n in names:
        part = runs[runs[group].astype(str) == n]
        xv = pd.to_numeric(part[x], errors="coerce").to_numpy(float)
        yv = pd.to_numeric(part[y], errors="coerce").to_numpy(float)
        ok = np.isfinite(xv) & np.isfinite(yv)
        if ok.sum() == 0:
            raise InputError(f"runs: variant '{n}' has no numeric ({x}, {y}) rows")
        k = find_knee(xv[ok], yv[ok], plateau_tol=plateau_tol)
        b, m = _bootstrap_knees(xv[ok], yv[ok], n_boot, rng, plateau_tol)
        methods.add(m)
        boots[n] = b
        curves[n] = VariantCurve(
            variant=n, settings=settings[n], knee_x=k.knee_x, peak_x=k.peak_x, peak_y=k.peak_y,
            declines=k.declines, decline_pct=k.decline_pct,
            knee_range=(float(np.percentile(b, 5)), float(np.percentile(b, 95))),
            levels=len(k.points), points=k.points,
        )

    bx = np.unique(pd.to_numeric(runs[x], errors="coerce").dropna().to_numpy(float))
    b0 = curves[base]
    shifts = []
    for n in names:
        if n == base:
            continue
        c = curves[n]
        shift = _knee_pos(c.knee_x, bx) - _knee_pos(b0.knee_x, bx)
        right = shift > 0 and c.knee_range[0] > b0.knee_range[1]
        left = shift < 0 and c.knee_range[1] < b0.knee_range[0]
        v0, v1 = settings[base].get(param), settings[n].get(param)
        direction = None
        if isinstance(v0, int | float) and isinstance(v1, int | float) and not (
            isinstance(v0, bool) or isinstance(v1, bool)
        ):
            direction = "lower" if v1 < v0 else "higher"
        elif v0 != v1:
            direction = f"{v0} -> {v1}"
        shifts.append({
            "variant": n, "value": v1, "baseline_value": v0, "change": direction,
            "knee_x": c.knee_x, "baseline_knee_x": b0.knee_x, "shift": shift,
            "moves_right": shift > 0, "beyond_noise": bool(right or left),
            "peak_gain_pct": (100.0 * (c.peak_y - b0.peak_y) / b0.peak_y
                              if b0.peak_y else math.nan),
        })
    notes = []
    if any(s["knee_x"] is None for s in shifts) or b0.knee_x is None:
        notes.append("a curve still rising at its last level has its knee past the range")
    return Comparison(
        parameter=param, baseline=base, baseline_value=settings[base].get(param),
        variants=[curves[n] for n in names], shifts=shifts,
        knee_moves_right=any(s["moves_right"] for s in shifts),
        beyond_noise=any(s["moves_right"] and s["beyond_noise"] for s in shifts),
        noise_method="; ".join(sorted(methods)), notes=notes,
    )
