"""What a run costs depends on what happens in it, not on idle simulated time nor on the pool's
nominal size: a billion idle steps, a billion-block pool."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from kvpressure.errors import InputError
from kvpressure.simulation.engine import StepClock, simulate
from kvpressure.simulation.prom_view import PromRecorder
from kvpressure.simulation.scenario import load_scenario
from kvpressure.simulation.scheduler import Scheduler

GAP = 10**9


def _gap_scenario(caching: bool):
    return load_scenario({
        "name": "gap", "mode": {"type": "open"},
        "settings": {"num_gpu_blocks": 64, "block_size": 16, "enable_prefix_caching": caching},
        "requests": [{"id": "a", "prompt_len": 40, "output_len": 5},
                     {"id": "b", "prompt_len": 40, "output_len": 5, "arrival_step": GAP}]})


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _value(samples: dict[str, float], name: str) -> float:
    (v,) = [v for k, v in samples.items() if k.split("{")[0] == name]
    return v


@pytest.mark.parametrize("caching", [True, False])
def test_idle_gap_of_a_billion_steps(tmp_path, caching):
    sc = _gap_scenario(caching)
    every = 10**6
    rec = PromRecorder.for_step_clock(sc, scrape_every_steps=every)
    cpu = time.process_time()
    res = simulate(sc, recorder=rec)
    path = rec.write(tmp_path)
    assert time.process_time() - cpu < 1.0
    # a: prefill and first token at step 0, its 5th token at step 4, then the empty step
    # after the drain (more arrivals follow); b arrives at step GAP and takes 5 steps.
    assert list(res.steps.columns["step"]) == [0, 1, 2, 3, 4, 5, GAP, GAP + 1, GAP + 2,
                                                 GAP + 3, GAP + 4]
    scrapes = [json.loads(line) for line in path.read_text().splitlines()]
    interval = every * StepClock.dt
    end = GAP + 5  # the last step's outputs are stamped one step after its start
    n_periodic = end // every
    assert len(scrapes) == n_periodic + 1
    # On the grid: scrape k at k * interval from the clock's origin (1.0), then the final one.
    for k, s in enumerate(scrapes[:-1], start=1):
        assert s["t"] == (1.0 + k * interval) - 1.0
    assert scrapes[-1]["t"] == end * StepClock.dt
    # Through the gap (after a's last output at step 5, before b arrives): every scrape shows the
    # idle engine, counters frozen at a's totals.
    gap = [s for s in scrapes[:-1] if 5 * StepClock.dt < s["t"] < GAP * StepClock.dt]
    assert len(gap) == GAP // every - 1
    first = _samples(gap[0]["text"])
    for s in gap:
        assert s["text"] == gap[0]["text"]
    assert _value(first, "vllm:num_requests_running") == 0
    assert _value(first, "vllm:num_requests_waiting") == 0
    assert _value(first, "vllm:kv_cache_usage_perc") == 0
    assert _value(first, "vllm:generation_tokens_total") == 5
    assert _value(first, "vllm:prompt_tokens_total") == 40
    assert _value(first, "vllm:e2e_request_latency_seconds_count") == 1
    last = _samples(scrapes[-1]["text"])
    assert _value(last, "vllm:generation_tokens_total") == 10
    assert _value(last, "vllm:e2e_request_latency_seconds_count") == 2
    # The in-memory log is the same sequence, read without expanding it.
    assert len(rec.scrapes) == len(scrapes)
    assert rec.scrapes[n_periodic // 2] == scrapes[n_periodic // 2]
    assert rec.scrapes[-1] == scrapes[-1]


def test_idle_gap_too_many_scrapes_is_refused_at_once():
    # Every 50 steps over a billion steps: 2e7 scrapes, ~900 GB of text; refused when the
    # gap is reached, naming the interval, instead of running for hours.
    sc = _gap_scenario(True)
    rec = PromRecorder.for_step_clock(sc)
    cpu = time.process_time()
    with pytest.raises(InputError, match=r"scrape_interval_s 0\.78125: .*20,000,000 scrapes"):
        simulate(sc, recorder=rec)
    assert time.process_time() - cpu < 1.0


@pytest.mark.parametrize("caching", [True, False])
def test_a_pool_of_a_billion_blocks_is_not_allocated(caching):
    # 256 requests of 3 blocks each in a 10**9-block pool: memory follows the ~800 blocks used.
    reqs = [{"id": f"r{i}", "prompt_len": 30, "output_len": 10 + i % 7,
             "prefix_group": "sys" if caching and i % 2 else None} for i in range(256)]
    for r in reqs:
        if r["prefix_group"] is None:
            del r["prefix_group"]
    data = {"name": "big", "mode": {"type": "closed", "concurrency": 256},
            "settings": {"num_gpu_blocks": 10**9, "block_size": 16, "max_num_seqs": 256,
                         "enable_prefix_caching": caching},
            "requests": reqs}
    if caching:
        data["prefix_groups"] = {"sys": {"length": 16}}
    tracemalloc.start()
    try:
        res = simulate(load_scenario(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One int per block of the pool would be 8 GB; the run's own objects are a few MB.
    assert peak < 20 * 2**20
    # The order is vLLM's: the free queue starts as ids 1..N-1, freed blocks go to its head.
    c = res.steps.columns
    assert sum(c["finished"]) == 256 and sum(c["preemptions"]) == 0
    assert max(c["kv_usage_after"]) < 1e-6
    pool = Scheduler(load_scenario(data).settings).kv.pool
    assert pool.get_new_blocks(3) == [1, 2, 3] and pool.pop_one() == 4
    pool.free_blocks([4, 2])
    assert pool.get_new_blocks(3) == [4, 2, 5]
    assert pool.num_free_blocks == 10**9 - 1 - 5  # 1, 3, 4, 2, 5 held
