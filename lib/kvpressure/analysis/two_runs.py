"""Two run folders side by side (``kvpressure compare RUN_A RUN_B``): before and after a
change, two servers, two vLLM versions.

Each folder's baseline curve (``runs.csv``: a report, sweep, ingest or collect folder, read by
:mod:`kvpressure.folders.run_view`) is taken as one variant of a comparison whose changed "setting" is the folder, so its knee, its
sustained range and whether either moved beyond the run-to-run noise come from the same rule
as the single-variable comparison (``analysis/compare.py``: repeats bootstrapped, else the
curves' own roughness). Beside the curves: throughput and preemptions per level, and what
differs between the two in engine settings and versions, as far as each folder says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.jsonable import to_jsonable

_PER_LEVEL = ("output_throughput", "preemptions", "ttft_p95_s", "itl_p95_s")


@dataclass
class RunFolderView:
    """What one folder says: its baseline curve, engine settings and versions."""

    label: str
    path: str
    runs: pd.DataFrame
    settings: dict[str, Any]
    versions: dict[str, str]
    status: str | None


@dataclass
class TwoRuns:
    a: str
    b: str
    knees: dict[str, Any]
    """The comparison's per-run curves and shifts (``KneeComparison`` as plain values)."""
    levels: list[dict[str, Any]]
    settings_changed: dict[str, list[Any]]
    versions_changed: dict[str, list[Any]]
    status: list[str | None]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)


def _changed(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """Keys whose values differ where both folders say (a key one of them lacks is unknown
    there, not a change)."""
    return {k: [a[k], b[k]] for k in sorted(set(a) & set(b)) if a[k] != b[k]}


Z90 = 1.645


def _var(noise: tuple[dict[float, tuple[float, int]], float | None], level: float) -> float:
    """The variance of a level's mean: its repeats' (sd^2 / n), else the curve's noise^2."""
    points, curve_sd = noise
    sd, n = points.get(float(level), (math.nan, 1))
    if n > 1 and sd is not None and math.isfinite(sd):
        return sd * sd / n
    return curve_sd * curve_sd if curve_sd is not None else math.nan


def _level_means(runs: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in _PER_LEVEL if c in runs]
    return runs.groupby("concurrency")[cols].mean()


def compare_run_folders(va: RunFolderView, vb: RunFolderView) -> TwoRuns:
    """The two folders' curves, knees with their noise, per-level figures and what differs
    (each folder as :func:`kvpressure.folders.run_view.read_run_view` read it)."""
    from kvpressure.analysis.compare import compare_variants

    # The knees are compared on the levels both measured: a curve cut short has no knee "past
    # its range" that the other's range would place.
    shared = sorted(set(va.runs["concurrency"]) & set(vb.runs["concurrency"]))
    if len(shared) < 3:
        raise InputError(f"{va.path} and {vb.path} share {len(shared)} concurrency level(s) "
                         f"({', '.join(f'{c:g}' for c in shared) or 'none'}); comparing two "
                         "curves needs at least 3 in common")
    both = pd.concat([va.runs.assign(run_folder="A"), vb.runs.assign(run_folder="B")],
                     ignore_index=True)
    both = both[both["concurrency"].isin(shared)]
    cmp = compare_variants(both, {"A": {"run_folder": "A"}, "B": {"run_folder": "B"}},
                           baseline="A", group="run_folder")
    knees = to_jsonable(cmp.model_dump())
    ma, mb = _level_means(va.runs), _level_means(vb.runs)
    # One measurement's noise at a level: its repeats' spread, else the curve's (compare.py).
    noise = {v["variant"]: ({p["x"]: (p["sd"], p["n"]) for p in v["points"]}, v["noise_sd"])
             for v in knees["variants"]}
    levels = []
    for c in sorted(set(ma.index) | set(mb.index)):
        row: dict[str, Any] = {"concurrency": int(c)}
        for col in _PER_LEVEL:
            x = ma[col].get(c) if col in ma else None
            y = mb[col].get(c) if col in mb else None
            row[col] = [x, y]
        x, y = row["output_throughput"]
        if x and y is not None and math.isfinite(x) and math.isfinite(y):
            row["output_throughput_change_pct"] = 100.0 * (y / x - 1.0)
            half = Z90 * math.sqrt(sum(_var(noise[k], c) for k in ("A", "B")))
            row["beyond_noise"] = bool(abs(y - x) > half) if math.isfinite(half) else None
        levels.append(row)
    notes = []
    only = sorted(set(ma.index) ^ set(mb.index))
    if only:
        notes.append("levels measured in one folder only (in the table, not in the knees): "
                     + ", ".join(f"{c:g}" for c in only))
    if not (va.settings and vb.settings):
        notes.append("engine settings unknown for "
                     + " and ".join(v.label for v in (va, vb) if not v.settings)
                     + ": what changed between them is not known from the data")
    return TwoRuns(va.path, vb.path, knees, levels, _changed(va.settings, vb.settings),
                   _changed(va.versions, vb.versions), [va.status, vb.status], notes)
