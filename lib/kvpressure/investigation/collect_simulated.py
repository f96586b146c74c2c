"""Stage 01 on a simulation: the experiment's sweep (every concurrency level of every
comparison variant, with each of the comparison's workload seeds) is simulated into
``points/<variant>/c<C>/`` (the experiment's own seed) and ``runs.csv`` (every seed: the
run-to-run noise); the focus point's Prometheus view (``metrics.prom.jsonl``) is ingested into
``series.csv``, the same way a real server's scrapes are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.analysis.focus import focus_level
from kvpressure.errors import InputError
from kvpressure.folders.layout import BASELINE, SCRAPE_FILES
from kvpressure.folders.output_folder import file_sha256
from kvpressure.folders.run_folder import RunFolder, display_path
from kvpressure.investigation.lengths import length_stats
from kvpressure.investigation.windows import steady_window
from kvpressure.stages.files import as_result
from kvpressure.stages.results import CollectInfo


def _run_sweep(experiment: Any, run_dir: Path, jobs: int, progress: Callable[[str], None]
               ) -> pd.DataFrame:
    from kvpressure.sweeps.sweep import run_sweep

    return run_sweep(experiment, run_dir, progress=progress, jobs=jobs)


def _describe_length(spec: Any) -> str:
    if spec is None:
        return "from the trace"
    data = spec.model_dump() if hasattr(spec, "model_dump") else dict(spec)
    kind = data.pop("type", None) or data.pop("kind", None) or type(spec).__name__
    args = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in data.items() if v is not None)
    return f"{kind} ({args})" if args else str(kind)


def _point_dir(run_dir: Path, variant: str, concurrency: int | None,
               request_rate: float | None = None) -> Path:
    from kvpressure.sweeps.sweep import point_folder

    return run_dir / point_folder(variant, concurrency, request_rate)


def collect_simulation(run_dir: Path, experiment_path: str, focus_concurrency: int,
                        jobs: int, progress: Callable[[str], None], *,
                        focus_request_rate: float = 0.0) -> CollectInfo:
    from kvpressure.ingestion.api import ingest
    from kvpressure.simulation.experiment import load_experiment

    exp = load_experiment(experiment_path)
    rates = exp.mode != "closed"
    if rates and not exp.request_rates:
        raise InputError(f"{experiment_path}: the investigation sweeps load levels (closed-loop "
                         "concurrency or request_rates); this experiment is one open loop "
                         "(stages, or a trace's own arrival times): give workload.request_rates")
    x = "request_rate" if rates else "concurrency"
    src = Path(exp.path) if exp.path else Path(experiment_path)
    folder = RunFolder(run_dir)
    folder.copy_experiment(src)
    runs = _run_sweep(exp, run_dir, jobs, progress)
    if not folder.has_runs():
        folder.write_runs(runs)
    runs = folder.runs()
    variants = [str(v) for v in pd.unique(runs["variant"])]
    base = BASELINE if BASELINE in variants else variants[0]
    focus_variant = exp.config.focus.variant if exp.config.focus.variant in variants else base
    base_runs = runs[runs["variant"].astype(str) == focus_variant]
    if rates:
        requested = focus_request_rate or exp.config.focus.request_rate
        level, why = focus_level(base_runs, requested, x)
        point = _point_dir(run_dir, focus_variant, None, level)
    else:
        requested = focus_concurrency or exp.config.focus.concurrency
        level, why = focus_level(base_runs, requested)
        point = _point_dir(run_dir, focus_variant, level)
    scrape = next((point / n for n in SCRAPE_FILES if (point / n).is_file()), None)
    if scrape is None:
        raise InputError(f"{point}: the sweep wrote no metrics.prom.jsonl for the focus point")
    run_name = f"{focus_variant}/{point.name}"
    ingested = ingest([scrape], run=run_name)
    folder.write_series(ingested.series)
    folder.write_ingest(ingested.report.to_dict())
    requests = pd.read_csv(point / "requests.csv")
    t0, t1 = steady_window(requests, ingested.series)
    settings = exp.settings()
    hw, tp = exp.hardware, exp.config.tensor_parallel_size
    cmp = exp.config.comparison
    spec = exp.config.workload
    axis: dict[str, Any] = {}
    if rates:
        axis = {"level_axis": x,
                "request_rates": sorted(float(r) for r in base_runs[x].unique())}
    return as_result(CollectInfo, {
        **axis,
        "mode": "simulation",
        "name": exp.name,
        "description": exp.description,
        "inputs": [{"path": display_path(src), "sha256": file_sha256(src)}],
        "seed": int(spec.seed),
        "seeds": [int(x) for x in exp.seeds],
        "model_name": exp.model_name,
        "baseline_variant": base,
        "variants": variants,
        "variant_settings": {v: _variant_settings(exp, v) for v in variants},
        "comparison_parameter": cmp.parameter if cmp else None,
        "comparison_variants": [v for v in exp.variants() if v != BASELINE and v in variants],
        "concurrency_levels": [] if rates else sorted(int(c) for c in
                                                       base_runs["concurrency"].unique()),
        "settings": settings,
        "settings_from": _settings_from(exp, settings),
        "server_platform": f"simulated {hw.device_name}" + (f" x{tp} (TP {tp})" if tp > 1 else ""),
        "server_platform_from": f"the hardware profile {hw.name}",
        "latency_fidelity": _latency_fidelity(hw.name),
        "load_tool": f"the simulation's {'closed' if exp.mode == 'closed' else 'open'}-loop "
                     "clients",
        "num_requests": int(len(requests)),
        "input_len_distribution": length_stats(
            requests["prompt_len"], _describe_length(spec.input_len), "requests.csv (exact)"),
        "output_len_distribution": length_stats(
            requests["output_len"], _describe_length(spec.output_len), "requests.csv (exact)"),
        "focus": {"variant": focus_variant, "concurrency": None if rates else level,
                  "run": run_name, "why": why, "t0": t0, "t1": t1,
                  "point_dir": str(point.relative_to(run_dir)),
                  **({"request_rate": level} if rates else {})},
    })


def _settings_from(exp: Any, settings: dict[str, Any]) -> dict[str, str]:
    """Where each simulated engine setting came from: the experiment's engine section, the
    pool sized from its profiles (as vLLM sizes it), else vLLM's default."""
    from kvpressure import VLLM_BEHAVIOUR_VERSION

    given = exp.config.engine.model_fields_set
    out = {}
    for key in settings:
        if key in given:
            out[key] = f"the experiment ({exp.name})"
        elif key == "num_gpu_blocks":
            out[key] = (f"sized from the hardware profile {exp.hardware.name} and the model "
                        "profile, as vLLM sizes the pool")
        elif key == "block_size":
            out[key] = f"the hardware profile {exp.hardware.name}'s default"
        else:
            out[key] = f"vLLM {VLLM_BEHAVIOUR_VERSION} default"
    return out


def _variant_settings(exp: Any, variant: str) -> dict[str, Any]:
    overrides = exp.variants(include_remedies=True).get(variant, {})
    return exp.settings(overrides)


def _latency_fidelity(hardware: str) -> dict[str, Any]:
    from kvpressure.profiles.fidelity import latency_fidelity
    from kvpressure.report.sentences import latency_fidelity_sentence

    got = latency_fidelity(hardware)
    return {**got, "statement": latency_fidelity_sentence(got)}
