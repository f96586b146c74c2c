"""The exposition formats by their standards, and a Prometheus server that is busy or strict.

Hand-made logs with known totals: 9 intervals of 3 preemptions and 100 generated tokens over
5 s each, so 27 preemptions and 900 tokens in 45 s (20 tok/s) whatever the format says around
the samples.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import window_increase
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.prom_text import openmetrics_as_prometheus

OPENMETRICS = """# HELP vllm:num_preemptions Preemptions.
# TYPE vllm:num_preemptions counter
# UNIT vllm:num_preemptions requests
vllm:num_preemptions_total{{engine="0",model_name="m # {{x}} 1 2"}} {p} # {{trace_id="abc"}} 1.0 1234.5
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m # {{x}} 1 2"}} {g} # {{trace_id="d e"}} 3.0
# EOF
"""


def _log(path: Path, texts: list[str], t0: float = 1000.0) -> Path:
    path.write_text("".join(json.dumps({"t": t0 + 5 * i, "text": text}) + "\n"
                            for i, text in enumerate(texts)))
    return path


def test_exemplars_are_not_timestamps_and_eof_ends_the_text(tmp_path):
    texts = [OPENMETRICS.format(p=3 * i, g=100 * i) + "garbage after EOF {\n" for i in range(10)]
    result = ingest([_log(tmp_path / "om.jsonl", texts)], run="om")
    s = result.series
    assert sorted(s["t"].unique()) == [1000.0 + 5 * i for i in range(10)]
    assert window_increase(s, "vllm:num_preemptions_total") == 27
    row = result.runs.iloc[0]
    assert row["duration_s"] == 45 and row["output_throughput"] == 20


def test_openmetrics_timestamps_are_seconds():
    text = 'vllm:num_requests_running{engine="0"} 4 1700000000.5 # {a="b"} 1 2\n# EOF\n'
    assert openmetrics_as_prometheus(text).split("\n")[0] == \
        'vllm:num_requests_running{engine="0"} 4 1700000000500'


def _scrape(i: int, preempt: bool = True) -> str:
    lines = ["# TYPE vllm:generation_tokens counter",
             f'vllm:generation_tokens_total{{engine="0"}} {100 * i}']
    if preempt:
        lines += ["# TYPE vllm:num_preemptions counter",
                  f'vllm:num_preemptions_total{{engine="0"}} {3 * i}']
    return "\n".join(lines) + "\n"


def test_a_series_absent_from_some_scrapes_is_counted_across_the_gap_and_reported(
        tmp_path, capsys):
    log = _log(tmp_path / "gap.jsonl", [_scrape(i, preempt=not 3 <= i <= 6) for i in range(10)])
    result = ingest([log], run="gap")
    assert window_increase(result.series, "vllm:num_preemptions_total") == 27
    notes = result.report.runs["gap"]["series_presence"]
    assert notes == ["run gap: series vllm:num_preemptions_total absent from 4 of the 10 "
                     "scrapes in between (counted across the gap)"]
    assert main(["ingest", str(log), "--out", str(tmp_path / "o")]) == 0
    assert "absent from 4 of the 10" in capsys.readouterr().err


def test_a_series_that_vanishes_says_how_far_it_counts(tmp_path):
    log = _log(tmp_path / "v.jsonl", [_scrape(i, preempt=i <= 4) for i in range(10)])
    result = ingest([log], run="v")
    assert window_increase(result.series, "vllm:num_preemptions_total") == 12
    (note,) = result.report.runs["v"]["series_presence"]
    assert "vanishes after t=1020" in note and "ends at 1045" in note


def test_duplicates_are_reported_on_the_console(tmp_path, capsys):
    text = _scrape(1) + 'vllm:num_preemptions_total{engine="0"} 5\n'
    log = _log(tmp_path / "d.jsonl", [text, _scrape(2)])
    assert main(["ingest", str(log), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "repeated" in err or "duplicate" in err


def test_a_scrape_log_whose_first_line_is_over_64_kib_is_recognised(tmp_path):
    body = "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {e % 7}\n' for e in range(1300))
    log = _log(tmp_path / "wide.jsonl", [body] * 3)
    assert len(log.read_text().split("\n", 1)[0]) > 65536
    result = ingest([log], run="wide")
    assert result.report.sources[0]["kind"] == "prom_jsonl"
    assert result.series["metric"].nunique() == 1 and len(result.series) == 3900


# --------------------------------------------------------------------------- Prometheus API
class _Strict(BaseHTTPRequestHandler):
    """A Prometheus that is busy twice, then refuses windows longer than 300 s as too large."""

    calls: list[tuple[str, float]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        from urllib.parse import parse_qs, urlparse

        q = parse_qs(urlparse(self.path).query)
        query, end = q["query"][0], float(q["time"][0])
        seconds = float(query.rsplit("[", 1)[1].rstrip("ms]")) / 1000
        type(self).calls.append((query, end))
        if len(type(self).calls) <= 2:
            return self._answer(503, {"status": "error", "errorType": "unavailable",
                                      "error": "busy"}, {"Retry-After": "0"})
        if seconds > 300.5:
            return self._answer(422, {"status": "error", "errorType": "execution",
                                      "error": "query processing would load too many samples "
                                      "into memory"})
        lo = end - seconds
        values = [[t, str(t / 10)] for t in range(0, 1201, 100) if lo < t <= end]
        self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "vllm_num_preemptions_total"}, "values": values}]}})

    def _answer(self, code: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def strict_server() -> Iterator[str]:
    _Strict.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Strict)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_busy_answers_are_retried_and_large_ranges_split(strict_server):
    result = ingest([strict_server], run="p", options=IngestOptions(start=0, end=1200))
    s = result.series
    # every sample 0..1200 s once, in order: nothing lost to the 503s or the 422s
    assert s["t"].tolist() == [float(t) for t in range(0, 1201, 100)]
    assert window_increase(s, "vllm:num_preemptions_total") == 120
    assert result.report.gaps == []
    assert len(_Strict.calls) > 4  # two busy answers, refusals, then the split windows
