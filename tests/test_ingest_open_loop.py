"""A real open-loop sweep (``vllm bench serve --request-rate R``, no ``--max-concurrency``)
ingested with its scrape log (``tests/data/twin_real_open/README.md``): one row per rate, on
no concurrency, each placed in the scrape log by its window, the preemptions the server's
counter counted, none lost and none counted twice."""

from __future__ import annotations

import gzip
import json
import math
import re

import numpy as np
import pytest

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.paths import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "twin_real_open"
BENCH = sorted((DATA / "bench").glob("rate-*.json"),
               key=lambda p: float(p.stem.removeprefix("rate-")))
_COUNTER = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})? (\S+)$", re.M)


@pytest.fixture(scope="module")
def runs():
    got = ingest([DATA / "bench", DATA / "metrics.prom.jsonl.gz"], run="load",
                 engine=EngineFacts(scheduler_reserve_full_isl=False))
    return got.runs.sort_values("request_rate").reset_index(drop=True)


@pytest.fixture(scope="module")
def results():
    return [json.loads(p.read_text()) for p in BENCH]


@pytest.fixture(scope="module")
def counter():
    """The preemption counter at each scrape, read from the log's text with a regex of its
    own (not through the ingestion under test)."""
    times, values = [], []
    with gzip.open(DATA / "metrics.prom.jsonl.gz", "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            found = _COUNTER.findall(rec.get("text", ""))
            if found:
                times.append(rec["t"])
                values.append(sum(float(v) for v in found))
    return np.array(times), np.array(values)


def test_one_row_per_rate_with_the_rate_and_no_concurrency(runs, results):
    assert len(BENCH) == 6
    assert runs["request_rate"].tolist() == [float(p.stem.removeprefix("rate-")) for p in BENCH]
    assert runs["request_rate"].tolist() == [r["request_rate"] for r in results]
    # an open loop: vLLM wrote max_concurrency null, and no row may invent one
    assert all(r["max_concurrency"] is None for r in results)
    assert runs["concurrency"].isna().all()
    for (_, row), res in zip(runs.iterrows(), results, strict=True):
        assert row["num_requests"] == res["completed"] == 48
        assert row["output_throughput"] == pytest.approx(res["output_throughput"], rel=1e-12)
        assert row["request_throughput"] == pytest.approx(res["request_throughput"], rel=1e-12)


def test_preemptions_summed_over_the_rates_are_the_counters_increase_over_the_sweep(
        runs, counter):
    _, values = counter
    increase = values[-1] - values[0]
    # the sweep went past the knee: a check on nothing would pass on nothing
    assert increase > 100
    assert runs["preemptions"].notna().all()
    assert runs["preemptions"].sum() == increase


def test_each_rows_preemptions_are_the_increase_across_its_window(runs, counter):
    # The server idles between rates, so the counter's increase from the last scrape before a
    # level's start to the first after its end is that level's alone.
    times, values = counter
    for _, row in runs.iterrows():
        before = np.searchsorted(times, row["t_start"], side="right") - 1
        after = np.searchsorted(times, row["t_end"], side="left")
        assert before >= 0 and after < len(times)
        assert row["preemptions"] == values[after] - values[before], row["request_rate"]


def test_each_window_is_the_levels_own_and_inside_the_scrape_log(runs, results, counter):
    times, _ = counter
    for (_, row), res in zip(runs.iterrows(), results, strict=True):
        window = res["kvpressure_window"]
        assert row["t_start"] == pytest.approx(window["start"], abs=1e-6)
        # the end may be moved to the scrape that closes the level, never past the next one
        assert window["end"] - 1e-6 <= row["t_end"] <= window["end"] + 1.0
        assert times[0] <= row["t_start"] < row["t_end"] <= times[-1]
    # increasing rates one after the other, the server idle in between
    assert (runs["t_start"].iloc[1:].to_numpy() > runs["t_end"].iloc[:-1].to_numpy()).all()


def test_the_send_times_fall_in_their_levels_window(results):
    # start_times are the client's perf_counter; kvpressure_clock pairs it with unix time
    for res in results:
        clock, window = res["kvpressure_clock"], res["kvpressure_window"]
        sent = np.array(res["start_times"]) + clock["unix"] - clock["perf_counter"]
        assert len(sent) == res["num_prompts"] == 48
        assert np.all(np.diff(sent) >= 0)
        assert window["start"] < sent[0] and sent[-1] < window["end"]
        # each request also finished inside the window
        ends = sent + np.array(res["latencies"])
        assert ends.max() < window["end"] and not any(res["errors"])
        assert math.isfinite(res["duration"]) and ends.max() - sent[0] <= res["duration"] + 1e-3


def test_the_notes_say_each_window_is_the_results_own():
    # Each result carries its exact span (kvpressure_window): the note must not say the span
    # was rebuilt from vLLM's whole-second 'date'.
    got = ingest([DATA / "bench", DATA / "metrics.prom.jsonl.gz"], run="load",
                 engine=EngineFacts(scheduler_reserve_full_isl=False))
    placed = [w for w in got.report.warnings if "preemption columns from scrapes in" in w]
    assert len(placed) == len(BENCH)
    assert all("(the result's kvpressure_window)" in w and "'date'" not in w for w in placed)
