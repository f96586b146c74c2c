"""Polling a live vLLM server's ``/metrics`` into a scrape log while a load test runs.

The log is the same JSONL the simulation writes (``{"t": seconds, "text": "<exposition>"}`` a
line), so ``kvpressure ingest`` reads it like any other scrape log. Each scrape is written and
flushed as soon as it arrives: a server that stops answering, a full disk or Ctrl-C loses
nothing already collected, and a failed scrape is a gap, not the end of the log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvpressure.errors import InputError

# The plain text format keeps vLLM's colons in metric names (OpenMetrics negotiation escapes them).
ACCEPT = "text/plain; version=0.0.4"


@dataclass
class ScrapeLog:
    path: Path
    scrapes: int = 0
    failures: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "scrapes": self.scrapes, "failures": self.failures}


def scrape_to_log(
    url: str,
    out: Path,
    *,
    interval_s: float = 5.0,
    duration_s: float | None = None,
    count: int | None = None,
    timeout_s: float = 5.0,
    max_consecutive_failures: int = 12,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    client: httpx.Client | None = None,
) -> ScrapeLog:
    """Scrape ``url`` every ``interval_s`` until ``duration_s`` or ``count`` scrapes, appending
    to ``out``. Stops early after ``max_consecutive_failures`` failed scrapes in a row."""
    if interval_s <= 0:
        raise InputError(f"--interval: must be > 0 seconds, got {interval_s}")
    if duration_s is not None and duration_s <= 0:
        raise InputError(f"--duration: must be > 0 seconds, got {duration_s}")
    if count is not None and count < 1:
        raise InputError(f"--count: must be >= 1, got {count}")
    log = ScrapeLog(Path(out))
    http = client or httpx.Client(timeout=timeout_s, headers={"Accept": ACCEPT})
    start = clock()
    failed_in_row = 0
    try:
        with open(out, "a", encoding="utf-8") as fh:
            n = 0
            while True:
                t = clock()
                try:
                    resp = http.get(url)
                    resp.raise_for_status()
                    fh.write(json.dumps({"t": round(t, 3), "text": resp.text}) + "\n")
                    fh.flush()
                    log.scrapes += 1
                    failed_in_row = 0
                except httpx.HTTPError as exc:
                    failed_in_row += 1
                    log.failures.append({"t": round(t, 3), "error": f"{type(exc).__name__}: {exc}"})
                    if failed_in_row >= max_consecutive_failures:
                        break
                n += 1
                if count is not None and n >= count:
                    break
                next_t = start + n * interval_s
                if duration_s is not None and next_t > start + duration_s:
                    break
                sleep(max(0.0, next_t - clock()))
    finally:
        if client is None:
            http.close()
    if log.scrapes == 0:
        first = log.failures[0]["error"] if log.failures else "no scrape made"
        raise InputError(f"{url}: no scrape succeeded ({first})")
    return log
