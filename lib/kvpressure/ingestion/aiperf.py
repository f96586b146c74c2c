"""AIPerf exports (``aiperf profile``) -> ``runs`` rows, one per profile run.

``profile_export_aiperf.json`` holds one object per run: per metric tag
(``request_throughput``, ``output_token_throughput``, ``time_to_first_token``,
``inter_token_latency``, ``request_latency``, ``request_count``, ``benchmark_duration``...)
``{"unit", "avg", "p50", "p95", "p99", ...}`` in display units (``ms``, ``sec``,
``tokens/sec``, ``requests/sec``), and ``input_config`` (the user's settings:
``loadgen.concurrency``, ``loadgen.request_rate``, ``endpoint.model_names``).

``profile_export_aiperf.csv`` has two sections: ``Metric,avg,min,max,p1,...,p99,std`` rows for
per-request metrics, a blank line, then ``Metric,Value`` rows for run-wide ones; a metric is
named by its header and unit (``Time to First Token (ms)``). It carries no settings: the
concurrency is read from the artifact folder AIPerf names after it (``...-concurrency16``).

A sweep is one artifact folder per level; pass the files or their parent folder.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.sources import parse_json
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
_LEVEL_IN_PATH = re.compile(r"concurrency(\d+)")
_RATE_IN_PATH = re.compile(r"request_rate(\d+(?:\.\d+)?)")


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


def read(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    """The one runs row of an AIPerf export (JSON or CSV)."""
    text = read_user_text(path, "results file")
    if text.lstrip().startswith("{"):
        obj = parse_json(text, path)
        if not isinstance(obj, dict):
            raise InputError(f"{path}: not an AIPerf export (a JSON object of metrics)")
        config = obj.get("input_config") if isinstance(obj.get("input_config"), dict) else {}
        metrics = obj
    else:
        metrics, config = _csv_metrics(path, text), {}
    loadgen = config.get("loadgen") if isinstance(config.get("loadgen"), dict) else {}
    concurrency = _finite(loadgen.get("concurrency"))
    rate = _finite(loadgen.get("request_rate"))
    from_path = _level_from_path(path)
    if math.isnan(concurrency) and math.isnan(rate):
        concurrency, rate = from_path
        if not math.isnan(concurrency):
            notes.append(f"{path}: concurrency {concurrency:g} read from the artifact folder's "
                         "name (the export does not carry it)")
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    models = endpoint.get("model_names")
    row: dict[str, Any] = {
        "run": run, "variant": "default", "concurrency": concurrency, "request_rate": rate,
        "model": models[0] if isinstance(models, list) and models else None, "date": None,
        "source": str(path), "_where": str(path),
    }
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
