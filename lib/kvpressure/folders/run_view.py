"""What one run folder says for ``kvpressure compare``: its baseline curve, engine settings and
versions (:class:`kvpressure.analysis.two_runs.RunFolderView`), read through :class:`RunFolder`.

A report, sweep, ingest or collect folder; a collect folder keeps its tables in ``report/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpressure.analysis.two_runs import RunFolderView
from kvpressure.errors import InputError
from kvpressure.folders.layout import RUNS_CSV
from kvpressure.folders.run_folder import RunFolder
from kvpressure.stages.results import CollectInfo


def tables_folder(path: str | Path) -> RunFolder:
    """The folder holding ``path``'s tables: ``path`` itself or its ``report/``."""
    path = Path(path)
    for candidate in (RunFolder(path), RunFolder(path / "report")):
        if candidate.has_runs():
            return candidate
    raise InputError(f"{path}: no {RUNS_CSV} here or in its report/ (give a report, sweep, "
                     "ingest or collect folder)")


def read_run_view(path: str | Path, label: str) -> RunFolderView:
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a folder")
    folder = tables_folder(path)
    runs = folder.runs()
    if "concurrency" not in runs or "output_throughput" not in runs:
        raise InputError(f"{folder.runs_path}: needs the columns concurrency and "
                         "output_throughput")
    runs = runs.dropna(subset=["concurrency", "output_throughput"])
    if "variant" in runs:
        base = "baseline" if (runs["variant"] == "baseline").any() else runs["variant"].iloc[0]
        runs = runs[runs["variant"] == base]
    if runs.empty:
        raise InputError(f"{folder.runs_path}: no level with a concurrency and a throughput")
    settings: dict[str, Any] = {}
    versions: dict[str, str] = {}
    status = None
    if folder.has_stage(CollectInfo):
        info = folder.stage(CollectInfo)
        settings = dict(info.settings)
        if info.server_version:
            versions["vLLM served"] = info.server_version
    engine = next((p / "engine.json" for p in (path, folder.path)
                   if (p / "engine.json").is_file()), None)
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
    if folder.record_path.is_file():
        from kvpressure.record.io import load_record

        rec = load_record(folder.record_path)
        status = rec.status
        versions["kvpressure"] = rec.provenance.kit_version
        if rec.provenance.vllm_version_served:
            versions["vLLM served"] = rec.provenance.vllm_version_served
    return RunFolderView(label, str(path), runs, settings, versions, status)
