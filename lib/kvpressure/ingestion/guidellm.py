"""GuideLLM reports (``guidellm benchmark``/``guidellm run`` outputs) -> ``runs`` rows.

JSON and YAML (``benchmarks.json``/``.yaml``) hold a ``GenerativeBenchmarksReport``:
``{"metadata", "config", "benchmarks": [...]}``, one benchmark per strategy the profile ran.
Each benchmark has ``config.strategy`` (``type_``: ``synchronous``, ``concurrent`` with
``streams``, ``throughput`` with an optional ``max_concurrency``, ``constant``/``poisson`` with
a ``rate``), ``start_time``/``end_time`` (unix seconds) and ``metrics``: per metric a status
breakdown (``successful``, ``incomplete``, ``errored``, ``total``) of distribution summaries
(``mean``, ``median``, ``percentiles.p95``...). Throughputs are ``output_tokens_per_second``,
``tokens_per_second``, ``requests_per_second``; latencies ``time_to_first_token_ms``,
``inter_token_latency_ms``, ``time_per_output_token_ms`` (ms) and ``request_latency`` (s).
Older reports keep the strategy under ``args.strategy``.

CSV (``benchmarks.csv``) has a three-row header (group, field, statistic or unit) and one row
per benchmark. 0.8 names each row's level in its strategy (``concurrent@16``,
``constant@2.5``); earlier releases keep the concurrent profile's stream counts in its
``Run Info``/``Profile`` JSON, indexed by ``Run Index``.

GuideLLM 0.8 (``guidellm run``) writes the same report shape: ``config.strategy`` has
``type_``, ``streams`` and ``max_concurrency``, ``start_time``/``end_time`` are unix seconds
of the measured span, ``metadata.guidellm_version`` names the release.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.text_files import open_text, parse_json
from kvpressure.user_files import read_user_text

FORMAT = "guidellm"
NaN = math.nan

# runs column -> (metric, statistic, factor to the runs unit)
_METRICS = {
    "output_throughput": ("output_tokens_per_second", "mean", 1.0),
    "total_token_throughput": ("tokens_per_second", "mean", 1.0),
    "request_throughput": ("requests_per_second", "mean", 1.0),
    "ttft_mean_s": ("time_to_first_token_ms", "mean", 1e-3),
    "ttft_p95_s": ("time_to_first_token_ms", "p95", 1e-3),
    "ttft_p99_s": ("time_to_first_token_ms", "p99", 1e-3),
    "itl_mean_s": ("inter_token_latency_ms", "mean", 1e-3),
    "itl_p95_s": ("inter_token_latency_ms", "p95", 1e-3),
    "itl_p99_s": ("inter_token_latency_ms", "p99", 1e-3),
    "tpot_mean_s": ("time_per_output_token_ms", "mean", 1e-3),
    "e2e_mean_s": ("request_latency", "mean", 1.0),
    "e2e_p95_s": ("request_latency", "p95", 1.0),
    "e2e_p99_s": ("request_latency", "p99", 1.0),
}


def is_export(obj: Any) -> bool:
    """A GenerativeBenchmarksReport: ``benchmarks`` whose items have ``metrics`` with
    GuideLLM's metric names."""
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list):
        return False
    items = obj["benchmarks"]
    return bool(items) and all(
        isinstance(b, dict) and isinstance(b.get("metrics"), dict)
        and "output_tokens_per_second" in b["metrics"] for b in items)


def is_yaml_head(head: str) -> bool:
    """The start of a YAML report (``yaml.dump`` sorts keys: ``benchmarks:`` comes first)."""
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return first.startswith("benchmarks:") and "output_tokens_per_second" in head


def is_csv(rows: list[list[str]]) -> bool:
    """The three-row header of GuideLLM's CSV."""
    return (len(rows) >= 3 and "Run Info" in rows[0] and "Token Throughput" in rows[0]
            and any("Output Tokens/Sec" in c for c in rows[1]))


def _load(path: Path) -> Any:
    text = read_user_text(path, "results file")
    if text.lstrip().startswith("{"):
        return parse_json(text, path)
    from kvpressure.user_files import parse_user_yaml

    return parse_user_yaml(text, path)


def read(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    """The runs rows of one GuideLLM report (JSON, YAML or CSV)."""
    with open_text(path) as fh:
        head = fh.read(4096)
    if head.lstrip()[:1] not in ("{", "b"):
        return _read_csv(path, run, notes)
    report = _load(path)
    if not is_export(report):
        raise InputError(f"{path}: not a GuideLLM report (no 'benchmarks' with 'metrics')")
    return [_row(b, f"{path}: benchmarks[{k}]", f"{path}#{k + 1}", run, notes)
            for k, b in enumerate(report["benchmarks"])]


def _stat(metrics: dict[str, Any], name: str, stat: str) -> float:
    dist = _dict(_dict(metrics.get(name)).get("successful"))
    value = dist.get(stat) if stat in ("mean", "median") else _dict(dist.get("percentiles")).get(
        stat)
    return _number(value)


def _level(strategy: dict[str, Any]) -> tuple[float, float, str]:
    """(concurrency, request rate, strategy label) of a GuideLLM scheduling strategy."""
    kind = str(strategy.get("type_") or strategy.get("type") or "")
    limit = strategy.get("max_concurrency")
    limit = float(limit) if isinstance(limit, int | float) else NaN
    if kind == "synchronous":
        return 1.0, NaN, kind
    if kind == "concurrent":
        streams = strategy.get("streams")
        return (float(streams) if isinstance(streams, int | float) else NaN), NaN, kind
    if kind == "throughput":
        return limit, math.inf, kind
    if kind in ("constant", "poisson"):
        rate = strategy.get("rate")
        return limit, (float(rate) if isinstance(rate, int | float) else NaN), kind
    return limit, NaN, kind or "unknown"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else NaN


def _row(b: dict[str, Any], where: str, source: str, run: str, notes: list[str]
         ) -> dict[str, Any]:
    config = _dict(b.get("config")) or _dict(b.get("args"))
    strategy = _dict(config.get("strategy"))
    concurrency, rate, kind = _level(strategy)
    metrics = b["metrics"]
    totals = _dict(metrics.get("request_totals"))
    start, end = _number(b.get("start_time")), _number(b.get("end_time"))
    duration = _number(b.get("duration"))
    if math.isnan(duration):
        duration = end - start
    model = _dict(config.get("backend")).get("model")
    row: dict[str, Any] = {
        "run": run, "variant": "default", "concurrency": concurrency, "request_rate": rate,
        "num_requests": _number(totals.get("successful")),
        "failed": _number(totals.get("errored")),
        "duration_s": duration,
        "model": model if isinstance(model, str) else None,
        "date": None, "source": source, "_where": f"{where} ({kind})",
    }
    for column, (metric, stat, factor) in _METRICS.items():
        row[column] = _stat(metrics, metric, stat) * factor
    if end > start:
        # Unix seconds of the measured span: matched to a scrape log without a time zone.
        row["window_start"], row["window_end"] = float(start), float(end)
    if kind == "concurrent" and math.isnan(concurrency):
        notes.append(f"{where}: a concurrent strategy without 'streams'")
    return row


# ---------------------------------------------------------------------- CSV
def _read_csv(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    rows = [r for r in csv.reader(io.StringIO(read_user_text(path, "results file")))
            if any(c.strip() for c in r)]
    if not is_csv(rows[:3]):
        raise InputError(f"{path}: not a GuideLLM CSV (no three-row header with 'Run Info' and "
                         "'Token Throughput')")
    width = max(len(r) for r in rows[:3])
    header = [tuple((rows[i][j] if j < len(rows[i]) else "").strip() for i in range(3))
              for j in range(width)]
    out = []
    for k, cells in enumerate(rows[3:]):
        rec = {h: (cells[j].strip() if j < len(cells) else "") for j, h in enumerate(header)}
        out.append(_csv_row(rec, f"{path}: line {k + 4}", f"{path}#{k + 1}", run, notes))
    if not out:
        raise InputError(f"{path}: a GuideLLM CSV header and no benchmark rows")
    return out


def _num(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return NaN


def _percentile(text: str, which: str) -> float:
    """GuideLLM writes ``[min, p001, p01, p05, p10, p25, p75, p90, p95, p99, max]``."""
    try:
        values = json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return NaN
    at = {"p95": 8, "p99": 9}[which]
    if isinstance(values, list) and len(values) == 11 and isinstance(values[at], int | float):
        return float(values[at])
    return NaN


def _streams(profile_text: str) -> list[Any] | None:
    try:
        profile = json.loads(profile_text)
    except (TypeError, json.JSONDecodeError):
        return None
    stack = [profile]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("streams"), list):
                return node["streams"]
            if isinstance(node.get("streams"), int | float):
                return [node["streams"]]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


# runs column -> (group, units, statistic) in the CSV header; latencies in ms except request
# latency (s)
_CSV_METRICS = {
    "output_throughput": ("Token Throughput", "Successful Output Tokens/Sec", "Mean", 1.0),
    "total_token_throughput": ("Token Throughput", "Successful Total Tokens/Sec", "Mean", 1.0),
    "request_throughput": ("Server Throughput", "Successful Requests/Sec", "Mean", 1.0),
    "ttft_mean_s": ("Time to First Token", "Successful ms", "Mean", 1e-3),
    "ttft_p95_s": ("Time to First Token", "Successful ms", "p95", 1e-3),
    "ttft_p99_s": ("Time to First Token", "Successful ms", "p99", 1e-3),
    "itl_mean_s": ("Inter Token Latency", "Successful ms", "Mean", 1e-3),
    "itl_p95_s": ("Inter Token Latency", "Successful ms", "p95", 1e-3),
    "itl_p99_s": ("Inter Token Latency", "Successful ms", "p99", 1e-3),
    "tpot_mean_s": ("Time per Output Token", "Successful ms", "Mean", 1e-3),
    "e2e_mean_s": ("Request Latency", "Successful Sec", "Mean", 1.0),
    "e2e_p95_s": ("Request Latency", "Successful Sec", "p95", 1.0),
    "e2e_p99_s": ("Request Latency", "Successful Sec", "p99", 1.0),
}


def _csv_row(rec: dict[tuple[str, ...], str], where: str, source: str, run: str,
             notes: list[str]) -> dict[str, Any]:
    kind = rec.get(("Benchmark", "Strategy", ""), "")
    # 0.8 writes the strategy with its level: ``concurrent@16``, ``constant@2.5``.
    kind, _, at = kind.partition("@")
    level, rate = NaN, math.inf if kind == "throughput" else NaN
    if kind == "synchronous":
        level = 1.0
    elif kind == "concurrent" and at:
        level = _num(at)
    elif kind in ("constant", "poisson") and at:
        rate = _num(at)
    elif kind == "concurrent":
        streams = _streams(rec.get(("Run Info", "Profile", ""), ""))
        index = _num(rec.get(("Run Info", "Run Index", ""), ""))
        if streams and math.isfinite(index) and 0 <= int(index) < len(streams):
            level = _num(str(streams[int(index)]))
        else:
            notes.append(f"{where}: a concurrent benchmark whose stream count is not in its "
                         "Profile column: concurrency left empty")
    row: dict[str, Any] = {
        "run": run, "variant": "default", "concurrency": level,
        "request_rate": rate,
        "num_requests": _num(rec.get(("Request Counts", "Successful", ""), "")),
        "failed": _num(rec.get(("Request Counts", "Errored", ""), "")),
        "duration_s": _num(rec.get(("Timings", "Duration", "Sec"), "")),
        "model": None, "date": None, "source": source, "_where": f"{where} ({kind})",
    }
    for column, (group, units, stat, factor) in _CSV_METRICS.items():
        if stat in ("p95", "p99"):
            value = _percentile(rec.get((group, units, "Percentiles"), ""), stat)
        else:
            value = _num(rec.get((group, units, stat), ""))
        row[column] = value * factor
    # The CSV's times are wall-clock strings without a zone: no window for a scrape log.
    return row
