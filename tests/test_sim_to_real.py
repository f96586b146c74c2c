"""The simulation against a real vLLM server (benchmarks/data/sim_to_real: H100 SXM, measured
by inference-perf): the first minute of a held-out run's light stage, simulated from the
run's configuration alone. The full comparison is benchmarks/bench_sim_to_real.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_sim_to_real as s2r  # noqa: E402

from kvpressure.simulation.engine import simulate  # noqa: E402


@pytest.fixture(scope="module")
def run():
    runs = {r["id"]: r for r in s2r.load_runs()}
    run = dict(runs["20260218-084319-llama-2-70b-tp4-roleplay"])
    # One minute of the stage: the server's steady state at 6 req/s is reached in seconds.
    run["stages"] = [{**run["stages"][0], "duration_s": 60}]
    return run


def _predict(run, setting):
    point = s2r.experiment_for(run, setting).point(with_recorder=False)
    return s2r.stage_metrics(simulate(point.scenario, point.cost_model), run["stages"])[0]


def test_the_request_path_brings_ttft_to_the_real_servers(run):
    real = s2r.measured(run["stages"][0], s2r.engine_output_len(run))
    before, after = _predict(run, "before"), _predict(run, "after")
    # The engine core alone ends TTFT at the prefill step: short of the real server's.
    assert before["ttft_mean"] < after["ttft_mean"]
    # With the request path and async scheduling, within 30% of the real TTFT mean (a run
    # the profiles were not fitted on), and ITL and E2E within 15%.
    assert after["ttft_mean"] == pytest.approx(real["ttft_mean"], rel=0.30)
    assert after["itl_mean"] == pytest.approx(real["itl_mean"], rel=0.15)
    assert after["e2e_mean"] == pytest.approx(real["e2e_mean"], rel=0.15)
    # An open loop below capacity delivers what is sent.
    assert after["output_tps"] == pytest.approx(real["output_tps"], rel=0.05)
