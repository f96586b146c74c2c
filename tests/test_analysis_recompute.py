"""Recompute ratio: exact from steps, estimated range from counters, and the estimator check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis._series import counter_increase, histogram_quantile
from kvpressure.analysis.recompute import (
    EstimatorCase,
    recompute_from_series,
    recompute_from_steps,
    validate_recompute_estimator,
)
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.recompute_estimate import recompute_range

DATA = Path(__file__).parent / "data" / "analysis"


def steps_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "step": [0, 1, 2, 3],
        "num_scheduled_tokens": [100, 50, 200, 10],
        "recomputed_tokens": [0, 25, 100, 0],
        "preemptions": [0, 1, 0, 0],
        "resumed": [0, 0, 1, 0],
        "time_s": [0.0, 1.0, 1.5, 3.5],
        "step_duration_s": [1.0, 0.5, 2.0, 0.1],
    })


def test_exact_ratio_and_prorated_time():
    r = recompute_from_steps(steps_frame())
    assert r.recomputed_tokens == 125 and r.scheduled_tokens == 360
    assert r.recompute_ratio == pytest.approx(125 / 360)
    # 0.5 s * 25/50 + 2.0 s * 100/200 = 1.25 s of 3.6 s busy.
    assert r.recompute_time_s == pytest.approx(1.25)
    assert r.recompute_time_share == pytest.approx(1.25 / 3.6)
    assert r.preemptions == 1 and r.resumed == 1
    json.dumps(r.to_dict())


def test_exact_window_selects_steps_by_output_time():
    # Output stamps: 1.0, 1.5, 3.5, 3.6 -> (1.2, 3.5] holds steps 1 and 2.
    r = recompute_from_steps(steps_frame(), 1.2, 3.5)
    assert r.steps == 2 and r.recomputed_tokens == 125 and r.scheduled_tokens == 250
    untimed = steps_frame().drop(columns=["time_s", "step_duration_s"])
    r = recompute_from_steps(untimed, 2, 3)
    assert r.steps == 2 and r.recomputed_tokens == 100 and r.recompute_time_s is None


def test_counter_increase_handles_reset():
    s = pd.Series([10.0, 15.0, 3.0, 7.0], index=[0.0, 1.0, 2.0, 3.0])
    # +5, reset (3 counted from zero), +4.
    assert counter_increase(s) == 12.0
    assert counter_increase(s, (1.0, 3.0)) == 7.0
    assert counter_increase(pd.Series(dtype=float)) is None


def test_histogram_quantile_interpolates_inside_bucket():
    b = {0.01: 0.0, 0.02: 50.0, 0.04: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, b) == pytest.approx(0.02)
    assert histogram_quantile(0.75, b) == pytest.approx(0.03)


def constructed_series(prefix_caching: bool = False) -> pd.DataFrame:
    """Two scrapes: 4 preemptions, 10 new requests with 1000-token prompts, 5000 generated."""
    rows = []

    def add(t, metric, value, labels=""):
        rows.append(("r", t, metric, labels, value))

    for t, p, prompt, firsts, gen in [(0.0, 2, 5000, 5, 100), (10.0, 6, 15000, 15, 5100)]:
        add(t, "vllm:num_preemptions_total", p)
        add(t, "vllm:prompt_tokens_total", prompt)
        add(t, "vllm:time_to_first_token_seconds_count", firsts)
        add(t, "vllm:generation_tokens_total", gen)
        add(t, "vllm:kv_cache_usage_perc", 1.0)
        add(t, "vllm:num_requests_running", 10)
        pc = "True" if prefix_caching else "False"
        add(t, "vllm:cache_config_info", 1.0,
            f"block_size=16,enable_prefix_caching={pc},num_gpu_blocks=1001")
        add(t, "vllm:prefix_cache_queries_total", 20000 * t)
        add(t, "vllm:prefix_cache_hits_total", 5000 * t)
    return pd.DataFrame(rows, columns=["run", "t", "metric", "labels", "value"])


def test_estimate_fcfs_victim_is_a_prompt():
    e = recompute_from_series(constructed_series(), 0.0, 10.0, policy="fcfs",
                              scheduler_reserve_full_isl=True)
    assert e.available and e.preemptions == 4
    # Victim = mean new prompt 1000 + B/2 = 1008 tokens; no prompt spread known -> point range.
    assert e.recomputed_point == pytest.approx(4 * 1008)
    # D4's mean resident context: 1.0 * 1000 * 16 / 10 - 8 = 1592 > 1008, so the high end
    # allows a quarter of the victims that context.
    assert e.recomputed_high == pytest.approx(4 * 1008 + 0.25 * 4 * (1592 - 1008))
    base = 10000 + 5000
    assert e.recompute_ratio == pytest.approx(4032 / (base + 4032))
    assert e.inputs["d4"]["high"] == pytest.approx(4 * 1592)
    json.dumps(e.to_dict())


def test_estimate_with_prefix_caching_lowers_the_low_end():
    e = recompute_from_series(constructed_series(prefix_caching=True), 0.0, 10.0,
                              scheduler_reserve_full_isl=True)
    assert e.recomputed_low == pytest.approx(4 * 7.5)
    assert e.recomputed_point == pytest.approx(4 * 1008 * (1 - 0.25))


def test_estimate_admission_rule():
    off = recompute_from_series(constructed_series(), 0.0, 10.0, scheduler_reserve_full_isl=False)
    assert (off.recomputed_low, off.recomputed_high) == pytest.approx((4 * 7.5, 4 * 1592))
    unknown = recompute_from_series(constructed_series(), 0.0, 10.0)
    assert unknown.recomputed_point == pytest.approx(4 * 1008)
    assert (unknown.recomputed_low, unknown.recomputed_high) == pytest.approx((30, 4 * 1592))


def test_estimate_priority_policy_uses_d4():
    e = recompute_from_series(constructed_series(), 0.0, 10.0, policy="priority")
    assert e.recomputed_high == pytest.approx(4 * 1592)
    assert e.recomputed_low == pytest.approx(4 * 7.5)


def test_analysis_and_ingestion_share_one_estimator():
    """The runs table (ingestion) and the analysis give the same numbers for the same window."""
    s = constructed_series(prefix_caching=True)
    for rule in (True, False, None):
        a = recompute_from_series(s, 0.0, 10.0, scheduler_reserve_full_isl=rule)
        i = recompute_range(s, 0.0, 10.0, engine=EngineFacts(scheduler_reserve_full_isl=rule))
        assert (a.recomputed_low, a.recomputed_point, a.recomputed_high) == (
            i["low"], i["point"], i["high"])
        assert (a.ratio_low, a.recompute_ratio, a.ratio_high) == (
            i["ratio_low"], i["ratio_point"], i["ratio_high"])
        assert a.ratio_low <= a.recompute_ratio <= a.ratio_high


def test_missing_preemption_counter_is_no_data_not_zero():
    s = constructed_series()
    e = recompute_from_series(s[s["metric"] != "vllm:num_preemptions_total"])
    assert not e.available and e.preemptions is None and e.recompute_ratio is None


def test_reference_run_exact_matches_its_summary():
    """vLLM 0.33.0's own scheduler on the heavy closed-loop workload (reference files)."""
    steps = pd.read_csv(DATA / "heavy_c64.steps.csv.gz")
    r = recompute_from_steps(steps)
    assert (r.recomputed_tokens, r.scheduled_tokens, r.preemptions) == (127201, 601608, 95)


def test_estimator_covers_the_reference_run():
    """vLLM's own Prometheus output vs the exact recompute of the same run, window by window."""
    steps = pd.read_csv(DATA / "heavy_c64.steps.csv.gz")
    series = pd.read_csv(DATA / "heavy_c64.series.csv.gz")
    v = validate_recompute_estimator([EstimatorCase("heavy_c64", steps, series,
                                                   scheduler_reserve_full_isl=True)],
                                     windows_per_case=8)
    assert v.n_windows == 8
    assert v.coverage >= 0.85
    # The FCFS-victim range is narrower than D4's average-context range.
    assert v.median_rel_width < v.d4_median_rel_width
    assert v.median_abs_point_error < 0.2
    whole = recompute_from_series(series, scheduler_reserve_full_isl=True)
    assert whole.recomputed_low <= 127201 <= whole.recomputed_high
    assert whole.ratio_low <= 127201 / 601608 <= whole.ratio_high
    assert np.isfinite(v.to_dict()["coverage"])
