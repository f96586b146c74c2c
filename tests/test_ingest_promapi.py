"""Prometheus HTTP API answers (saved files) and a live server that stops answering."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import histogram_quantile, window_increase
from kvpressure.ingestion.ingest_options import IngestOptions

DATA = Path(__file__).parent / "data" / "promapi"


def test_saved_query_range_answer_is_mapped_and_labelled() -> None:
    result = ingest([DATA / "escaped_matrix.json"], run="prod")
    s = result.series
    info = result.report.runs["prod"]
    assert set(s["metric"].astype(str)) == {
        "vllm:num_preemptions_total",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
    }
    assert info["dropped_labels"] == {
        "engine": "0",
        "instance": "10.0.0.5:8000",
        "job": "vllm",
        "model_name": "llama",
    }
    # 10 -> 12 -> 3 (restart) -> 7: 2 + 3 + 4
    assert window_increase(s, "vllm:num_preemptions_total") == 9
    usage = s[s["metric"] == "vllm:kv_cache_usage_perc"]["value"].tolist()
    assert math.isnan(usage[1]) and usage[2] == 1.0
    # le="1" from the server is the same series as le="1.0" from a text dump
    les = set(s[s["metric"] == "vllm:time_to_first_token_seconds_bucket"]["labels"].astype(str))
    assert les == {"le=1.0", "le=+Inf"}
    # 9 new observations, 5 of them <= 1 s: rank 4.5 in the bucket [0, 1] -> 4.5 / 5
    q = histogram_quantile(s, "vllm:time_to_first_token_seconds", 0.5)
    assert math.isclose(q, 0.9)
    assert info["generation"] == "v1"


def test_empty_answer_is_missing_and_error_answers_are_refused() -> None:
    result = ingest([DATA / "empty_result.json"], run="e")
    assert result.series.empty
    assert any("holds no series" in w for w in result.report.warnings)
    assert "vllm:num_preemptions_total" in result.report.runs["e"]["metrics_missing"]
    with pytest.raises(InputError, match="bad_data"):
        ingest([DATA / "error_answer.json"])
    with pytest.raises(InputError, match="no __name__"):
        ingest([DATA / "expression_result.json"])


class _Flaky(BaseHTTPRequestHandler):
    """Answers the first query, then hangs longer than the client waits."""

    calls = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).calls += 1
        if type(self).calls > 1:
            time.sleep(1.0)
        body = json.dumps(
            {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [
                        {
                            "metric": {"__name__": "vllm_num_preemptions_total", "job": "v"},
                            "values": [[100.0, "1"], [400.0, "4"]],
                        }
                    ],
                },
            }
        ).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky_server() -> Iterator[str]:
    _Flaky.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_server_that_stops_answering_keeps_what_was_fetched(flaky_server: str) -> None:
    # 0..1500 s in raw mode: windows (0, 600], (600, 1200], (1200, 1500]
    result = ingest([flaky_server], run="live",
                    options=IngestOptions(start=0, end=1500, timeout=0.3))
    assert result.series["value"].tolist() == [1.0, 4.0]
    gaps = result.report.gaps
    assert len(gaps) == 1 and gaps[0]["start"] == 600 and gaps[0]["end"] == 1500
    assert "Timeout" in gaps[0]["error"]
    assert any("stopped answering" in w for w in result.report.warnings)
    assert _Flaky.calls == 3  # one good window, then the failing one and its retry


def test_server_url_needs_a_time_range(flaky_server: str) -> None:
    with pytest.raises(InputError, match="--start and --end"):
        ingest([flaky_server])
    with pytest.raises(InputError, match="must be after"):
        ingest([flaky_server], options=IngestOptions(start=10, end=5))
    with pytest.raises(InputError, match="not a time"):
        ingest([flaky_server], options=IngestOptions(start="yesterday", end="now"))
