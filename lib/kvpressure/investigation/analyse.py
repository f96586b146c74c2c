"""Stages 01-06 in one process, without Jupyter: the same library calls the notebooks make, in
the same order, writing the same ``analysis/*.json`` and ``record.yaml``.

The notebooks remain the readable report; this is the path for tests and for callers that want
the record only (a property test can feed it hundreds of inputs in the time one papermill run
takes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.folders.layout import RECORD_YAML
from kvpressure.folders.run_folder import write_stage
from kvpressure.investigation.collect import collect, load_tables
from kvpressure.stages.files import has_stage, read_stages
from kvpressure.stages.results import CollectInfo


def analyse(
    run_dir: str | os.PathLike[str],
    experiment: str | os.PathLike[str] = "",
    source: Any = "",
    *,
    focus_concurrency: int = 0,
    focus_request_rate: float = 0.0,
    engine_args: Mapping[str, Any] | None = None,
    model_name: str = "",
    bench_timezone: str = "",
    columns: Any = "",
    log_year: int = 0,
    log_timezone: str = "",
    simulate_remedies: bool = False,
) -> Path:
    """Collect (when an experiment or source is given; else reuse the run folder's stage 01),
    analyse and write the record; returns the path of ``record.yaml``."""
    from kvpressure.investigation.record import build_record
    from kvpressure.investigation.stages import (
        compare_stage,
        interference_stage,
        knee_stage,
        recompute_stage,
    )
    from kvpressure.investigation.verdict import record_stage
    from kvpressure.record.io import write_record

    if experiment or source:
        collect(run_dir, experiment, source, focus_concurrency=focus_concurrency,
                focus_request_rate=focus_request_rate,
                engine_args=engine_args, model_name=model_name, bench_timezone=bench_timezone,
                columns=columns, log_year=log_year, log_timezone=log_timezone, progress=None)
    elif not has_stage(run_dir, CollectInfo):
        raise InputError(f"{os.fspath(run_dir)}: not a run folder (no analysis/collect.json); "
                         "give --experiment or --source")
    tables = load_tables(run_dir)
    write_stage(run_dir, recompute_stage(tables).result)
    write_stage(run_dir, knee_stage(tables).result)
    write_stage(run_dir, compare_stage(tables).result)
    write_stage(run_dir, interference_stage(tables).result)
    write_stage(run_dir, record_stage(tables, run_dir, simulate_remedies=simulate_remedies).result)
    path = f"{os.fspath(run_dir)}/{RECORD_YAML}"
    return write_record(build_record(read_stages(run_dir), where=path), path)
