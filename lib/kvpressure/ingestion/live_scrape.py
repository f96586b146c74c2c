"""Polling a live vLLM server's ``/metrics`` into a scrape log while a load test runs.

The log is the same JSONL the simulation writes (``{"t": seconds, "text": "<exposition>"}`` a
line), so ``kvpressure ingest`` reads it like any other scrape log. Each scrape is written and
flushed as soon as it arrives: a server that stops answering, a full disk or Ctrl-C loses
nothing already collected.

A failed scrape is a gap, not the end of the log: it is written as ``{"t": ..., "gap": reason}``
(ingestion skips such lines and reports them) and the scraper keeps going with a growing pause
(up to :data:`BACKOFF_CAP_S`) until the server answers again, the duration ends, or the user's
``max_failures`` failures in a row. A body is kept only when it is Prometheus text: an HTML
error page, an empty answer or garbage from a proxy is a gap with its reason, never a scrape.
Every read is bounded by a total time, so a server that trickles bytes cannot hold a scrape.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvpressure.errors import InputError
from kvpressure.ingestion.prom_api import check_url

# The plain text format keeps vLLM's colons in metric names (OpenMetrics negotiation escapes them).
ACCEPT = "text/plain; version=0.0.4"
BACKOFF_CAP_S = 30.0
MAX_BODY_BYTES = 64 << 20  # far beyond a many-engine server's /metrics; a runaway body stops here

# name{labels} value [timestamp]; label values may hold anything quoted, so the braces are greedy.
_SAMPLE = re.compile(
    r"[A-Za-z_:][A-Za-z0-9_:]*(?:\{.*\})?[ \t]+(?:[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|[Ii]nf|"
    r"NaN|nan|Inf))(?:[ \t]+-?[0-9.]+(?:[eE][-+]?[0-9]+)?)?[ \t]*(?:#.*)?"
)


# A scrape that waits longer than a day is a typo; far past it the clock's deadline overflows.
MAX_TIMEOUT_S = 86400.0


def exposition_problem(body: bytes, content_type: str = "") -> str | None:
    """Why ``body`` is not a Prometheus text exposition, or None when it is one."""
    if not body.strip():
        return "empty body"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start})"
    head = text.lstrip()[:200].lower()
    if "html" in content_type.lower() or head.startswith(("<!doctype", "<html", "<?xml", "<")):
        return "an HTML/XML page, not Prometheus text"
    samples = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not _SAMPLE.fullmatch(stripped):
            return f"line {lineno} is not a Prometheus sample: {stripped[:60]!r}"
        samples += 1
    if samples == 0:
        return "no samples (comments only)"
    return None


@dataclass
class ScrapeLog:
    path: Path
    scrapes: int = 0
    failures: list[dict] = field(default_factory=list)
    gave_up: str | None = None  # why the scraper stopped before its end, if it did

    def to_dict(self) -> dict:
        return {"path": str(self.path), "scrapes": self.scrapes, "failures": self.failures,
                "gave_up": self.gave_up}


def _positive(value: float | None, option: str, unit: str = " seconds") -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{option}: must be a finite number > 0{unit}, got {value}")


def _fresh_line(path: Path) -> None:
    """Append a newline when the log's last line was cut (a kill mid-write), so the next scrape
    starts a line of its own instead of being glued to the broken one."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
    except FileNotFoundError:
        return
    if last != b"\n":
        with open(path, "ab") as fh:
            fh.write(b"\n")


def _check_appendable(path: Path) -> None:
    """The log is appended to: an existing file must be a scrape log already (a user's notes
    or a compressed log would be changed for good by the first line written)."""
    if not path.is_file():  # new, or a device such as /dev/full: nothing of the user's in it
        return
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        raise InputError(f"--out {path}: cannot read: {exc.strerror or exc}") from None
    if not head.strip():
        return
    # The scraper's own lines start with "t" (a first line cut by a kill, or longer than the
    # head, too); another writer's scrape is a JSON object holding "t".
    ok = re.match(rb'\s*\{\s*"t"\s*:', head) is not None
    if not ok:
        try:
            record = json.loads(head.partition(b"\n")[0])
        except ValueError:
            record = None
        ok = isinstance(record, dict) and "t" in record
    if not ok:
        raise InputError(f"--out {path}: exists and is not a scrape log (its first line is no "
                         "{\"t\": ...} scrape); it is never appended to, give a new file")


class Scraper:
    """Scrapes one endpoint into one log; :meth:`run` loops, :meth:`poke` asks for a scrape now
    (from another thread: the load runner marks a level's start and end with one)."""

    def __init__(
        self,
        url: str,
        out: str | os.PathLike[str],
        *,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        max_failures: int | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        client: httpx.Client | None = None,
        on_scrape: Callable[[float, str], None] | None = None,
    ) -> None:
        check_url(url)
        _positive(interval_s, "--interval")
        _positive(timeout_s, "--timeout")
        if timeout_s > MAX_TIMEOUT_S:
            raise InputError(f"--timeout: at most {MAX_TIMEOUT_S:g} s, got {timeout_s:g}")
        if max_failures is not None and (isinstance(max_failures, bool) or max_failures < 1):
            raise InputError(f"--max-failures: must be >= 1, got {max_failures}")
        self.url = url
        self.log = ScrapeLog(Path(out))
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.max_failures = max_failures
        self.clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sleep = sleep or self._wait
        self._client = client
        self._on_scrape = on_scrape
        self._lock = threading.Lock()
        self.last_text: str | None = None
        self.last_t: float | None = None

    # ------------------------------------------------------------------ control from outside
    def poke(self) -> None:
        """Take a scrape as soon as possible (the current one, if any, finishes first)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _wait(self, seconds: float) -> None:
        self._wake.wait(max(0.0, seconds))

    # ------------------------------------------------------------------ one scrape
    def _get(self, http: httpx.Client) -> tuple[str | None, str | None]:
        """(text, None) for a good scrape, (None, reason) otherwise; never longer than
        ``timeout_s`` in all, however slowly the server sends."""
        deadline = time.monotonic() + self.timeout_s
        try:
            with http.stream("GET", self.url) as resp:
                if resp.status_code != 200:
                    return None, f"HTTP {resp.status_code}"
                chunks, size = [], 0
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        return None, f"body larger than {MAX_BODY_BYTES >> 20} MiB"
                    if time.monotonic() > deadline:
                        return None, f"took longer than {self.timeout_s:g} s in all (timeout)"
                body = b"".join(chunks)
                problem = exposition_problem(body, resp.headers.get("content-type", ""))
                if problem:
                    return None, f"not Prometheus text: {problem}"
                return body.decode("utf-8"), None
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    def _write(self, fh, record: dict) -> None:
        try:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
        except OSError as exc:
            raise InputError(f"{self.log.path}: cannot write the scrape log: "
                             f"{exc.strerror or exc}") from None

    def scrape_once(self, fh, http: httpx.Client) -> bool:
        t = self.clock()
        text, error = self._get(http)
        with self._lock:
            if text is not None:
                self._write(fh, {"t": round(t, 3), "text": text})
                self.log.scrapes += 1
                self.last_text, self.last_t = text, t
            else:
                self._write(fh, {"t": round(t, 3), "gap": error})
                self.log.failures.append({"t": round(t, 3), "error": error})
        if text is not None and self._on_scrape is not None:
            self._on_scrape(t, text)
        return text is not None

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        *,
        duration_s: float | None = None,
        count: int | None = None,
        require_first: bool = False,
    ) -> ScrapeLog:
        """Scrape every ``interval_s`` until ``duration_s``, ``count`` attempts, :meth:`stop`,
        or ``max_failures`` failures in a row. ``require_first``: a first scrape that fails is
        an InputError naming the URL (a typo must not run silently for hours)."""
        _positive(duration_s, "--duration")
        if count is not None and count < 1:
            raise InputError(f"--count: must be >= 1, got {count}")
        path = self.log.path
        if path.is_dir():
            raise InputError(f"--out {path}: is a folder; give the scrape log's file name")
        _check_appendable(path)
        http = self._client or httpx.Client(
            timeout=httpx.Timeout(self.timeout_s), headers={"Accept": ACCEPT}
        )
        start = self.clock()
        failed_in_row = 0
        attempts = 0
        try:
            _fresh_line(path)
            fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finally
        except OSError as exc:
            if self._client is None:
                http.close()
            raise InputError(f"--out {path}: cannot open for writing: {exc.strerror or exc}"
                             ) from None
        try:
            while not self._stop.is_set():
                self._wake.clear()
                ok = self.scrape_once(fh, http)
                attempts += 1
                if ok:
                    failed_in_row = 0
                else:
                    failed_in_row += 1
                    if require_first and self.log.scrapes == 0:
                        raise InputError(
                            f"{self.url}: no scrape succeeded ({self.log.failures[0]['error']})")
                    if self.max_failures is not None and failed_in_row >= self.max_failures:
                        self.log.gave_up = (f"{failed_in_row} failed scrapes in a row "
                                            f"(--max-failures {self.max_failures})")
                        break
                if count is not None and attempts >= count:
                    break
                now = self.clock()
                # The next point of the grid still ahead: missed points are skipped, never
                # caught up in a burst after a stall.
                k = math.floor((now - start) / self.interval_s) + 1
                next_t = start + k * self.interval_s
                if failed_in_row:
                    pause = min(self.interval_s * 2 ** (failed_in_row - 1),
                                max(self.interval_s, BACKOFF_CAP_S))
                    next_t = max(next_t, now + pause)
                if duration_s is not None and next_t > start + duration_s:
                    break
                self._sleep(next_t - now)
        finally:
            with contextlib.suppress(OSError):  # a full disk already said so in _write
                fh.close()
            if self._client is None:
                http.close()
        if self.log.scrapes == 0:
            first = self.log.failures[0]["error"] if self.log.failures else "no scrape made"
            raise InputError(f"{self.url}: no scrape succeeded ({first})")
        return self.log


def scrape_to_log(
    url: str,
    out: str | os.PathLike[str],
    *,
    interval_s: float = 5.0,
    duration_s: float | None = None,
    count: int | None = None,
    timeout_s: float = 5.0,
    max_failures: int | None = None,
    require_first: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] | None = None,
    client: httpx.Client | None = None,
) -> ScrapeLog:
    """Scrape ``url`` every ``interval_s`` until ``duration_s`` or ``count`` attempts, appending
    to ``out``. Gives up only after ``max_failures`` failed scrapes in a row (None: never)."""
    scraper = Scraper(url, out, interval_s=interval_s, timeout_s=timeout_s,
                      max_failures=max_failures, clock=clock, sleep=sleep, client=client)
    return scraper.run(duration_s=duration_s, count=count, require_first=require_first)
