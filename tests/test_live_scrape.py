"""Scraping a live /metrics endpoint into a scrape log, and reading it back with ingestion."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import window_increase
from kvpressure.ingestion.live_scrape import scrape_to_log


class _Exporter(BaseHTTPRequestHandler):
    """Answers like a vLLM server whose preemption counter grows by 2 per scrape; answers 503
    to the scrapes listed in ``fail_at`` (a server that stops answering for a while)."""

    hits = 0
    fail_at: set[int] = set()
    accept_seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        cls = type(self)
        cls.hits += 1
        cls.accept_seen.append(self.headers.get("Accept", ""))
        if cls.hits in cls.fail_at:
            self.send_response(503)
            self.end_headers()
            return
        body = (
            "# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {2.0 * cls.hits}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {cls.hits}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def exporter():
    _Exporter.hits, _Exporter.fail_at, _Exporter.accept_seen = 0, set(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_scrapes_land_in_a_log_that_ingestion_reads(exporter: str, tmp_path: Path) -> None:
    clock = _FakeClock()
    _Exporter.fail_at = {3}
    log = scrape_to_log(exporter, tmp_path / "live.jsonl", interval_s=5, count=5,
                        clock=clock, sleep=clock.sleep)
    assert log.scrapes == 4 and len(log.failures) == 1 and "503" in log.failures[0]["error"]
    assert all(a.startswith("text/plain") for a in _Exporter.accept_seen)
    result = ingest([tmp_path / "live.jsonl"], run="live")
    # counter 2, 4, (gap), 8, 10 at t = 1000, 1005, 1015, 1020: increase over the log is 8
    assert window_increase(result.series, "vllm:num_preemptions_total", 1000, 1020) == 8.0
    running = result.series[result.series["metric"] == "vllm:num_requests_running"]
    assert list(running["t"] - running["t"].min()) == [0.0, 5.0, 15.0, 20.0]


def test_what_was_collected_survives_a_server_that_stops_answering(
    exporter: str, tmp_path: Path
) -> None:
    clock = _FakeClock()
    _Exporter.fail_at = set(range(3, 100))
    log = scrape_to_log(exporter, tmp_path / "live.jsonl", interval_s=1, duration_s=60,
                        max_consecutive_failures=3, clock=clock, sleep=clock.sleep)
    assert log.scrapes == 2 and len(log.failures) == 3
    assert len((tmp_path / "live.jsonl").read_text().splitlines()) == 2


def test_unreachable_server_and_bad_parameters_are_refused(tmp_path: Path) -> None:
    clock = _FakeClock()
    with pytest.raises(InputError, match="no scrape succeeded"):
        scrape_to_log("http://127.0.0.1:9/metrics", tmp_path / "x.jsonl", interval_s=1,
                      count=2, timeout_s=0.5, clock=clock, sleep=clock.sleep)
    with pytest.raises(InputError, match="--interval"):
        scrape_to_log("http://127.0.0.1:9/metrics", tmp_path / "x.jsonl", interval_s=0)
