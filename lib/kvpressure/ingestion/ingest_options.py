"""How ``ingest()`` reads its sources: the choices of ``kvpressure ingest``'s options.

One frozen object instead of a dozen keywords threaded through every caller: the command line
builds it from its options, stage 01 from its parameters, and ``ingest.json`` echoes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class IngestOptions:
    """``start``/``end``/``step`` bound a live Prometheus server query (unix seconds, ISO 8601
    or ``now-1h``; ``step`` None = the raw scraped samples); ``timeout`` is the HTTP timeout, s.
    ``metrics``: None or "all" (everything), "core" (the families the analysis reads: smaller
    and faster on long logs) or a list of names. ``keep_created`` keeps ``_created`` samples.
    ``counter_origin``: "auto", "zero" (counters were 0 when the log began) or "first" (count
    from the first sample). ``drop_target_labels`` drops a label that has one value in the run
    (the scrape target's ``instance``/``job``).
    ``bench_timezone``: the zone of the bench results' ``date`` when they are matched to a
    scrape log by time (default: this machine's; "UTC", "+08:00", "Asia/Shanghai").
    ``columns``: how a plain runs CSV's columns map onto the runs columns
    (``"concurrency=conc,output_throughput=tok_s"``, ``ttft_p95_s=ttft95:ms`` for a unit).
    ``log_year``: the year of a vLLM server log's first dated line (its dates have none; default:
    from the file's modification time); ``log_timezone``: the zone its times were written in
    (default: ``bench_timezone``, else this machine's; same forms).
    """

    start: str | float | None = None
    end: str | float | None = None
    step: float | None = None
    timeout: float = 10.0
    metrics: str | Sequence[str] | None = None
    keep_created: bool = False
    counter_origin: str = "auto"
    drop_target_labels: bool = True
    bench_timezone: str | None = None
    columns: str | dict[str, str] | None = None
    log_year: int | None = None
    log_timezone: str | None = None
