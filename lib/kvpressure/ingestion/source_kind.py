"""What one SOURCE argument is: the kinds :mod:`kvpressure.ingestion.sources` tells apart.

The value of each kind is the word ``ingest.json`` writes in its ``sources`` (``"kind":
"prom_jsonl"``): a ``StrEnum`` compares equal to it and is written as it, so a report read back
from disk matches the kind it was made with. A new kind of source is a member here, its test in
``sources.sniff_file`` (or ``detect``) and its reader in ``api``.
"""

from __future__ import annotations

from enum import StrEnum


class SourceKind(StrEnum):
    PROM_TEXT = "prom_text"  # one /metrics exposition: one scrape
    PROM_DIR = "prom_dir"  # a folder of expositions, one a scrape
    PROM_JSONL = "prom_jsonl"  # a scrape log, {"t", "text"} a line
    QUERY_RANGE = "query_range"  # a saved Prometheus HTTP API answer
    BENCH = "bench"  # vllm bench results, or another tool's table of runs
    AIPERF_METRICS = "aiperf_metrics"  # the server's /metrics as AIPerf recorded it
    SERVER_LOG = "server_log"  # a vLLM server's log
    PROMETHEUS_URL = "prometheus_url"  # a live Prometheus server, read over a range
    METRICS_URL = "metrics_url"  # a live /metrics exporter, scraped once
    # What a file turned out to be when it is none of the above (refused, naming the file).
    EMPTY = "empty"
    JSON_LIST = "json_list"
    JSON_BROKEN = "json_broken"
    JSON_OTHER = "json_other"
    TEXT_OTHER = "text_other"


#: Kinds a file can be read as; the others are refused.
READABLE = frozenset({
    SourceKind.PROM_TEXT, SourceKind.PROM_DIR, SourceKind.PROM_JSONL, SourceKind.QUERY_RANGE,
    SourceKind.BENCH, SourceKind.AIPERF_METRICS, SourceKind.SERVER_LOG,
    SourceKind.PROMETHEUS_URL, SourceKind.METRICS_URL,
})

#: Kinds read file by file inside a folder (a folder's text dumps make one ``prom_dir``).
IN_FOLDER = frozenset({
    SourceKind.PROM_JSONL, SourceKind.QUERY_RANGE, SourceKind.BENCH, SourceKind.SERVER_LOG,
    SourceKind.AIPERF_METRICS,
})

#: Kinds that are a server's /metrics text: a run read from one must hold a vLLM metric.
SCRAPED = frozenset({
    SourceKind.PROM_JSONL, SourceKind.PROM_DIR, SourceKind.PROM_TEXT, SourceKind.METRICS_URL,
    SourceKind.AIPERF_METRICS,
})

#: Scraped kinds whose reading must find at least one Prometheus sample line or declaration.
NEED_SAMPLES = frozenset({
    SourceKind.PROM_JSONL, SourceKind.PROM_DIR, SourceKind.PROM_TEXT, SourceKind.METRICS_URL,
})
