"""Round trip through a real Prometheus server: exporter -> Prometheus -> live ingestion.

The exporter replays twelve scrapes of vLLM 0.33.0's own metrics (the heavy reference run)
through prometheus_client's HTTP handler, one scrape text per Prometheus scrape. Reading the
server back must give the same series as reading the scrape texts directly: the same values,
in the same order, at the times they were scraped, with ``vllm_`` names mapped to ``vllm:``.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import pytest

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.ingest_options import IngestOptions
from prometheus_server import prometheus_server, replay_exporter, require_prometheus

pytestmark = pytest.mark.prometheus

FIXTURE = Path(__file__).parent / "data" / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"
FIRST, COUNT = 40, 12  # scrapes 40..51 of the heavy run: preemptions happen in between

CHECKED = [
    ("vllm:num_preemptions_total", ""),
    ("vllm:generation_tokens_total", ""),
    ("vllm:num_requests_running", ""),
    ("vllm:kv_cache_usage_perc", ""),
    ("vllm:num_requests_waiting_by_reason", "reason=capacity"),
    ("vllm:time_to_first_token_seconds_bucket", "le=20.0"),
    ("vllm:inter_token_latency_seconds_count", ""),
]


def _texts() -> list[str]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as fh:
        lines = fh.readlines()[FIRST : FIRST + COUNT]
    return [json.loads(line)["text"] for line in lines]


def _values(series, metric: str, labels: str) -> list[float]:
    rows = series[(series["metric"] == metric) & (series["labels"] == labels)]
    return rows.sort_values("t")["value"].tolist()


@pytest.mark.slow
def test_live_prometheus_gives_back_what_was_scraped(tmp_path: Path) -> None:
    binary = require_prometheus()
    texts = _texts()
    log = tmp_path / "replayed.metrics.prom.jsonl"
    log.write_text(
        "".join(json.dumps({"t": float(k), "text": t}) + "\n" for k, t in enumerate(texts)),
        encoding="utf-8",
    )
    direct = ingest([log], run="direct").series

    began = time.time()
    with replay_exporter(texts) as (target, collector):
        with prometheus_server(target, binary) as url:
            deadline = time.time() + 20
            while len(collector.served) < 6 and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)  # let the last scrape reach the TSDB head
            result = ingest([url], run="live",
                            options=IngestOptions(start=began - 5, end=time.time() + 1))
            stepped = ingest([url], run="stepped",
                             options=IngestOptions(start=began - 5, end=time.time(), step=1.0,
                                                   metrics="core"))
    served = list(collector.served)
    assert len(served) >= 6, "Prometheus did not scrape the exporter every second"

    live = result.series
    report = result.report.runs["live"]
    # Names came back escaped and were mapped to vLLM's spelling.
    assert report["mapped_names"]["vllm_num_preemptions_total"] == "vllm:num_preemptions_total"
    assert not any(str(m).startswith("vllm_") for m in live["metric"].unique())
    # Prometheus' own target labels and vLLM's single model/engine are dropped and recorded.
    assert set(report["dropped_labels"]) >= {"job", "instance", "model_name", "engine"}

    for metric, labels in CHECKED:
        got = _values(live, metric, labels)
        assert len(got) >= 5, (metric, got)
        expected = [_values(direct, metric, labels)[k] for _, k in served[: len(got)]]
        assert got == expected, metric

    # Samples sit at the times they were scraped (Prometheus stamps the scrape start).
    times = sorted(
        live[live["metric"] == "vllm:num_preemptions_total"]["t"].tolist()
    )
    for t, (wall, _) in zip(times, served, strict=False):
        assert abs(t - wall) < 0.5

    # Every live series is one the direct reading has (same canonical names and labels).
    direct_keys = set(zip(direct["metric"].astype(str), direct["labels"].astype(str), strict=True))
    live_keys = set(zip(live["metric"].astype(str), live["labels"].astype(str), strict=True))
    assert live_keys <= direct_keys
    # The pool geometry survives the trip (labels of vllm:cache_config_info).
    info = live[live["metric"] == "vllm:cache_config_info"]["labels"].astype(str).iloc[0]
    assert "num_gpu_blocks=2000" in info.split(",") and "block_size=16" in info.split(",")

    # query_range (step 1 s): every value is one the exporter served for that series.
    s = stepped.series
    counter = s[s["metric"] == "vllm:num_preemptions_total"]["value"].tolist()
    allowed = set(_values(direct, "vllm:num_preemptions_total", ""))
    assert counter and set(counter) <= allowed
    assert all(not math.isnan(v) for v in counter)


def test_missing_binary_skips_locally_but_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    import prometheus_server as ps

    monkeypatch.setattr(ps.shutil, "which", lambda name: None)
    monkeypatch.setattr(ps.os, "access", lambda path, mode: False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        ps.require_prometheus()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        ps.require_prometheus()


def test_live_exporter_url_is_scraped_once_in_plain_text() -> None:
    texts = _texts()[:1]
    direct_text = texts[0]
    with replay_exporter(texts) as (target, collector):
        result = ingest([f"http://{target}/metrics"], run="now")
    assert len(collector.served) == 1
    s = result.series
    # Plain text keeps vLLM's colons: nothing to map.
    assert result.report.runs["now"]["mapped_names"] == {}
    line = next(x for x in direct_text.splitlines() if x.startswith("vllm:num_preemptions_total"))
    assert _values(s, "vllm:num_preemptions_total", "") == [float(line.rpartition(" ")[2])]
