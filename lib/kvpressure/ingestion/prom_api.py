"""The Prometheus HTTP API: saved answers and a live server.

A server stores vLLM's names with the colon escaped (``vllm_num_requests_running``, toolchain
notes 9), so every query matches both spellings: ``{__name__=~"vllm[:_].+"}``.

Two ways to read a live server over ``[start, end]``:

* without ``step``: the raw samples at the times they were scraped, through range-vector
  queries (``/api/v1/query?query=<selector>[600s]&time=...``), one window after the other;
* with ``step``: ``/api/v1/query_range`` evaluated every ``step`` seconds (Prometheus' own
  lookback picks the sample), in chunks of at most 10,000 points per series (the server refuses
  more than 11,000).

A window the server is too busy for (HTTP 429, 502, 503, 504) is tried again after a growing
pause (``Retry-After`` when it says one); a window too large for it (422 "too many samples",
"exceeded maximum resolution") is split in two, down to a few seconds. Other failures
(timeout, refused connection) are tried once more; then the server is taken to have stopped
answering: every window fetched so far is kept and the rest of the range is reported as a gap.
A server that answers nothing at all is an error: an empty ingest would look like an idle one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvpressure.errors import InputError
from kvpressure.ingestion.prom_text import RunSamples, add_scrape

SELECTOR = '{__name__=~"vllm[:_].+"}'
RAW_WINDOW_S = 600.0
MAX_POINTS = 10_000
BUSY_STATUS = frozenset({429, 502, 503, 504})
BUSY_RETRIES = 6
# Prometheus' words for an answer that a smaller range would get.
TOO_LARGE = ("too many samples", "exceeded maximum resolution", "query processing would load")
MIN_SPLIT_S = 2.0


@dataclass
class FetchReport:
    url: str
    start: float
    end: float
    step: float | None
    requests: int = 0
    series: int = 0
    samples: int = 0
    gaps: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "start": self.start,
            "end": self.end,
            "step": self.step,
            "mode": "query_range" if self.step else "raw samples",
            "requests": self.requests,
            "series": self.series,
            "samples": self.samples,
            "gaps": self.gaps,
        }


def add_matrix(acc: RunSamples, result: list[Any], where: str) -> tuple[int, int]:
    """Add a ``matrix`` result to ``acc``; return (series, samples) added."""
    n_series = n_samples = 0
    for i, item in enumerate(result):
        if not isinstance(item, dict) or "metric" not in item:
            raise InputError(f"{where}: result[{i}] has no 'metric'")
        labels = {str(k): str(v) for k, v in item["metric"].items()}
        name = labels.pop("__name__", None)
        if name is None:
            raise InputError(
                f"{where}: result[{i}] has no __name__ label (the answer of an expression, not "
                "of a plain selector); query the metric itself, e.g. "
                f"{SELECTOR}"
            )
        points = item.get("values")
        if points is None and "value" in item:
            points = [item["value"]]
        if not isinstance(points, list):
            raise InputError(f"{where}: result[{i}] ({name}) has no 'values'")
        sid = acc.series_id(name, labels, None)
        if sid < 0:
            continue
        try:
            t = np.array([float(p[0]) for p in points], dtype=np.float64)
            v = np.array([float(p[1]) for p in points], dtype=np.float64)
        except (TypeError, ValueError, IndexError) as exc:
            raise InputError(f"{where}: result[{i}] ({name}): bad sample ({exc})") from None
        acc.add_points(sid, t, v)
        n_series += 1
        n_samples += len(t)
    return n_series, n_samples


def _result_of(answer: Any, where: str) -> list[Any]:
    if not isinstance(answer, dict):
        raise InputError(f"{where}: not a Prometheus HTTP API answer")
    if answer.get("status") != "success":
        raise InputError(
            f"{where}: the server answered status={answer.get('status')!r}: "
            f"{answer.get('errorType', '')} {answer.get('error', '')}".rstrip()
        )
    data = answer.get("data")
    if not isinstance(data, dict) or "result" not in data:
        raise InputError(f"{where}: field 'data.result' missing")
    kind = data.get("resultType")
    if kind not in ("matrix", "vector"):
        raise InputError(
            f"{where}: resultType {kind!r}; a range query (matrix) or a selector is needed"
        )
    result = data["result"]
    if not isinstance(result, list):
        raise InputError(f"{where}: 'data.result' is not a list")
    return result


def read_query_range_file(path: Path, acc: RunSamples) -> dict[str, Any]:
    """A saved ``query_range`` (or range-vector ``query``) answer."""
    from kvpressure.user_files import parse_user_json, read_user_text

    answer = parse_user_json(read_user_text(path, "query answer"), path)
    result = _result_of(answer, str(path))
    n_series, n_samples = add_matrix(acc, result, str(path))
    return {"series": n_series, "samples": n_samples, "empty": not result}


def _windows(start: float, end: float, span: float) -> list[tuple[float, float]]:
    out = []
    a = start
    while a < end:
        b = min(a + span, end)
        out.append((a, b))
        a = b
    return out or [(start, end)]


def check_url(url: str, option: str = "") -> str:
    """``url`` if it is a usable http(s) URL; InputError naming it (and the option that gave
    it) otherwise."""
    where = f"{option} {url!r}" if option else url
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise InputError(f"{where}: not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InputError(f"{where}: not an http(s) URL with a host")
    return url


def _too_large(resp: httpx.Response | None, answer: Any) -> bool:
    text = " ".join(str(answer.get(k, "")) for k in ("error", "errorType")) \
        if isinstance(answer, dict) else ""
    return (resp is not None and resp.status_code == 422) or any(w in text for w in TOO_LARGE)


def _pause(resp: httpx.Response | None, attempt: int) -> float:
    """Seconds to wait before trying a busy server again."""
    try:
        said = float(resp.headers.get("Retry-After", "")) if resp is not None else math.nan
    except ValueError:
        said = math.nan
    if math.isfinite(said) and said >= 0:
        return min(said, 30.0)
    return min(0.5 * 2**attempt, 8.0)


def fetch_live(
    url: str,
    acc: RunSamples,
    start: float,
    end: float,
    step: float | None = None,
    *,
    timeout: float = 10.0,
    retries: int = 1,
    window_s: float = RAW_WINDOW_S,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FetchReport:
    """Read ``[start, end]`` from a live Prometheus server into ``acc``."""
    check_url(url)
    if not (math.isfinite(start) and math.isfinite(end)):
        raise InputError(f"{url}: --start and --end must be finite times")
    if not end > start:
        raise InputError(f"{url}: --end ({end}) must be after --start ({start})")
    if step is not None and not (step > 0 and math.isfinite(step)):
        raise InputError(f"{url}: --step must be a positive number, got {step}")
    base = url.rstrip("/")
    report = FetchReport(url, start, end, step)
    span = step * MAX_POINTS if step else window_s
    min_split = max(MIN_SPLIT_S, 2 * step) if step else MIN_SPLIT_S
    own = client is None
    http = client or httpx.Client(timeout=timeout)
    fetched = 0
    try:
        todo = list(reversed(_windows(start, end, span)))  # a stack, earliest window on top
        while todo:
            a, b = todo.pop()
            if step:
                path = "/api/v1/query_range"
                params = {"query": SELECTOR, "start": repr(a), "end": repr(b), "step": repr(step)}
            else:
                # (a, b] as a range vector ending at b; the first window also takes a sample at a.
                lo = a - 0.001 if a == start else a
                ms = max(1, int(math.ceil((b - lo) * 1000)))
                path = "/api/v1/query"
                params = {"query": f"{SELECTOR}[{ms}ms]", "time": repr(b)}
            answer, error, split = None, None, False
            failures = busy = 0
            while True:
                report.requests += 1
                resp = None
                try:
                    resp = http.get(base + path, params=params)
                    try:
                        answer = resp.json()
                    except ValueError:
                        answer = None
                    if resp.status_code == 200 and isinstance(answer, dict) \
                            and answer.get("status") == "success":
                        break
                    if _too_large(resp, answer) and b - a >= 2 * min_split:
                        split = True
                        break
                    if resp.status_code in BUSY_STATUS and busy < BUSY_RETRIES:
                        sleep(_pause(resp, busy))
                        busy += 1
                        continue
                    detail = (f"{answer.get('errorType', '')} {answer.get('error', '')}".strip()
                              if isinstance(answer, dict) else resp.text[:200])
                    raise httpx.HTTPStatusError(
                        f"HTTP {resp.status_code}: {detail}", request=resp.request,
                        response=resp)
                except httpx.HTTPError as exc:
                    answer, error = None, f"{type(exc).__name__}: {exc}".strip()
                    failures += 1
                    if failures > retries:
                        break
            if split:
                mid = a + (b - a) / 2
                todo.extend([(mid, b), (a, mid)])
                continue
            if answer is None:
                if fetched == 0:
                    raise InputError(f"{url}: no answer from the Prometheus server ({error})")
                report.gaps.append(
                    {"start": a, "end": end, "error": error, "after_requests": report.requests}
                )
                break
            result = _result_of(answer, f"{base}{path} ({a}..{b})")
            if step and a > start:
                # query_range includes both ends: the shared edge is already in.
                for item in result:
                    item["values"] = [p for p in item.get("values", []) if float(p[0]) > a]
            n_series, n_samples = add_matrix(acc, result, f"{base}{path}")
            fetched += 1
            report.series = max(report.series, n_series)
            report.samples += n_samples
    finally:
        if own:
            http.close()
    return report


def scrape_exporter(
    url: str, acc: RunSamples, warnings: list[str], *, timeout: float = 10.0, t: float
) -> int:
    """One scrape of a live ``/metrics`` endpoint, in the plain text format (colons kept)."""
    check_url(url)
    try:
        resp = httpx.get(
            url, timeout=timeout, headers={"Accept": "text/plain; version=0.0.4"}
        )
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: cannot scrape ({type(exc).__name__}: {exc})") from None
    return add_scrape(acc, t, resp.text, url, warnings)
