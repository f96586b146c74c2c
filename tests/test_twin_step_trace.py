"""The twin's step time fitted on the server's own steps (twin/step_trace.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.twin.fit import FitRefused
from kvpressure.twin.step_trace import busy_seconds, fit_step_trace

# Elapsed (forward pass) and the time outside it, per step; the period is their sum.
ELAPSED = {"t0": 4e-3, "t_prefill_token": 3e-5, "t_decode_seq": 2e-4}
OUTSIDE = {"t0": 1e-3, "t_prefill_token": 0.0, "t_decode_seq": 5e-5}


def _trace(n: int = 4000, noise: float = 0.0, seed: int = 1, prefill: bool = True
           ) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    # Three stretches with different batch sizes, as a sweep's levels have.
    third = np.arange(n) * 3 // n
    decode = np.choose(third, [rng.integers(1, 4, size=n), rng.integers(4, 9, size=n),
                               rng.integers(10, 25, size=n)])
    pre = np.where(rng.random(n) < 0.2, rng.integers(100, 1024, size=n), 0) if prefill else (
        np.zeros(n, dtype=np.int64))
    el = ELAPSED["t0"] + ELAPSED["t_prefill_token"] * pre + ELAPSED["t_decode_seq"] * decode
    el = el * np.exp(rng.normal(0.0, noise, size=n)) if noise else el
    out = OUTSIDE["t0"] + OUTSIDE["t_decode_seq"] * decode
    start = 1_700_000_000.25 + np.concatenate([[0.0], np.cumsum(el + out)[:-1]])
    return pd.DataFrame({
        "t": np.floor(start), "line": np.arange(n) + 1, "engine": "0",
        "iteration": np.arange(n), "context_requests": (pre > 0).astype(int),
        "context_tokens": pre, "generation_requests": decode, "generation_tokens": decode,
        "elapsed_s": el, "kv_cache_usage": 0.5, "dummy": False, "resumed_tokens": 0,
        "num_prefill_tokens": pre, "num_decode_tokens": decode})


def test_coefficients_recovered_from_a_noiseless_trace():
    fit = fit_step_trace(_trace(), bootstrap=20)
    for p in ELAPSED:
        assert fit.elapsed[p] == pytest.approx(ELAPSED[p], rel=1e-6)
        # The time outside the elapsed one comes from whole seconds of the log only.
        assert fit.theta[p] == pytest.approx(ELAPSED[p] + OUTSIDE[p], rel=0.02, abs=2e-7)
    assert fit.theta["t_decode_ctx"] == 0.0 and "no context lengths" in fit.source[
        "t_decode_ctx"]


def test_noisy_trace_has_the_truth_inside_its_bootstrap_interval():
    fit = fit_step_trace(_trace(noise=0.05), bootstrap=100, seed=3)
    for p in ELAPSED:
        lo, hi = fit.interval[p]
        assert lo <= ELAPSED[p] + OUTSIDE[p] <= hi or fit.theta[p] == pytest.approx(
            ELAPSED[p] + OUTSIDE[p], rel=0.05)
        assert lo <= fit.theta[p] <= hi


def test_busy_seconds_leave_out_the_edges_and_add_to_one_second():
    steps = _trace(n=2000)
    busy = busy_seconds(steps)
    first, last = int(steps["t"].min()), int(steps["t"].max())
    assert first not in set(busy["second"]) and last not in set(busy["second"])
    # Inside a busy second the periods of its steps add up to about one second (a step that
    # straddles the boundary is counted where it starts).
    period = (busy["elapsed"] + OUTSIDE["t0"] * busy["n"]
              + OUTSIDE["t_decode_seq"] * busy["decode"])
    assert ((period > 0.9) & (period < 1.1)).all()


def test_a_trace_without_prefill_does_not_fit_the_prefill_cost():
    fit = fit_step_trace(_trace(prefill=False), bootstrap=0)
    assert fit.theta["t_prefill_token"] == 0.0
    assert fit.source["t_prefill_token"].startswith("default 0 (not identifiable")
    assert fit.theta["t_decode_seq"] == pytest.approx(
        ELAPSED["t_decode_seq"] + OUTSIDE["t_decode_seq"], rel=0.05)


def test_too_few_steps_are_refused():
    with pytest.raises(FitRefused, match="at least 30"):
        fit_step_trace(_trace(n=10), bootstrap=0)


def test_windows_keep_only_the_steps_of_the_levels():
    steps = _trace(n=4000)
    t0 = float(steps["t"].min())
    fit = fit_step_trace(steps, windows=[(t0 + 2, t0 + 6)], bootstrap=0)
    assert fit.steps == int(((steps["t"] >= t0 + 2) & (steps["t"] <= t0 + 6)).sum())
    assert fit.busy_seconds == 3  # seconds t0+3..t0+5: their neighbours are in the window


def test_a_twin_with_a_server_log_fits_its_step_time_on_the_steps(tmp_path):
    """A sweep simulated with known coefficients, its steps written as vLLM logs them (the
    elapsed time 80% of each step, the rest outside it): the twin built on the folder takes
    the step time from the log, and recovers the whole step's coefficients."""
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.synthetic import synthetic_workloads, write_synthetic_run
    from twin_helpers import SETTINGS, TRUE, TTFT_OFFSET, write_step_log

    folder = tmp_path / "run"
    loads = synthetic_workloads((2, 6, 12), input_len=(32, 400), output_len=(16, 96),
                                requests_per_level=96)
    runs = write_synthetic_run(folder, SETTINGS, loads, TRUE, ttft_offset=TTFT_OFFSET)
    windows, i = write_step_log(folder / "server.log", SETTINGS, loads, TRUE)
    runs["t_start"] = [a for a, _ in windows]
    runs["t_end"] = [b for _, b in windows]
    runs.to_csv(folder / "runs.csv", index=False)

    twin = build_twin(folder)
    assert twin.step_trace is not None and len(twin.step_trace) == i
    # The sweep's clients came back at the next step, all together: so reads the trace.
    assert set(twin.return_lag.return_steps.values()) == {0}
    assert not twin.return_lag.first_alone
    fit = twin.fit(bootstrap=50)
    for p in ("t0", "t_prefill_token", "t_decode_seq"):
        assert fit.source[p].startswith("step trace")
        assert fit.theta[p] == pytest.approx(TRUE[p], rel=0.05)
    assert fit.theta["ttft_offset"] == pytest.approx(TTFT_OFFSET, rel=0.1)
    report = twin.fit_report()
    assert report.table["output_throughput_error_pct"].abs().max() < 3.0


def test_a_named_server_log_that_does_not_exist_is_refused_naming_the_option(tmp_path):
    from kvpressure.errors import InputError
    from kvpressure.twin.step_trace import find_step_trace

    with pytest.raises(InputError, match=r"--server-log .*nope\.log: no such file"):
        find_step_trace(tmp_path, tmp_path / "nope.log")
    assert find_step_trace(tmp_path) is None  # no log in the folder: the level fit is used
