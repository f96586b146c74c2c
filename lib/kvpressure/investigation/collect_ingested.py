"""Stage 01 on ingested data: each source is read with :func:`kvpressure.ingestion.api.ingest`.
A source folder laid out as ``<variant>/c<C>/metrics.prom.jsonl`` (what a sweep writes) becomes
one run per point, with its variant and concurrency taken from the path."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.analysis.focus import focus_level
from kvpressure.errors import InputError
from kvpressure.folders.layout import BASELINE, SCRAPE_FILES
from kvpressure.folders.output_folder import file_sha256
from kvpressure.folders.run_folder import RunFolder, display_path
from kvpressure.ingestion.cache_config import cache_config
from kvpressure.ingestion.collect_folder import CollectFolder
from kvpressure.ingestion.collect_folder import expand as expand_collect_folders
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.provenance import load_tool, served_platform, served_version
from kvpressure.ingestion.server_log import engine_args_from_reports, log_notes
from kvpressure.ingestion.source_kind import SourceKind
from kvpressure.investigation.lengths import (
    bench_lengths,
    bench_source,
    keep_mean,
    length_from_histogram,
    unmeasured,
)
from kvpressure.investigation.windows import ingested_window
from kvpressure.jsonable import to_jsonable
from kvpressure.stages.files import as_result
from kvpressure.stages.results import CollectInfo

_LEVEL = re.compile(r"^(?:c|concurrency[-_=]?)(\d+)$")
# What the stages read from a point's scrapes: the analysis' families and the length histograms.
_LENGTH_HISTOGRAMS = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens")


def _families() -> list[str]:
    from kvpressure.ingestion.names import ANALYSIS_FAMILIES

    return [*ANALYSIS_FAMILIES, *_LENGTH_HISTOGRAMS]


_INGESTED_FAMILIES = _families()


def _point_of(path: Path) -> tuple[str, int | None]:
    """(variant, concurrency) from a path like ``.../<variant>/c64/metrics.prom.jsonl``."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        m = _LEVEL.match(parts[i])
        if m:
            variant = parts[i - 1] if i > 0 else BASELINE
            return variant, int(m.group(1))
    return BASELINE, None


def _scrape_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    found = sorted(p for n in SCRAPE_FILES for p in source.rglob(n))
    return found


def _parse_variant(name: str) -> dict[str, Any]:
    import yaml

    out = {}
    for part in name.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = yaml.safe_load(value)
    return out


LOAD_TEST = "load_test"  # the run a continuous scrape log and its bench results share


def _kinds(sources: list[str]) -> set[SourceKind]:
    from kvpressure.ingestion.sources import detect

    return {src.kind for s in sources for src in detect(s)}


def _run_names(runs: pd.DataFrame) -> list[str]:
    """``<variant>/c<C>`` per row (``#2``, ``#3`` for repeated runs of a level); rows of an
    unknown concurrency keep their ingested name."""
    names: list[str] = []
    seen: dict[Any, int] = {}
    for _, r in runs.iterrows():
        c = r["concurrency"]
        name = str(r["run"]) if pd.isna(c) else f"{r['variant']}/c{int(c)}"
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


def collect_ingested(run_dir: Path, sources: list[str], focus_concurrency: int,
                      engine_args: Mapping[str, Any], model_name: str,
                      bench_timezone: str = "", columns: Any = "", log_year: int = 0,
                      log_timezone: str = "", *, focus_request_rate: float = 0.0
                      ) -> CollectInfo:
    """Ingested data in one of four shapes:

    * scrape folders laid out as ``<variant>/c<C>/metrics.prom.jsonl``: one run per point;
    * ``vllm bench serve`` results plus a scrape log recorded through the whole load test: one
      run per bench result, its engine metrics cut from the log at the bench run's time window;
    * bench results alone: the curve and latencies, no engine metrics;
    * one scrape log of one load level: the engine metrics, no curve (``focus_concurrency``
      names the level when it is known).
    """
    from kvpressure.ingestion.api import ingest

    given_sources = list(sources)  # re-analysis expands them again
    sources, collected = expand_collect_folders(given_sources)
    given = dict(engine_args)
    recorded, recorded_from = _recorded_engine_args(collected, given)
    engine_args = {**recorded, **given}
    model_name = model_name or next((f.model_name for f in collected if f.model_name), "")
    files: list[tuple[Path, str, int | None]] = []
    others: list[str] = []
    for s in sources:
        path = Path(s)
        scrapes = _scrape_files(path) if path.is_dir() else []
        if scrapes and any(_point_of(p)[1] is not None for p in scrapes):
            files.extend((p, *_point_of(p)) for p in scrapes)
        else:
            others.append(s)
    folder = RunFolder(run_dir)
    folder.write_sources(given_sources)
    inputs = []
    rows = []
    focus_series: dict[str, pd.DataFrame] = {}
    reports: dict[str, Any] = {}
    for path, variant, level in files:
        run_name = f"{variant}/c{level}"
        res = ingest([path], run=run_name, options=IngestOptions(metrics=_INGESTED_FAMILIES),
                     engine=EngineFacts.from_settings({**engine_args, **_parse_variant(variant)}))
        row = res.runs.iloc[0].to_dict()
        row.update(run=run_name, variant=variant, concurrency=level)
        rows.append(row)
        focus_series[run_name] = res.series
        reports[run_name] = res.report.to_dict()
        inputs.append({"path": display_path(path), "sha256": file_sha256(path)})
    kinds = _kinds(others) if others else set()
    has_bench = SourceKind.BENCH in kinds
    has_scrapes = bool(kinds - {SourceKind.BENCH}) or bool(files)
    shared_log = has_bench and bool(kinds - {SourceKind.BENCH})
    matched = "scrape folders laid out by point" if files else None
    if others:
        # A log recorded through the whole load test and its bench results are one run, so
        # ingestion cuts the log at each bench run's time window.
        options = IngestOptions(metrics=_INGESTED_FAMILIES, bench_timezone=bench_timezone or None,
                                columns=columns or None, log_year=log_year or None,
                                log_timezone=log_timezone or None)
        res = ingest(others, run=LOAD_TEST if shared_log else None, options=options,
                     engine=EngineFacts.from_settings(engine_args))
        for _, r in res.runs.iterrows():
            rows.append(r.to_dict())
        for run_name in pd.unique(res.series["run"]) if len(res.series) else []:
            focus_series[str(run_name)] = res.series[res.series["run"] == run_name]
        reports["other"] = res.report.to_dict()
        if shared_log:
            matched = ("each bench run's time window ('date' - 'duration', in "
                       f"{bench_timezone or 'local time'}) cut from one continuous scrape log")
        elif has_bench:
            matched = "bench results only (no engine metrics)"
        elif not files:
            matched = "one scrape log per run"
        for s in others:
            for p in ([Path(s)] if Path(s).is_file() else sorted(Path(s).rglob("*"))):
                if p.is_file():
                    inputs.append({"path": display_path(p), "sha256": file_sha256(p)})
    declared = sorted({f for r in reports.values() for run in r.get("runs", {}).values()
                       for f in run.get("declared_without_samples", [])})
    if not rows:
        raise InputError(
            f"{', '.join(sources)}: no measured run found"
            + (f": {len(declared)} metric families are declared (# TYPE) without a single "
               "sample, so nothing was measured; scrape the server while it serves"
               if declared else ""))
    runs = pd.DataFrame(rows)
    runs["variant"] = runs["variant"].fillna(BASELINE).replace({"default": BASELINE})
    runs["concurrency"] = pd.to_numeric(runs["concurrency"], errors="coerce")
    if focus_concurrency and runs["concurrency"].isna().all() and len(runs) == 1:
        # One scrape log of one load level: the level is what the user says it was.
        runs["concurrency"] = float(focus_concurrency)
    axis, cap = _level_axis(runs)
    runs = runs.sort_values(["variant", axis], kind="stable").reset_index(drop=True)
    source_run = runs["run"].astype(str).tolist()
    runs["run"] = _run_names(runs)
    folder.write_runs(runs)
    variants = [str(v) for v in pd.unique(runs["variant"])]
    base = BASELINE if BASELINE in variants else variants[0]
    base_runs = runs[runs["variant"] == base]
    rates = axis == "request_rate"
    measured = base_runs.dropna(subset=[axis])
    if measured.empty and len(base_runs) > 1:
        rates = pd.to_numeric(base_runs.get("request_rate", pd.Series(dtype=float)),
                              errors="coerce")
        raise InputError(
            f"{', '.join(sources)}: {len(base_runs)} runs and no concurrency levels; lay scrapes "
            "out as <variant>/c<concurrency>/metrics.prom.jsonl or give vllm bench results"
            + ("; these runs are request-rate levels, not concurrency levels (kvpressure knee "
               "--x request_rate reads their curve; kvpressure ingest, then kvpressure twin on "
               "its folder with the server's log, fits and checks the open loop's twin and "
               "predicts the remedies at those rates)" if rates.notna().any() else "")
        )
    if measured.empty:
        level, why = None, ("the concurrency is not known (the metrics do not carry it; "
                            "give focus_concurrency)")
        focus_row = base_runs.iloc[0]
    elif rates:
        level, why = focus_level(measured, focus_request_rate or None, axis)
        focus_row = measured[measured[axis] == level].iloc[0]
    else:
        level, why = focus_level(measured, focus_concurrency)
        focus_row = measured[measured["concurrency"] == level].iloc[0]
    run_name = str(focus_row["run"])
    series = focus_series.get(source_run[int(focus_row.name)])
    load: dict[str, Any] = {"idle": None, "snapshot": False, "notes": []}
    if declared:
        load["notes"].append(
            f"{len(declared)} metric famil{'y is' if len(declared) == 1 else 'ies are'} declared "
            f"without samples, so missing (not zero): {', '.join(declared)}")
    win = ingested_window(focus_row, series, run_name, cap if rates else level,
                          shared_log=shared_log,
                          log_origin=_counter_origin(reports, source_run[int(focus_row.name)]),
                          bench_timezone=bench_timezone)
    series, (t0, t1), (g0, g1), origin = win.series, win.counters, win.gauges, win.origin
    load.update(idle=win.idle, snapshot=win.snapshot, notes=[*load["notes"], *win.notes])
    folder.write_series(series)
    folder.write_ingest(to_jsonable({"runs": reports}))
    engine_metrics = bool(len(series))
    geometry = cache_config(series) if engine_metrics else {}
    # A server log shows some engine arguments (max_num_seqs...); what the user gives wins.
    logged = engine_args_from_reports(reports)
    settings = {**geometry, **logged, **dict(engine_args)}
    settings_from = {**dict.fromkeys(geometry, "vllm:cache_config_info"),
                     **dict.fromkeys(logged, "the server log's start-up arguments"),
                     **recorded_from, **dict.fromkeys(given, "given (engine_args)")}
    load["notes"].extend(log_notes(reports))
    variant_settings = {}
    for v in variants:
        variant_settings[v] = {**settings, **_parse_variant(v)} if v != base else dict(settings)
    params = sorted({k for v in variants if v != base for k in _parse_variant(v)})
    bench_file = bench_source(focus_row.get("source"))
    lengths = bench_lengths(bench_file) if bench_file else {}
    # The whole log from the process start counts from zero; a window cut from it does not.
    from_start = not shared_log
    for key, base_name in (("input_len_distribution", "vllm:request_prompt_tokens"),
                           ("output_len_distribution", "vllm:request_generation_tokens")):
        bench_len = lengths.get(key)
        if (bench_len is None or bench_len["p50"] is None) and engine_metrics:
            hist = length_from_histogram(series, base_name, None if from_start else t0, t1)
            if hist["mean"] is not None:
                lengths[key] = hist | keep_mean(bench_len or {})
        lengths.setdefault(key, unmeasured(base_name))
    model = (model_name or (_model_name(series) if engine_metrics else None)
             or _dropped_model_name(reports) or _first(runs.get("model")) or "unknown model")
    served = served_version(reports, sources)
    platform = served_platform(reports, sources)
    return as_result(CollectInfo, {
        "mode": "ingested",
        "server_version": served[0] if served else None,
        "server_version_from": served[1] if served else None,
        "server_platform": platform[0] if platform else None,
        "server_platform_from": platform[1] if platform else None,
        "load_tool": load_tool(sources, [
            s["location"] for s in (reports.get("other") or {}).get("sources", [])
            if s.get("kind") == SourceKind.BENCH]),
        "settings_from": settings_from,
        "name": run_dir.name,
        "description": "ingested metrics",
        "inputs": inputs,
        "seed": None,
        "seeds": None,
        "model_name": model,
        "baseline_variant": base,
        "variants": variants,
        "variant_settings": variant_settings,
        "comparison_parameter": params[0] if len(params) == 1 else None,
        "comparison_variants": [v for v in variants if v != base] if len(params) == 1 else [],
        "concurrency_levels": [] if rates else sorted(int(c) for c in
                                                       measured["concurrency"].unique()),
        "settings": settings,
        "num_requests": _finite_int(base_runs.loc[base_runs["run"] == run_name, "num_requests"]),
        "input_len_distribution": lengths["input_len_distribution"],
        "output_len_distribution": lengths["output_len_distribution"],
        "engine_metrics": engine_metrics,
        "bench_results": has_bench,
        "scrapes": has_scrapes,
        "matched": matched,
        "bench_timezone": bench_timezone or "local",
        "incomplete_levels": incomplete_levels(others),
        "focus": {"variant": base, "concurrency": None if rates else level, "run": run_name,
                  "why": why, "t0": t0, "t1": t1, "gauge_t0": g0, "gauge_t1": g1,
                  "point_dir": None, "counter_origin": origin,
                  **({"request_rate": level} if rates else {})},
        "load": load,
        **({"level_axis": axis, "max_concurrency": cap,
            "request_rates": sorted(float(r) for r in measured[axis].unique())} if rates else {}),
    })


def _level_axis(runs: pd.DataFrame) -> tuple[str, int | None]:
    """What the runs' levels are, and the concurrency cap of a request-rate sweep.

    Runs whose request rates differ (finite, as ``vllm bench serve --request-rate`` gives them)
    while the concurrency is one value or none are a request-rate sweep: an open loop, or one
    capped at that many requests in flight (``--max-concurrency``). Anything else is read on the
    concurrency axis, as before.
    """
    base = runs[runs["variant"] == (BASELINE if (runs["variant"] == BASELINE).any()
                                    else runs["variant"].iloc[0])]
    if "request_rate" not in runs.columns:
        return "concurrency", None
    rate = pd.to_numeric(runs["request_rate"], errors="coerce")
    rate = rate.where(np.isfinite(rate))  # inf: all at once, no rate level
    caps = pd.to_numeric(base["concurrency"], errors="coerce").dropna().unique()
    if rate[base.index].dropna().nunique() > 1 and len(caps) <= 1:
        runs["request_rate"] = rate
        return "request_rate", int(caps[0]) if len(caps) else None
    return "concurrency", None


def _counter_origin(reports: Mapping[str, Any], run: str) -> str:
    """The counter origin ingestion decided for ``run`` ("zero": the log starts with the
    process), "first" when it is not reported."""
    for report in reports.values():
        info = (report.get("runs") or {}).get(run) or {}
        origin = (info.get("counter_origin") or {}).get("origin")
        if origin:
            return str(origin)
    return "first"


def _recorded_engine_args(folders: list[CollectFolder], given: Mapping[str, Any]
                          ) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine arguments collect run folders recorded and not given, and where each came
    from; two folders that recorded different values for one argument are not one server's."""
    args: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for folder in folders:
        for key, value in folder.engine_args.items():
            if key in given:
                continue
            if key in args and args[key] != value:
                raise InputError(
                    f"{folder.path}: recorded {key}={value!r}, another source folder "
                    f"{args[key]!r} ({origin[key]}): report one server's runs at a time, or "
                    "give the value with --param 'engine_args={...}'")
            args[key] = value
            origin.setdefault(key, folder.engine_args_from[key])
    return args, origin


def _dropped_model_name(reports: Mapping[str, Any]) -> str | None:
    """The served model's name when ingestion dropped the ``model_name`` label (one model)."""
    for report in reports.values():
        for run in (report.get("runs") or {}).values():
            name = (run.get("dropped_labels") or {}).get("model_name")
            if name:
                return str(name)
    return None


def _first(values: Any) -> str | None:
    if values is None:
        return None
    for v in values:
        if isinstance(v, str) and v.strip():
            return v
    return None


def _finite_int(values: pd.Series) -> int | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return int(round(float(v.iloc[0]))) if len(v) else None


def _model_name(series: pd.DataFrame) -> str | None:
    from kvpressure.ingestion.labels import parse_labels

    for text in pd.unique(series["labels"].astype(str))[:50]:
        name = parse_labels(text).get("model_name")
        if name:
            return name
    return None


def incomplete_levels(sources: list[str]) -> list[dict[str, Any]]:
    """Levels ``kvpressure collect`` measured only in part (left off the curve), with why."""
    from kvpressure.ingestion.bench import load_results
    from kvpressure.ingestion.sources import detect

    out = []
    for s in sources:
        try:
            found = detect(s)
        except InputError:
            continue
        for src in found:
            if src.kind != SourceKind.BENCH:
                continue
            try:
                results = load_results(Path(src.location))
            except (InputError, OSError):
                continue
            for _, res in results:
                level = res.get("kvpressure_level") if isinstance(res, dict) else None
                if isinstance(level, dict) and level.get("complete") is False:
                    out.append({"concurrency": res.get("max_concurrency"),
                                "completed": res.get("completed"), "failed": res.get("failed"),
                                "reason": level.get("reason") or "no reason recorded",
                                "source": display_path(src.location)})
    return sorted(out, key=lambda lv: (lv["concurrency"] is None, lv["concurrency"] or 0))
