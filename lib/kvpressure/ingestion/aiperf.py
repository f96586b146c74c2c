"""AIPerf exports (``aiperf profile``) -> ``runs`` rows, one per profile run.

``profile_export_aiperf.json`` holds one object per run: per metric tag
(``request_throughput``, ``output_token_throughput``, ``time_to_first_token``,
``inter_token_latency``, ``request_latency``, ``request_count``, ``benchmark_duration``...)
``{"unit", "avg", "p50", "p95", "p99", ...}`` in display units (``ms``, ``sec``,
``tokens/sec``, ``requests/sec``), and ``input_config`` (the user's settings). AIPerf 0.13
keeps the load in ``input_config.phases[]`` (the ``profiling`` phase's ``concurrency`` and
``request_rate``) and the model in ``input_config.models.items[].name``; earlier releases in
``input_config.loadgen`` and ``endpoint.model_names``. ``start_time``/``end_time`` are the
profiling phase's span in the local time of the machine AIPerf ran on; the server-metrics JSON
beside the export (``server_metrics_export.json``) holds the same span in unix nanoseconds
(``summary.phase_time_ranges.profiling``), which is preferred.

``profile_export_aiperf.csv`` has two sections: ``Metric,avg,min,max,p1,...,p99,std`` rows for
per-request metrics, a blank line, then ``Metric,Value`` rows for run-wide ones; a metric is
named by its header and unit (``Time to First Token (ms)``). It carries no settings: the
concurrency is read from the artifact folder AIPerf names after it (``...-concurrency16``,
0.13's ``concurrency_16``).

A sweep is one artifact folder per level (0.13: ``<artifact-dir>/concurrency_16/``, with
``profile_runs/trial_0001/`` levels for repeated trials; a run with a warm-up repeats its
export per phase under ``phases/profiling/`` and ``phases/warmup/``, not read again); pass the files or any folder above
them. The server's ``/metrics`` that AIPerf recorded beside each level
(``server_metrics_export.jsonl``, or ``.parquet``) is read too
(:mod:`kvpressure.ingestion.aiperf_metrics`).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.text_files import parse_json
from kvpressure.user_files import read_user_text

FORMAT = "aiperf"
NaN = math.nan
EXPORT_NAMES = ("profile_export_aiperf.json", "profile_export_aiperf.csv")
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}
_TAGS = ("request_throughput", "output_token_throughput", "time_to_first_token",
         "inter_token_latency", "request_latency")
# runs column -> (metric tag, statistic)
_METRICS = {
    "output_throughput": ("output_token_throughput", "avg"),
    "request_throughput": ("request_throughput", "avg"),
    "ttft_mean_s": ("time_to_first_token", "avg"),
    "ttft_p95_s": ("time_to_first_token", "p95"),
    "ttft_p99_s": ("time_to_first_token", "p99"),
    "itl_mean_s": ("inter_token_latency", "avg"),
    "itl_p95_s": ("inter_token_latency", "p95"),
    "itl_p99_s": ("inter_token_latency", "p99"),
    "e2e_mean_s": ("request_latency", "avg"),
    "e2e_p95_s": ("request_latency", "p95"),
    "e2e_p99_s": ("request_latency", "p99"),
    "num_requests": ("request_count", "avg"),
    "failed": ("error_request_count", "avg"),
    "duration_s": ("benchmark_duration", "avg"),
}
# CSV metric headers (without the unit) -> tag
_HEADERS = {
    "Request Throughput": "request_throughput",
    "Output Token Throughput": "output_token_throughput",
    "Time to First Token": "time_to_first_token",
    "Inter Token Latency": "inter_token_latency",
    "Request Latency": "request_latency",
    "Request Count": "request_count",
    "Error Request Count": "error_request_count",
    "Benchmark Duration": "benchmark_duration",
}
_LEVEL_IN_PATH = re.compile(r"concurrency[_=-]?(\d+)")
_RATE_IN_PATH = re.compile(r"request_rate[_=-]?(\d+(?:\.\d+)?)")
SERVER_METRICS_JSON = "server_metrics_export.json"
# The server-metrics time series, in the order they are preferred (the JSONL holds the values
# as scraped; the Parquet, deltas from the last scrape before the profiling phase).
SERVER_METRICS_SERIES = ("server_metrics_export.jsonl", "server_metrics_export.parquet")
# Everything else AIPerf writes into an artifact folder: read through the export, never as a
# source of its own (the server-metrics CSV would pass for a runs table).
ARTIFACT_FILES = frozenset({
    *EXPORT_NAMES, SERVER_METRICS_JSON, *SERVER_METRICS_SERIES, "server_metrics_export.csv",
    "inputs.json", "run_config.json", "profile_export.jsonl", "profile_export_raw.jsonl",
    "profile_export_console.txt", "profile_export_aiperf_timeslices.csv",
    "profile_export_aiperf_timeslices.json", "gpu_telemetry_export.jsonl", "outputs.json",
    ".aiperf_results_ready.json",
})
# Sweep-wide summaries beside the level folders: the levels' own exports are read instead.
_SUMMARY_DIRS = frozenset({"aggregate", "sweep_aggregate", "logs", "plots"})
_MAX_DEPTH = 4
_PHASES = "phases"


def is_export(obj: Any) -> bool:
    """An AIPerf JSON export: metric tags whose values carry a ``unit``, the output token
    throughput among them (without it there is no curve to read)."""
    if not isinstance(obj, dict):
        return False
    found = [t for t in _TAGS if isinstance(obj.get(t), dict) and "unit" in obj[t]]
    return "output_token_throughput" in found and len(found) >= 2


def is_csv(rows: list[list[str]]) -> bool:
    """AIPerf's CSV: ``Metric,avg,...`` or ``Metric,Value`` first."""
    head = [c.strip() for c in rows[0]]
    return head[:2] in (["Metric", "avg"], ["Metric", "Value"])


def _scale(unit: str, column: str) -> float:
    if column.endswith("_s"):
        factor = _TIME_UNITS.get(unit.strip().lower())
        if factor is None:
            raise InputError(f"unit '{unit}' of {column} is not a time unit")
        return factor
    return 1.0


def _finite(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else NaN


def _level_from_path(path: Path) -> tuple[float, float]:
    text = str(path.parent)
    c, r = _LEVEL_IN_PATH.findall(text), _RATE_IN_PATH.findall(text)
    return (float(c[-1]) if c else NaN), (float(r[-1]) if r else NaN)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _profiling_phase(config: dict[str, Any]) -> dict[str, Any]:
    """The measured phase of 0.13's ``phases[]`` (warm-up phases come before it)."""
    phases = [p for p in config.get("phases") or [] if isinstance(p, dict)]
    for phase in phases:
        if "profiling" in (phase.get("kind"), phase.get("name")):
            return phase
    kept = [p for p in phases if p.get("kind") != "warmup" and not p.get("exclude_from_results")]
    return kept[-1] if kept else {}


def _load(config: dict[str, Any]) -> tuple[float, float]:
    """(concurrency, request rate) the export's settings give, NaN where they say nothing."""
    phase = _profiling_phase(config)
    if phase:
        return _finite(phase.get("concurrency")), _finite(phase.get("request_rate"))
    loadgen = _dict(config.get("loadgen"))
    return _finite(loadgen.get("concurrency")), _finite(loadgen.get("request_rate"))


def _model(config: dict[str, Any]) -> str | None:
    items = _dict(config.get("models")).get("items")
    names = [i.get("name") for i in items if isinstance(i, dict)] if isinstance(items, list) \
        else _dict(config.get("endpoint")).get("model_names")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    return None


def _local_time(text: Any) -> float:
    """Unix seconds of AIPerf's ``start_time``/``end_time``: ISO date-times that it writes in
    the local time of its machine when they carry no offset."""
    if not isinstance(text, str):
        return NaN
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        return NaN
    return when.timestamp()  # naive: this machine's zone, as AIPerf wrote it


def _phase_span(folder: Path) -> tuple[float, float] | None:
    """The profiling phase's span in unix seconds from the server-metrics JSON beside the
    export (exact, whatever the zone), or None."""
    path = folder / SERVER_METRICS_JSON
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, RecursionError):
        return None
    span = _dict(_dict(_dict(doc).get("summary")).get("phase_time_ranges")).get("profiling")
    start, end = _finite(_dict(span).get("start_ns")), _finite(_dict(span).get("end_ns"))
    if math.isfinite(start) and math.isfinite(end) and end > start:
        return start / 1e9, end / 1e9
    return None


def _window(path: Path, obj: dict[str, Any], notes: list[str]) -> tuple[float, float] | None:
    span = _phase_span(path.parent)
    if span is not None:
        return span
    start, end = _local_time(obj.get("start_time")), _local_time(obj.get("end_time"))
    if math.isfinite(start) and math.isfinite(end) and end > start:
        notes.append(f"{path}: its start_time/end_time read in this machine's time zone (no "
                     f"{SERVER_METRICS_JSON} beside it with the span in unix time)")
        return start, end
    return None


def read(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    """The one runs row of an AIPerf export (JSON or CSV)."""
    text = read_user_text(path, "results file")
    window = None
    if text.lstrip().startswith("{"):
        obj = parse_json(text, path)
        if not isinstance(obj, dict):
            raise InputError(f"{path}: not an AIPerf export (a JSON object of metrics)")
        config = _dict(obj.get("input_config"))
        metrics = obj
        window = _window(path, obj, notes)
        if obj.get("is_complete") is False or obj.get("was_cancelled") is True:
            notes.append(f"{path}: AIPerf marks this run incomplete ("
                         f"{obj.get('incomplete_reason') or 'cancelled'}): its figures cover "
                         "what finished")
    else:
        metrics, config = _csv_metrics(path, text), {}
        window = _phase_span(path.parent)
    concurrency, rate = _load(config)
    from_path = _level_from_path(path)
    if math.isnan(concurrency) and math.isnan(rate):
        concurrency, rate = from_path
        if not math.isnan(concurrency):
            notes.append(f"{path}: concurrency {concurrency:g} read from the artifact folder's "
                         "name (the export does not carry it)")
    row: dict[str, Any] = {
        "run": run, "variant": "default", "concurrency": concurrency, "request_rate": rate,
        "model": _model(config), "date": None,
        "source": str(path), "_where": str(path),
    }
    if window is not None:
        # Unix seconds of the measured phase: matched to a scrape log without a time zone.
        row["window_start"], row["window_end"] = window
    for column, (tag, stat) in _METRICS.items():
        metric = metrics.get(tag)
        if not isinstance(metric, dict):
            row[column] = NaN
            continue
        try:
            factor = _scale(str(metric.get("unit", "")), column)
        except InputError as exc:
            raise InputError(f"{path}: {tag}: {exc}") from None
        row[column] = _finite(metric.get(stat)) * factor
    if math.isnan(row["failed"]) and not math.isnan(row["num_requests"]):
        row["failed"] = 0.0  # AIPerf leaves the error count out when there were none
    if math.isnan(row["output_throughput"]):
        notes.append(f"{path}: no output_token_throughput in the export")
    return [row]


def _csv_metrics(path: Path, text: str) -> dict[str, dict[str, Any]]:
    """The CSV's rows as the JSON export's ``{tag: {"unit", stat: value}}``."""
    metrics: dict[str, dict[str, Any]] = {}
    stats: list[str] = []
    for lineno, cells in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not any(c.strip() for c in cells):
            continue
        if cells[0].strip() == "Metric":
            stats = [c.strip() for c in cells[1:]]
            if stats == ["Value"]:
                stats = ["avg"]
            continue
        if not stats:
            raise InputError(f"{path}: line {lineno}: a metric row before any 'Metric,...' header")
        name = cells[0].strip()
        m = re.match(r"^(.*?)\s*(?:\(([^()]*)\))?$", name)
        header, unit = (m.group(1), m.group(2) or "") if m else (name, "")
        tag = _HEADERS.get(header)
        if tag is None:
            continue
        entry: dict[str, Any] = {"unit": unit or "requests"}
        for stat, cell in zip(stats, cells[1:], strict=False):
            try:
                entry[stat] = float(cell)
            except ValueError:
                entry[stat] = None
        metrics[tag] = entry
    return metrics


# ---------------------------------------------------------------------- artifact folders
def artifact_dirs(root: Path) -> list[Path]:
    """The artifact folders at or below ``root`` (one per level and trial of a sweep), in path
    order; the sweep's aggregate folders are left out (they repeat the levels)."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        level = any((folder / n).is_file() for n in EXPORT_NAMES)
        if level:
            found.append(folder)
        if depth >= _MAX_DEPTH:
            return
        try:
            subs = sorted(p for p in folder.iterdir() if p.is_dir())
        except OSError:
            return
        for sub in subs:
            if sub.name.startswith(".") or sub.name in _SUMMARY_DIRS:
                continue
            if sub.name == _PHASES:
                # A run with a warm-up also writes each phase's export under phases/: the
                # level's own export is its profiling phase; the warm-up is never a level.
                if not level and (sub / "profiling").is_dir():
                    walk(sub / "profiling", depth + 2)
                continue
            walk(sub, depth + 1)

    walk(root, 0)
    return found


def artifact_files(folder: Path) -> list[Path]:
    """What to read from one artifact folder: the export (the JSON preferred to the CSV) and
    the server-metrics time series AIPerf recorded (the JSONL preferred to the Parquet)."""
    out = [folder / n for n in EXPORT_NAMES if (folder / n).is_file()][:1]
    out += [folder / n for n in SERVER_METRICS_SERIES if (folder / n).is_file()][:1]
    return out
