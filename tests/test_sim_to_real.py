"""The simulation against real vLLM servers (benchmarks/data/sim_to_real: H100, A100 and L40S,
measured by inference-perf): the first minute of held-out stages, simulated from each run's
configuration alone. The full comparison is benchmarks/bench_sim_to_real.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_sim_to_real as s2r  # noqa: E402

from kvpressure.simulation.engine import simulate  # noqa: E402

# Held-out runs (no codegen: none of them was used to set a profile value), one per card and
# per TP size of 1, 2, 4 and 8, dense and MoE.
HELD_OUT = (
    "20260218-084319-llama-2-70b-tp4-roleplay",
    "55-llama-3-1-8b-tp1-general-lite-1",
    "36-qwen3-14b-tp1-general-lite-1",
    "57-codellama-34b-tp2-general-lite-2-1",
    "51-mixtral-8x22b-tp8-roleplay-8",
)


# MAPE after the request path and the measured all-reduce on these five stages (first minute):
# TTFT mean 12.7%, ITL mean 3.4%, E2E mean 3.5%, E2E p99 12.4% with the A100 profile fitted on
# its calibration run (before it: TTFT mean 10.5%, ITL and E2E mean 5.4%, E2E p99 14.1%; the
# Qwen3-14B A100 stage's first minute, its cold prefills among it, now runs 17% long on TTFT
# where its whole stage runs 8% short); the bounds leave a little room.
BOUNDS = {"ttft_mean": 13.0, "itl_mean": 6.5, "e2e_mean": 6.5, "e2e_p99": 17.0}


def _minute(run: dict) -> dict:
    # One minute of the first stage: the servers' steady state at these rates is reached in
    # seconds.
    return {**run, "stages": [{**run["stages"][0], "duration_s": 60}]}


@pytest.fixture(scope="module")
def runs():
    every = {r["id"]: r for r in s2r.load_runs()}
    return {i: _minute(every[i]) for i in HELD_OUT}


def _simulate(run, setting):
    point = s2r.experiment_for(run, setting).point(with_recorder=False)
    return simulate(point.scenario, point.cost_model)


def _predict(run, setting):
    return s2r.stage_metrics(_simulate(run, setting), run["stages"])[0]


def test_the_request_path_brings_ttft_to_the_real_servers(runs):
    run = runs["20260218-084319-llama-2-70b-tp4-roleplay"]
    real = s2r.measured(run["stages"][0], s2r.engine_output_len(run))
    before, after = _predict(run, "before"), _predict(run, "after")
    # The engine core alone ends TTFT at the prefill step: short of the real server's.
    assert before["ttft_mean"] < after["ttft_mean"]
    assert after["ttft_mean"] == pytest.approx(real["ttft_mean"], rel=0.20)
    # An open loop below capacity delivers what is sent.
    assert after["output_tps"] == pytest.approx(real["output_tps"], rel=0.05)


def test_every_request_generates_the_max_tokens_the_load_generator_sends(runs):
    run = runs["55-llama-3-1-8b-tp1-general-lite-1"]
    result = _simulate(run, "after")
    # ignore_eos: vLLM stops at max_tokens, the workload's output_len, not at the client's
    # re-tokenised count of the text.
    assert {r.num_output_tokens for r in result.requests} == {s2r.engine_output_len(run)}
    assert s2r.engine_output_len(run) > run["stages"][0]["output_len_mean"]


def test_held_out_mape_stays_within_bounds(runs):
    rows = []
    for run in runs.values():
        rows.append({"measured": s2r.measured(run["stages"][0], s2r.engine_output_len(run)),
                     "before": _predict(run, "before"), "after": _predict(run, "after")})
    mape = s2r.mape(rows)
    after = {m: a for m, (_, a) in mape.items()}
    # A change of the cost model or the request path that loses fidelity fails here.
    assert after["ttft_mean"] < BOUNDS["ttft_mean"]
    assert after["itl_mean"] < BOUNDS["itl_mean"]
    assert after["e2e_mean"] < BOUNDS["e2e_mean"]
    assert after["e2e_p99"] < BOUNDS["e2e_p99"]
    # The simulation queues nowhere the real server does not.
    assert all(r["after"]["ttft_p99"] < 3 * r["measured"]["ttft_p99"] for r in rows)
    assert np.isfinite(list(after.values())).all()
