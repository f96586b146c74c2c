"""Two run folders side by side (``kvpressure compare RUN_A RUN_B``): before and after a
change, two servers, two vLLM versions.

Each folder's baseline curve (``runs.csv``: a report, sweep, ingest or collect folder) is read
as one variant of a comparison whose changed "setting" is the folder, so its knee, its
sustained range and whether either moved beyond the run-to-run noise come from the same rule
as the single-variable comparison (``analysis/compare.py``: repeats bootstrapped, else the
curves' own roughness). Beside the curves: throughput and preemptions per level, and what
differs between the two in engine settings and versions, as far as each folder says.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.jsonable import to_jsonable

RUNS_CSV = "runs.csv"
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


def runs_dir_of(path: Path) -> Path:
    for candidate in (path, path / "report"):
        if (candidate / RUNS_CSV).is_file():
            return candidate
    raise InputError(f"{path}: no {RUNS_CSV} here or in its report/ (give a report, sweep, "
                     "ingest or collect folder)")


def read_run_folder(path: str | Path, label: str) -> RunFolderView:
    from kvpressure.stages.files import has_stage, read_stage
    from kvpressure.stages.results import CollectInfo

    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a folder")
    run_dir = runs_dir_of(path)
    runs = pd.read_csv(run_dir / RUNS_CSV)
    if "concurrency" not in runs or "output_throughput" not in runs:
        raise InputError(f"{run_dir / RUNS_CSV}: needs the columns concurrency and "
                         "output_throughput")
    runs = runs.dropna(subset=["concurrency", "output_throughput"])
    if "variant" in runs:
        base = "baseline" if (runs["variant"] == "baseline").any() else runs["variant"].iloc[0]
        runs = runs[runs["variant"] == base]
    if runs.empty:
        raise InputError(f"{run_dir / RUNS_CSV}: no level with a concurrency and a throughput")
    settings: dict[str, Any] = {}
    versions: dict[str, str] = {}
    status = None
    if has_stage(run_dir, CollectInfo):
        info = read_stage(run_dir, CollectInfo)
        settings = dict(info.settings)
        if info.server_version:
            versions["vLLM served"] = info.server_version
    engine = next((p / "engine.json" for p in (path, run_dir) if (p / "engine.json").is_file()),
                  None)
    if engine is not None:
        data = json.loads(engine.read_text(encoding="utf-8"))
        settings = {**(data.get("engine_args") or {}), **settings}
        version = (data.get("server") or {}).get("version")
        if version:
            versions.setdefault("vLLM served", str(version))
    if not settings:
        # A sweep's runs.csv carries each run's engine settings as columns.
        from kvpressure.analysis.compare import SETTING_COLUMNS

        for col in (*SETTING_COLUMNS, "scheduling_policy", "async_scheduling"):
            values = runs[col].dropna().unique() if col in runs else []
            if len(values) == 1:
                settings[col] = values[0].item() if hasattr(values[0], "item") else values[0]
    record = run_dir / "record.yaml"
    if record.is_file():
        from kvpressure.record.io import load_record

        rec = load_record(record)
        status = rec.status
        versions["kvpressure"] = rec.provenance.kit_version
        if rec.provenance.vllm_version_served:
            versions["vLLM served"] = rec.provenance.vllm_version_served
    return RunFolderView(label, str(path), runs, settings, versions, status)


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


def compare_run_folders(a: str | Path, b: str | Path) -> TwoRuns:
    """The two folders' curves, knees with their noise, per-level figures and what differs."""
    from kvpressure.analysis.compare import compare_variants

    va, vb = read_run_folder(a, "A"), read_run_folder(b, "B")
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
