"""The Prometheus view of a simulated run against vLLM 0.33.0's own exporter output."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpressure.simulation.engine import simulate
from kvpressure.simulation.prom_view import MODELLED_FAMILIES, PromRecorder
from kvpressure.simulation.scenario import load_scenario

DATA = Path(__file__).parent / "data" / "vllm-0.33-scheduler"
HEAVY = DATA / "heavy_closed_c64_fcfs.scenario.json"
HEAVY_PROM = DATA / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"
FIXTURE_DT = 0.015625  # the reference clock: step k at 1.0 + k * dt, outputs one step later

# Families exported but not modelled, with why their fixed values are right for a plain
# text-only engine without connectors (the fixture shows the same values).
NOT_MODELLED = {
    "vllm:estimated_flops_per_gpu": "MFU accounting is off by default (zero)",
    "vllm:estimated_read_bytes_per_gpu": "MFU accounting is off by default (zero)",
    "vllm:estimated_write_bytes_per_gpu": "MFU accounting is off by default (zero)",
    "vllm:engine_sleep_state": "sleep mode is not simulated (always awake)",
    "vllm:external_prefix_cache_queries": "no KV connector (zero)",
    "vllm:external_prefix_cache_hits": "no KV connector (zero)",
    "vllm:mm_cache_queries": "no multimodal input (zero)",
    "vllm:mm_cache_hits": "no multimodal input (zero)",
    "vllm:admission_rejections": "no frontend queue limits (zero)",
}


def _samples(text: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sample_lines(text: str) -> dict[str, float]:
    """Sample lines keyed by ``name{labels}`` (both writers sort labels), for fast exact
    comparison of hundreds of scrapes; ``_samples`` checks the format with the real parser."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _family_of(sample_name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


def _heavy_recorder(scenario) -> PromRecorder:
    s = scenario.settings
    return PromRecorder(
        "llama-reference",
        scrape_interval_s=50 * FIXTURE_DT,
        max_model_len=s.max_model_len,
        cache_config={"num_gpu_blocks": s.num_gpu_blocks, "block_size": s.block_size,
                      "gpu_memory_utilization": 0.9,
                      "enable_prefix_caching": s.enable_prefix_caching},
        time_origin_s=1.0,
    )


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    with gzip.open(HEAVY_PROM, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("fast_path", ["leap", "lazy", "off"])
def test_every_sample_of_every_scrape_matches_vllm(reference, fast_path):
    scenario = load_scenario(HEAVY)
    rec = _heavy_recorder(scenario)
    simulate(scenario, recorder=rec, fast_path=fast_path)
    rec.finish()
    assert len(rec.scrapes) == len(reference) == 159
    families_seen = set()
    for ours, ref in zip(rec.scrapes, reference, strict=True):
        assert ours["t"] == ref["t"]
        a, b = _sample_lines(ours["text"]), _sample_lines(ref["text"])
        for key, ref_value in b.items():
            name = key.split("{", 1)[0]
            if name == "vllm:cache_config_info":
                continue  # compared label by label in the next test
            families_seen.add(_family_of(name))
            assert key in a, f"t={ref['t']}: missing {key}"
            if name.endswith("_sum"):
                # float sums (TPOT means) may differ in the last bits with summation order
                assert a[key] == pytest.approx(ref_value, rel=1e-12, abs=1e-12), (ref["t"], key)
            else:
                assert a[key] == ref_value, (ref["t"], key)
        extra = {k for k in a if k not in b and not k.startswith("vllm:cache_config_info")}
        assert not extra
    # our text parses with prometheus_client's parser into the same samples and values
    parsed_ours, parsed_ref = (
        {k: v for k, v in _samples(x[-1]["text"]).items() if k[0] != "vllm:cache_config_info"}
        for x in (rec.scrapes, reference))
    assert parsed_ours == pytest.approx(parsed_ref, rel=1e-12)
    modelled = set(MODELLED_FAMILIES) - {"vllm:cache_config_info"}
    assert modelled | set(NOT_MODELLED) == families_seen
    # the fixture's headline numbers, as its README states them
    last = _samples(rec.scrapes[-1]["text"])
    base = (("engine", "0"), ("model_name", "llama-reference"))
    assert last[("vllm:num_preemptions_total", base)] == 95
    assert last[("vllm:iteration_tokens_total_sum", base)] == 474_663


def test_cache_config_info_labels_match_vllm(reference):
    scenario = load_scenario(HEAVY)
    rec = _heavy_recorder(scenario)
    ours = [k for k in _samples(rec.render()) if k[0] == "vllm:cache_config_info"]
    ref = [k for k in _samples(reference[-1]["text"]) if k[0] == "vllm:cache_config_info"]
    ours_labels, ref_labels = dict(ours[0][1]), dict(ref[0][1])
    for label in ("num_gpu_blocks", "block_size", "gpu_memory_utilization",
                  "enable_prefix_caching", "engine", "cache_dtype", "prefix_caching_hash_algo",
                  "num_gpu_blocks_override"):
        assert ours_labels[label] == ref_labels[label], label


def test_preemption_lag_and_counting_rules_by_hand():
    """Drive the hooks directly: a request preempted mid-decode, prefix caching on."""
    rec = PromRecorder("m", scrape_interval_s=100.0,
                       cache_config={"enable_prefix_caching": True})
    a = SimpleNamespace(request_id="a", num_prompt_tokens=100, max_tokens=3, num_tokens=100,
                        num_preemptions=0, prefix_hit_tokens_at_admission=32,
                        arrival_time_s=None)
    rec.on_arrival(a, 0.0)
    rec.on_scheduled(a, 0.0)
    rec.on_step_end(1.0, 1, 0, 0, 0.5, 100, 32)  # mid-prompt chunk: no output
    assert rec.h_iteration.n == 0 and rec.prefix_cache_queries == 100
    assert rec.prefix_cache_hits == 32
    rec.on_output(a, 2.0, 1, False)  # first token
    rec.on_step_end(2.0, 1, 0, 0, 0.5)
    assert rec.prompt_tokens == 100 and rec.prompt_local_cache_hit == 32
    assert rec.h_iteration.total == 68 + 1  # computed prompt tokens + the generated token
    # preempted at 2.0, re-admitted at 3.0 (L = 101, a resumed request: no prefix counting)
    a.num_preemptions = 1
    a.num_tokens = 101
    rec.on_preempted(a, 2.0)
    rec.on_step_end(3.0, 0, 1, 0, 0.0)
    assert rec.num_preemptions == 0  # not yet: vLLM counts it with the next output
    rec.on_scheduled(a, 3.0)
    rec.on_output(a, 4.0, 1, False)
    rec.on_step_end(4.0, 1, 0, 0, 0.5, 101, 96)
    assert rec.num_preemptions == 1
    assert rec.prefix_cache_queries == 100 and rec.prefix_cache_hits == 32
    assert rec.prompt_tokens == 100  # counted once
    rec.on_output(a, 4.5, 1, True)
    rec.on_step_end(4.5, 0, 0, 0, 0.0)
    assert rec.generation_tokens == 3 and rec.request_success["length"] == 1
    assert rec.h_ttft.total == 2.0 and rec.h_itl.total == pytest.approx(2.0 + 0.5)
    assert rec.h_e2e.total == 4.5 and rec.h_queue.total == 0.0
    assert rec.h_prefill.total == 2.0 and rec.h_decode.total == 2.5
    assert rec.h_tpot.total == pytest.approx(2.5 / 2)
    assert rec.h_preemptions.total == 1 and rec.h_prefill_kv.total == 68


@pytest.mark.parametrize("fast_path", ["leap", "lazy"])
def test_timed_fast_path_view_equals_step_by_step(fast_path):
    """The decode leaps (split at scrape boundaries) and the lazy decoding head give the same
    scrapes as single steps, in time."""
    from kvpressure.simulation.experiment import load_experiment

    exp = load_experiment("ci_small")
    texts = []
    for path in (fast_path, "off"):
        point = exp.point(concurrency=32)
        simulate(point.scenario, cost_model=point.cost_model, recorder=point.recorder,
                 fast_path=path)
        point.recorder.finish()
        texts.append(point.recorder.scrapes)
    fast, slow = texts
    assert len(fast) == len(slow) > 10
    for x, y in zip(fast, slow, strict=True):
        assert x["t"] == pytest.approx(y["t"], abs=1e-9)
        a, b = _sample_lines(x["text"]), _sample_lines(y["text"])
        assert a.keys() == b.keys()
        for key in b:
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-9), (y["t"], key)


def test_scrapes_are_periodic_and_final(tmp_path):
    from kvpressure.simulation.experiment import load_experiment

    point = load_experiment("ci_small").point(concurrency=8)
    result = simulate(point.scenario, cost_model=point.cost_model, recorder=point.recorder)
    result.write(tmp_path)
    lines = (tmp_path / "metrics.prom.jsonl").read_text().splitlines()
    ts = [json.loads(line)["t"] for line in lines]
    interval = point.recorder.scrape_interval_s
    assert ts[:-1] == [pytest.approx(interval * (k + 1)) for k in range(len(ts) - 1)]
    assert ts[-1] == pytest.approx(result.summary["duration_s"])
    last = _samples(json.loads(lines[-1])["text"])
    labels = (("engine", "0"), ("model_name", "llama-3.1-8b"))
    assert last[("vllm:generation_tokens_total", labels)] == result.summary["total_output_tokens"]
    assert last[("vllm:request_success_total", labels[:1] + (("finished_reason", "length"),)
                 + labels[1:])] == result.summary["num_requests"]


def test_sample_values_are_written_as_the_client_library_writes_them():
    """Our own formatter (kept off the light simulate path) agrees with prometheus_client's."""
    import random

    from prometheus_client.utils import floatToGoString

    from kvpressure.simulation.prom_exposition import count_text, format_value

    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 999999.0, 1e6, 1234567.0, 1e21,
              4558.96875, 2.5e-7]
    values += [rng.choice([1, -1]) * 10 ** rng.uniform(-8, 25) for _ in range(5000)]
    values += [float(rng.randint(0, 10**12)) for _ in range(5000)]
    for v in values:
        assert format_value(v) == floatToGoString(v), v
    # counts (histogram buckets) have their own formatter, exact on either side of 10**6
    counts = [0, 1, 9, 10, 999_999, 1_000_000, 1_000_001, 1_234_567, 10**7, 2**53]
    counts += [rng.randint(0, 10**rng.randint(1, 12)) for _ in range(5000)]
    for n in counts:
        assert count_text(n) == floatToGoString(n) == format_value(n), n


def _one_by_one(total: float, values: list[float], times: list[int]) -> float:
    for v, c in zip(values, times, strict=True):
        for _ in range(c):
            total += v
    return total


@pytest.mark.parametrize("numpy_loaded", [True, False], ids=["numpy", "no-numpy"])
def test_histogram_sum_is_the_one_by_one_running_sum(monkeypatch, numpy_loaded):
    """The _sum of a bulk observation is bit for bit the sum of the observations added one by
    one, on the exact shortcut (multiples of a power of two, integers) and off it."""
    import random
    import sys

    from kvpressure.simulation.prom_histogram import running_sum

    if not numpy_loaded:
        monkeypatch.setitem(sys.modules, "numpy", None)  # as on the step-clock simulate path
    rng = random.Random(15)
    makers = [
        lambda: rng.randint(0, 300) / 64,                              # the fixed clock's gaps
        lambda: rng.random() * 0.1,                                    # a cost model's gaps
        lambda: float(rng.randint(0, 5000)),                           # token counts
        lambda: rng.randint(1, 10**6) * 2.0 ** rng.randint(-60, 20),   # any binade
        lambda: rng.choice([0.0, -0.0, 1e16, 2.0**-30, -1.5, 3]),      # signs, zeros, ints
    ]
    for trial in range(3000):
        make = makers[trial % len(makers)]
        n = rng.randint(1, 5)
        values = [make() for _ in range(n)]
        longest = rng.choice([3, 120, 400])  # the chain, the shortcut, numpy
        times = [rng.randint(0, longest) for _ in range(n)]
        total = rng.choice([0.0, -0.0, rng.random() * 100, rng.randint(0, 10**9) / 64,
                            2.0**52, 2.0**53 - 1])
        got, want = running_sum(total, values, times), _one_by_one(total, values, times)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), \
            (total, values, times)
    # beyond 2**53 the additions round: the shortcut must not be taken
    assert running_sum(2.0**53, [1.0], [3]) == _one_by_one(2.0**53, [1.0], [3]) == 2.0**53
    assert running_sum(0.1, [0.2], [1]) == 0.1 + 0.2 != 0.3
    assert math.isnan(running_sum(0.0, [math.inf, -math.inf], [1, 1]))
