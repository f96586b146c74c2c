"""The server's ``/metrics`` as AIPerf recorded it beside a level (``aiperf profile`` scrapes
the endpoint's ``/metrics`` through the run; ``--server-metrics-formats jsonl parquet``) ->
the canonical series.

* ``server_metrics_export.jsonl``: one scrape a line, ``{"endpoint_url", "timestamp_ns",
  "metrics": {name: [{"labels", "value"} | {"labels", "buckets", "sum", "count"}]}}``, the
  values as scraped. Counters are named without ``_total`` and no line says which names are
  counters: vLLM's own are known (:data:`kvpressure.ingestion.names.V1_COUNTERS`), the types
  of the others come from ``server_metrics_export.json`` beside it when it is there. Info
  gauges (``vllm:cache_config_info``) are left out of the lines; that JSON's copy is added to
  every scrape.
* ``server_metrics_export.parquet`` (with the ``[parquet]`` extra): one row a sample (a
  histogram one row a bucket) with ``metric_type``, the labels as columns, counters and
  histograms as increases since the last scrape before the profiling phase.

Each scrape becomes one exposition text read like any other scrape, so names, labels and
histograms come out as they do from a scrape log; the endpoint is the ``instance`` label
(dropped when there is one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion import names
from kvpressure.ingestion.prom_text import RunSamples, add_scrape
from kvpressure.ingestion.text_files import open_text

JSONL = "server_metrics_export.jsonl"
PARQUET = "server_metrics_export.parquet"
_SUMMARY = "server_metrics_export.json"
_PARQUET_MAGIC = b"PAR1"
_FIXED_COLUMNS = frozenset({"endpoint_url", "metric_name", "metric_type", "unit", "description",
                            "timestamp_ns", "value", "sum", "count", "bucket_le",
                            "bucket_count"})


def is_jsonl_line(obj: Any) -> bool:
    """One line of AIPerf's server-metrics JSONL."""
    return (isinstance(obj, dict) and "timestamp_ns" in obj and "endpoint_url" in obj
            and isinstance(obj.get("metrics"), dict))


def is_parquet(path: Path) -> bool:
    """AIPerf's server-metrics Parquet: Parquet's magic bytes and AIPerf's column names."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != _PARQUET_MAGIC:
                return False
            # The footer holds the schema (the column names) at the end of the file.
            fh.seek(-min(path.stat().st_size, 1 << 20), 2)
            tail = fh.read()
    except OSError:
        return False
    return b"metric_name" in tail and b"timestamp_ns" in tail


def _summary(folder: Path) -> dict[str, Any]:
    path = folder / _SUMMARY
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, RecursionError):
        return {}
    metrics = doc.get("metrics") if isinstance(doc, dict) else None
    return metrics if isinstance(metrics, dict) else {}


def _types(summary: dict[str, Any]) -> dict[str, str]:
    return {name: str(m.get("type")) for name, m in summary.items()
            if isinstance(m, dict) and isinstance(m.get("type"), str)}


def _info_lines(summary: dict[str, Any]) -> list[str]:
    """The info gauges (constant, labels carry the configuration) of the summary JSON as
    exposition lines: the scrapes in the JSONL leave them out."""
    out: list[str] = []
    for name, m in sorted(summary.items()):
        if not name.endswith("_info") or not isinstance(m, dict) or m.get("type") != "gauge":
            continue
        samples = []
        for series in m.get("series") or []:
            if not isinstance(series, dict):
                continue
            got_stats = series.get("stats")
            stats: dict[str, Any] = got_stats if isinstance(got_stats, dict) else {}
            value = _number(stats.get("avg", 1.0))
            got_labels = series.get("labels")
            labels: dict[str, Any] = got_labels if isinstance(got_labels, dict) else {}
            if value is not None:
                samples.append(f"{name}{_labels(labels, series.get('endpoint_url'))} {value}")
        if samples:
            out += [f"# TYPE {name} gauge", *samples]
    return out


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _instance(url: Any) -> str | None:
    if not isinstance(url, str) or not url:
        return None
    host = url.split("://", 1)[-1]
    return host.split("/", 1)[0] or None


def _labels(labels: dict[str, Any], url: Any = None, extra: tuple[str, str] | None = None
            ) -> str:
    pairs = {str(k): v for k, v in labels.items() if v is not None}
    instance = _instance(url)
    if instance and "instance" not in pairs:
        pairs["instance"] = instance
    items = [f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items())]
    if extra:
        items.append(f'{extra[0]}="{_escape(extra[1])}"')
    return "{" + ",".join(items) + "}" if items else ""


def _number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return repr(float(value)) if math.isfinite(value) else (
        "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf"))


def _kind(name: str, entries: list[Any], types: dict[str, str]) -> str:
    if types.get(name) in ("counter", "gauge", "histogram"):
        return types[name]
    if any(isinstance(e, dict) and isinstance(e.get("buckets"), dict) for e in entries):
        return "histogram"
    return "counter" if name in names.V1_COUNTERS else "gauge"


def exposition(url: Any, metrics: dict[str, Any], types: dict[str, str]) -> str:
    """One JSONL scrape as Prometheus text: counters with ``_total``, histograms as
    ``_bucket``/``_sum``/``_count``."""
    lines: list[str] = []
    for name, entries in metrics.items():
        if not isinstance(entries, list):
            continue
        kind = _kind(name, entries, types)
        lines.append(f"# TYPE {name} {kind}")
        for e in entries:
            if not isinstance(e, dict):
                continue
            got_labels = e.get("labels")
            labels = got_labels if isinstance(got_labels, dict) else {}
            if kind == "histogram":
                got_buckets = e.get("buckets")
                buckets: dict[str, Any] = got_buckets if isinstance(got_buckets, dict) else {}
                for le, count in buckets.items():
                    v = _number(count)
                    if v is not None:
                        lines.append(f"{name}_bucket{_labels(labels, url, ('le', le))} {v}")
                lines.extend(_sum_and_count(name, labels, url, e))
                continue
            lines.extend(_value(name, kind, labels, url, e.get("value")))
    return "\n".join(lines) + "\n"


def _value(name: str, kind: str, labels: dict[str, Any], url: Any, value: Any) -> list[str]:
    """A counter's or gauge's sample line (none for a value that is no number)."""
    v = _number(value)
    if v is None:
        return []
    sample = f"{name}_total" if kind == "counter" else name
    return [f"{sample}{_labels(labels, url)} {v}"]


def _sum_and_count(name: str, labels: dict[str, Any], url: Any, source: Any) -> list[str]:
    """A histogram's ``_sum`` and ``_count`` lines from ``source``'s ``sum`` and ``count``."""
    out = []
    for part in ("sum", "count"):
        v = _number(source.get(part))
        if v is not None:
            out.append(f"{name}_{part}{_labels(labels, url)} {v}")
    return out


def _jsonl_scrapes(path: Path, types: dict[str, str], warnings: list[str]
                   ) -> Iterator[tuple[float, str, str]]:
    with open_text(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                if not raw.endswith("\n"):
                    warnings.append(f"{where}: the file ends in the middle of a scrape; the "
                                    "complete scrapes before it are kept")
                    return
                raise InputError(f"{where}: not a JSON line ({exc.msg} at column "
                                 f"{exc.colno})") from None
            if not is_jsonl_line(obj):
                raise InputError(f"{where}: an AIPerf server-metrics line needs "
                                 "'endpoint_url', 'timestamp_ns' and 'metrics'")
            t = obj["timestamp_ns"]
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
                raise InputError(f"{where}: 'timestamp_ns' must be a number, got {t!r}")
            yield float(t) / 1e9, exposition(obj["endpoint_url"], obj["metrics"], types), where


def _parquet_scrapes(path: Path) -> Iterator[tuple[float, str, str]]:
    from kvpressure.extras import require

    require("parquet", f"reading {path.name}")
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # a broken or foreign file: pyarrow's own words
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = {"metric_name", "metric_type", "timestamp_ns"} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: no column {', '.join(sorted(missing))}: not AIPerf's "
                         "server-metrics Parquet")
    label_cols = [c for c in frame.columns if c not in _FIXED_COLUMNS]
    for ts, part in frame.groupby("timestamp_ns", sort=True):
        lines: list[str] = []
        for (name, kind), rows in part.groupby(["metric_name", "metric_type"], sort=False):
            kind = str(kind) if kind in ("counter", "gauge", "histogram") else "gauge"
            lines.append(f"# TYPE {name} {kind}")
            for rec in rows.to_dict("records"):
                labels = {c: rec[c] for c in label_cols if isinstance(rec.get(c), str)}
                url = rec.get("endpoint_url")
                if kind == "histogram":
                    v = _number(rec.get("bucket_count"))
                    if v is not None and isinstance(rec.get("bucket_le"), str):
                        lines.append(f"{name}_bucket{_labels(labels, url, ('le', rec['bucket_le']))}"
                                     f" {v}")
                    if rec.get("bucket_le") == "+Inf":
                        lines.extend(_sum_and_count(name, labels, url, rec))
                    continue
                lines.extend(_value(name, kind, labels, url, rec.get("value")))
        yield float(ts) / 1e9, "\n".join(lines) + "\n", f"{path} (timestamp_ns {ts})"


def read_server_metrics(path: Path, acc: RunSamples, warnings: list[str]) -> int:
    """Add every scrape of an AIPerf server-metrics JSONL or Parquet to ``acc``; the number of
    scrapes read."""
    summary = _summary(path.parent)
    if is_parquet(path):
        scrapes = _parquet_scrapes(path)
        info: list[str] = []
        warnings.append(f"{path}: AIPerf's Parquet holds counters as increases since the "
                        "profiling phase began; each level's counters start from 0")
    else:
        scrapes = _jsonl_scrapes(path, _types(summary), warnings)
        info = _info_lines(summary)
    extra = "\n".join(info) + "\n" if info else ""
    n = 0
    for t, text, where in scrapes:
        add_scrape(acc, t, text + extra, where, warnings)
        n += 1
    if n == 0:
        raise InputError(f"{path}: no scrape in it")
    return n
