"""The Prometheus HTTP API: saved answers and a live server.

A server stores vLLM's names with the colon escaped (``vllm_num_requests_running``, toolchain
notes 9), so every query matches both spellings: ``{__name__=~"vllm[:_].+"}``.

Two ways to read a live server over ``[start, end]``:

* without ``step``: the raw samples at the times they were scraped, through range-vector
  queries (``/api/v1/query?query=<selector>[600s]&time=...``), one window after the other;
* with ``step``: ``/api/v1/query_range`` evaluated every ``step`` seconds (Prometheus' own
  lookback picks the sample), in chunks of at most 10,000 points per series (the server refuses
  more than 11,000).

A window that fails (timeout, refused connection, error answer) is tried once more; if it fails
again the server is taken to have stopped answering: what was fetched is kept and the rest of
the range is reported as a gap.
"""

from __future__ import annotations

import json
import math
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
    try:
        answer = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
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
) -> FetchReport:
    """Read ``[start, end]`` from a live Prometheus server into ``acc``."""
    if not end > start:
        raise InputError(f"{url}: --end ({end}) must be after --start ({start})")
    if step is not None and not step > 0:
        raise InputError(f"{url}: --step must be positive, got {step}")
    base = url.rstrip("/")
    report = FetchReport(url, start, end, step)
    span = step * MAX_POINTS if step else window_s
    own = client is None
    http = client or httpx.Client(timeout=timeout)
    try:
        windows = _windows(start, end, span)
        for k, (a, b) in enumerate(windows):
            if step:
                path = "/api/v1/query_range"
                params = {"query": SELECTOR, "start": repr(a), "end": repr(b), "step": repr(step)}
            else:
                # (a, b] as a range vector ending at b; the first window also takes a sample at a.
                lo = a - 0.001 if k == 0 else a
                ms = max(1, int(math.ceil((b - lo) * 1000)))
                path = "/api/v1/query"
                params = {"query": f"{SELECTOR}[{ms}ms]", "time": repr(b)}
            answer, error = None, None
            for _ in range(retries + 1):
                report.requests += 1
                try:
                    resp = http.get(base + path, params=params)
                    answer = resp.json()
                    if resp.status_code != 200 and answer.get("status") != "error":
                        raise httpx.HTTPStatusError(
                            f"HTTP {resp.status_code}", request=resp.request, response=resp
                        )
                    break
                except (httpx.HTTPError, ValueError) as exc:
                    answer, error = None, f"{type(exc).__name__}: {exc}".strip()
            if answer is None:
                report.gaps.append(
                    {"start": a, "end": end, "error": error, "after_requests": report.requests}
                )
                break
            result = _result_of(answer, f"{base}{path} ({a}..{b})")
            if step and k > 0:
                # query_range includes both ends: the shared edge is already in.
                for item in result:
                    item["values"] = [p for p in item.get("values", []) if float(p[0]) > a]
            n_series, n_samples = add_matrix(acc, result, f"{base}{path}")
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
    try:
        resp = httpx.get(
            url, timeout=timeout, headers={"Accept": "text/plain; version=0.0.4"}
        )
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise InputError(f"{url}: cannot scrape ({type(exc).__name__}: {exc})") from None
    return add_scrape(acc, t, resp.text, url, warnings)
