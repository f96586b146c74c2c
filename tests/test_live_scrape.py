"""Scraping a live /metrics endpoint into a scrape log, and reading it back with ingestion."""

from __future__ import annotations

import json
import threading
import time
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
                        max_failures=3, clock=clock, sleep=clock.sleep)
    assert log.scrapes == 2 and len(log.failures) == 3
    assert log.gave_up and "--max-failures 3" in log.gave_up
    lines = [json.loads(x) for x in (tmp_path / "live.jsonl").read_text().splitlines()]
    assert [("text" in x, "gap" in x) for x in lines] == [(True, False)] * 2 + [(False, True)] * 3
    # The pause after each failure doubles (1, 2 s) instead of retrying on the 1 s grid.
    assert [x["t"] for x in lines] == [1000.0, 1001.0, 1002.0, 1003.0, 1005.0]


def test_unreachable_server_and_bad_parameters_are_refused(tmp_path: Path) -> None:
    clock = _FakeClock()
    with pytest.raises(InputError, match="no scrape succeeded"):
        scrape_to_log("http://127.0.0.1:9/metrics", tmp_path / "x.jsonl", interval_s=1,
                      count=2, timeout_s=0.5, clock=clock, sleep=clock.sleep)
    with pytest.raises(InputError, match="--interval"):
        scrape_to_log("http://127.0.0.1:9/metrics", tmp_path / "x.jsonl", interval_s=0)


# --------------------------------------------------------------------------- hardening
GOOD = (
    "# TYPE vllm:num_preemptions_total counter\n"
    'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0\n'
)


class _Scripted(BaseHTTPRequestHandler):
    """Answers the k-th GET with ``answers[k]`` (the last one repeats): (status, content type,
    body, seconds to wait between the body's bytes)."""

    answers: list[tuple[int, str, bytes, float]] = []
    hits = 0

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        cls = type(self)
        status, ctype, body, trickle = cls.answers[min(cls.hits, len(cls.answers) - 1)]
        cls.hits += 1
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if trickle:
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(trickle)
            else:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def scripted():
    _Scripted.hits = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_bodies_that_are_not_prometheus_text_are_gaps_with_their_reason(
    scripted: str, tmp_path: Path
) -> None:
    text = "text/plain; version=0.0.4"
    _Scripted.answers = [
        (200, text, GOOD.encode(), 0.0),
        (200, "text/html", b"<html><body>502 Bad Gateway</body></html>", 0.0),
        (200, text, b"", 0.0),
        (200, text, b"\x00\xff\xfe garbage", 0.0),
        (200, text, b"hello world, this is not an exposition\n", 0.0),
        (200, text, GOOD.encode(), 0.0),
    ]
    clock = _FakeClock()
    log = scrape_to_log(scripted, tmp_path / "live.jsonl", interval_s=1, count=6,
                        clock=clock, sleep=clock.sleep)
    assert log.scrapes == 2
    reasons = [f["error"] for f in log.failures]
    assert len(reasons) == 4
    assert "HTML" in reasons[0] and "empty body" in reasons[1]
    assert "UTF-8" in reasons[2] and "line 1 is not a Prometheus sample" in reasons[3]
    lines = _lines(tmp_path / "live.jsonl")
    assert [x.get("gap") for x in lines[1:5]] == reasons
    # Ingestion reads the good scrapes and names the gaps.
    result = ingest([tmp_path / "live.jsonl"], run="live")
    assert sorted(result.series["t"].unique()) == [lines[0]["t"], lines[5]["t"]]
    assert sum("recorded a gap" in w for w in result.report.warnings) == 4


def test_an_outage_does_not_end_the_log_while_the_duration_lasts(
    scripted: str, tmp_path: Path
) -> None:
    text = "text/plain; version=0.0.4"
    # Up, then 30 failed scrapes (far beyond the old limit of 12), then up again.
    _Scripted.answers = [(200, text, GOOD.encode(), 0.0)] + [(503, text, b"", 0.0)] * 30 + [
        (200, text, GOOD.encode(), 0.0)]
    clock = _FakeClock()
    log = scrape_to_log(scripted, tmp_path / "live.jsonl", interval_s=1, duration_s=3600,
                        clock=clock, sleep=clock.sleep)
    assert log.gave_up is None and len(log.failures) == 30 and log.scrapes > 1
    times = [x["t"] for x in _lines(tmp_path / "live.jsonl")]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # Back-off: the pause doubles and stays capped at 30 s; no catch-up burst after it.
    assert gaps[:6] == [1.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert max(gaps) == 30.0 and min(gaps) >= 1.0
    assert times[-1] <= 1000.0 + 3600


def test_a_log_whose_last_line_was_cut_gets_the_next_scrape_on_a_line_of_its_own(
    scripted: str, tmp_path: Path
) -> None:
    _Scripted.answers = [(200, "text/plain", GOOD.encode(), 0.0)]
    path = tmp_path / "live.jsonl"
    first = json.dumps({"t": 990.0, "text": GOOD})
    path.write_text(first + "\n" + first[: len(first) // 2])  # killed mid-write
    clock = _FakeClock()
    scrape_to_log(scripted, path, interval_s=1, count=2, clock=clock, sleep=clock.sleep)
    raw = path.read_text().splitlines()
    assert raw[1] == first[: len(first) // 2]
    assert [json.loads(x)["t"] for x in raw[2:]] == [1000.0, 1001.0]
    result = ingest([path], run="live")
    assert sorted(result.series["t"].unique()) == [990.0, 1000.0, 1001.0]
    assert any("cut short" in w for w in result.report.warnings)


def test_a_trickling_server_cannot_hold_a_scrape_past_the_total_timeout(
    scripted: str, tmp_path: Path
) -> None:
    # One byte every 0.2 s: each read returns within the timeout, the whole body would take 16 s.
    _Scripted.answers = [(200, "text/plain", GOOD.encode(), 0.2)]
    started = time.monotonic()
    with pytest.raises(InputError, match="no scrape succeeded .*longer than 1 s"):
        scrape_to_log(scripted, tmp_path / "live.jsonl", interval_s=1, count=1, timeout_s=1.0)
    assert time.monotonic() - started < 4.0


def test_bad_options_and_targets_are_refused_naming_them(tmp_path: Path) -> None:
    for kwargs, match in (({"interval_s": float("nan")}, "--interval"),
                          ({"interval_s": float("inf")}, "--interval"),
                          ({"timeout_s": -5}, "--timeout"),
                          ({"duration_s": float("nan"), "interval_s": 1}, "--duration"),
                          ({"max_failures": 0}, "--max-failures")):
        with pytest.raises(InputError, match=match):
            scrape_to_log("http://127.0.0.1:9/metrics", tmp_path / "x.jsonl", **kwargs)
    with pytest.raises(InputError, match=r"http://\[::1"):
        scrape_to_log("http://[::1", tmp_path / "x.jsonl")
    with pytest.raises(InputError, match="is a folder"):
        scrape_to_log("http://127.0.0.1:9/metrics", tmp_path, count=1)
    with pytest.raises(InputError, match="cannot write"):
        scrape_to_log("http://127.0.0.1:9/metrics", Path("/dev/full"), count=1)


def test_openmetrics_with_exemplars_and_eof_is_prometheus_text() -> None:
    from kvpressure.ingestion.live_scrape import exposition_problem

    body = (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3 # {trace_id="abc"} 0.5 1700000000.1\n'
        "vllm:e2e_request_latency_seconds_count 3 1700000000\n"
        "vllm:kv_cache_usage_perc NaN\n"
        'vllm:x{a="b}c"} -1.5e-3\n'
        "# EOF\n"
    )
    assert exposition_problem(body.encode()) is None
    assert "line 2" in exposition_problem(b"# HELP x y\nx{a=\"b\" 2\n")
    assert exposition_problem(b"# only comments\n") == "no samples (comments only)"
