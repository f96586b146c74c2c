"""Both reference runs of vLLM 0.33.0's own scheduler, reproduced exactly: every row of
steps.csv and requests.csv and every count of summary.json, on every fast-path setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpressure.simulation.engine import FAST_PATHS, simulate
from kvpressure.simulation.scenario import load_scenario

DATA = Path(__file__).parent / "data" / "vllm-0.33-scheduler"
NAMES = ["light_open_prefix_groups", "heavy_closed_c64_fcfs"]
COUNT_KEYS = ["num_requests", "total_prompt_tokens", "total_output_tokens", "steps",
              "last_step", "preemptions", "requests_preempted", "recomputed_tokens",
              "total_scheduled_tokens", "prefill_tokens", "decode_tokens", "recompute_ratio",
              "prefix_cache_queries", "prefix_cache_hits", "mean_running", "max_running",
              "mean_kv_usage", "max_kv_usage", "mode"]


@pytest.fixture(scope="module", params=[(n, fp) for n in NAMES for fp in FAST_PATHS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def run(request):
    name, fast_path = request.param
    sc = load_scenario(DATA / f"{name}.scenario.json")
    return name, simulate(sc, fast_path=fast_path)


def test_steps_csv_is_identical(run):
    name, res = run
    assert res.steps_csv() == (DATA / f"{name}.steps.csv").read_text()


def test_requests_csv_is_identical(run):
    name, res = run
    assert res.requests_csv() == (DATA / f"{name}.requests.csv").read_text()


def test_summary_counts_are_identical(run):
    name, res = run
    ref = json.loads((DATA / f"{name}.summary.json").read_text())
    for key in COUNT_KEYS:
        assert res.summary[key] == ref[key], key
    for key, value in ref["settings"].items():
        assert res.summary["settings"][key] == value, key


def test_accounting_identity_per_request(run):
    _, res = run
    for r in res.requests:
        assert r.scheduled_tokens == (r.num_prompt_tokens + r.max_tokens - 1
                                      - r.prefix_hit_tokens_at_admission + r.recomputed_tokens)
