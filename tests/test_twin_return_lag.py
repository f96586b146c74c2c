"""The clients' return lag in engine steps (twin/return_lag.py): recovered from a step trace
simulated with a known lag, converted from a turnaround in seconds, given by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from kvpressure.cli import main
from kvpressure.simulation.engine import simulate
from kvpressure.twin.basis import build_scenario
from kvpressure.twin.return_lag import from_step_trace, from_turnaround
from kvpressure.twin.synthetic import synthetic_workloads

# A pool that never fills at the low levels; max_num_seqs 8 keeps a waiting queue at c=30.
SETTINGS = dict(num_gpu_blocks=2000, block_size=16, max_num_seqs=8,
                max_num_batched_tokens=2048, max_model_len=1024, enable_prefix_caching=False)
PERIOD = 0.01


def _trace_of(loads, true_k: int, first_alone: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each level simulated with the lag ``true_k`` and its steps written as the iteration
    log's counts (every prompt fits one step, so a context request is a new admission), one
    step every ``PERIOD`` seconds, levels 10 s apart."""
    frames, levels, t = [], [], 1_750_000_000.0
    for c, w in sorted(loads.items()):
        w = dataclasses.replace(w, return_steps=true_k, first_alone=first_alone)
        rows = simulate(build_scenario(SETTINGS, w)).steps_frame()
        n = len(rows)
        ctx = rows["admitted_new"].to_numpy()
        frames.append(pd.DataFrame({
            "t": np.floor(t + np.arange(n) * PERIOD), "context_requests": ctx,
            "generation_requests": rows["num_scheduled_reqs"].to_numpy() - ctx}))
        levels.append({"concurrency": c, "t_start": t, "t_end": t + n * PERIOD})
        t += n * PERIOD + 10.0
    return pd.concat(frames, ignore_index=True), pd.DataFrame(levels)


@pytest.mark.parametrize("true_k, first_alone", [(2, True), (0, False), (4, False)])
def test_lag_and_first_request_alone_recovered_from_a_simulated_trace(true_k, first_alone):
    loads = synthetic_workloads((2, 3, 5, 30), input_len=(20, 60), output_len=(10, 40),
                                requests_per_level=40)
    steps, levels = _trace_of(loads, true_k, first_alone)
    lag = from_step_trace(steps, levels, SETTINGS, loads)
    assert lag.first_alone is first_alone
    for c in (2, 3, 5):
        assert lag.per_level[c]["how"].startswith("simulated requests per step")
        assert lag.return_steps[c] == true_k
    # At c=30 the waiting queue never empties, so no lag changes a step: the level takes the
    # informative levels' turnaround (true_k steps of PERIOD) over its own step period.
    assert lag.per_level[30]["how"].startswith("no lag changes")
    assert lag.return_steps[30] == true_k
    # The scenario the twin then simulates is the one the trace came from.
    w = lag.apply(loads)[5]
    assert (w.return_steps, w.first_alone) == (true_k, first_alone)


def test_a_given_lag_keeps_the_traces_first_request_alone():
    loads = synthetic_workloads((2, 3), input_len=(20, 60), output_len=(10, 40),
                                requests_per_level=20)
    steps, levels = _trace_of(loads, 1, True)
    lag = from_step_trace(steps, levels, SETTINGS, loads, return_steps=5)
    assert lag.return_steps == {2: 5, 3: 5} and lag.first_alone
    assert lag.source.startswith("given")


def test_turnaround_in_seconds_over_the_step_time_rounded():
    # The median gap over the levels that have one (12, 12 and 30 ms: 12 ms) at every level:
    # over 5 ms steps 2.4 -> 2; over 9 ms 1.33 -> 1; over 10 ms 1.2 -> 1; over 7 ms 1.71 -> 2.
    lag = from_turnaround({2: 0.012, 6: 0.012, 8: 0.030, 12: math.nan},
                          {2: 0.005, 6: 0.009, 8: 0.010, 12: 0.007})
    assert lag.return_steps == {2: 2, 6: 1, 8: 1, 12: 2}
    assert not lag.first_alone
    assert "API server" in lag.source


def test_no_measured_turnaround_is_no_lag():
    lag = from_turnaround({2: math.nan}, {2: 0.005})
    assert lag.return_steps == {2: 0}
    # said as nothing measured, not as a measured 0 ms
    assert lag.source.startswith("none") and "0.0 ms" not in lag.source


def test_twin_with_a_given_lag_simulates_it_and_says_so(tmp_path):
    from kvpressure.twin.api import build_twin
    from twin_helpers import synthetic_run

    folder = synthetic_run(tmp_path / "run", levels=(1, 2, 4))
    twin = build_twin(folder, return_steps=3)
    assert {w.return_steps for w in twin.workloads.values()} == {3}
    assert twin.basis(2).steps > build_twin(folder, return_steps=0).basis(2).steps
    text = twin.turnaround_assumption()
    assert "s + 1 + R" in text and "given (3 steps at every level)" in text


def test_twin_without_trace_or_client_gaps_keeps_the_next_step_return(tmp_path):
    from kvpressure.twin.api import build_twin
    from twin_helpers import synthetic_run

    folder = synthetic_run(tmp_path / "run", levels=(1, 2, 4))
    twin = build_twin(folder)
    assert twin.return_lag is None
    twin.fit(bootstrap=10)
    assert set(twin.return_lag.return_steps.values()) == {0}
    assert "resubmits at the next engine step" in twin.turnaround_assumption()


def test_cli_refuses_a_negative_return_lag(tmp_path, capsys):
    code = main(["twin", str(tmp_path), "--out", str(tmp_path / "o"), "--return-steps", "-1"])
    assert code == 2
    assert "--return-steps must be >= 0" in capsys.readouterr().err
