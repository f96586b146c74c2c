"""The recomputed-token range (spec D4): constructed series with a known answer, and vLLM's
own metrics of the heavy reference run against the scheduler's exact count."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.recompute_estimate import recompute_range

HEAVY = Path(__file__).parent / "data" / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"
# From vLLM 0.33.0's scheduler on the same run (summary.json of the reference run).
HEAVY_RECOMPUTED = 127_201
HEAVY_SCHEDULED = 601_608


def series(caching: bool = False, with_info: bool = True) -> pd.DataFrame:
    rows = []

    def add(metric: str, values: dict[float, float], labels: str = "") -> None:
        rows.extend((t, metric, labels, v) for t, v in values.items())

    if with_info:
        info = f"block_size=16,enable_prefix_caching={caching},num_gpu_blocks=101"
        add("vllm:cache_config_info", {0.0: 1.0}, info)
    add("vllm:num_preemptions_total", {0.0: 0, 1.0: 0, 2.0: 3, 3.0: 3})
    # The gauges of the scrape before the preemptions (t=1) are the ones used.
    add("vllm:kv_cache_usage_perc", {0.0: 0.5, 1.0: 1.0, 2.0: 0.2, 3.0: 0.2})
    add("vllm:num_requests_running", {0.0: 4, 1.0: 10, 2.0: 7, 3.0: 7})
    add("vllm:prompt_tokens_by_source_total", {0.0: 0, 3.0: 1000}, "source=local_compute")
    add("vllm:generation_tokens_total", {0.0: 0, 3.0: 544})
    add("vllm:prefix_cache_queries_total", {0.0: 0, 3.0: 1000 if caching else 0})
    add("vllm:prefix_cache_hits_total", {0.0: 0, 3.0: 250 if caching else 0})
    df = pd.DataFrame(rows, columns=["t", "metric", "labels", "value"])
    df.insert(0, "run", "r")
    return df


def test_hand_worked_range_without_prefix_caching() -> None:
    r = recompute_range(series())
    # Ctx = 1.0 * (101 - 1) * 16 / 10 - 16/2 = 152 tokens per victim, 3 victims.
    assert r["preemptions"] == 3
    assert r["high"] == 3 * 152
    assert r["low"] == 3 * 7.5  # (B - 1) / 2 per victim
    assert r["point"] == r["high"]  # nothing survives without prefix caching
    # processed = 1000 local-compute prompt tokens + 544 generated + the recompute
    assert math.isclose(r["ratio_high"], 456 / (1544 + 456))
    assert math.isclose(r["ratio_low"], 22.5 / (1544 + 22.5))
    assert r["params"]["num_gpu_blocks"] == 2 * 50 + 1 and r["params"]["block_size"] == 16
    assert any("no prefix hit" in a for a in r["assumptions"])


def test_hand_worked_point_with_prefix_caching() -> None:
    r = recompute_range(series(caching=True))
    # A quarter of looked-up tokens hit: 3 * 0.75 * 152
    assert math.isclose(r["point"], 342.0)
    assert r["low"] < r["point"] < r["high"]
    assert r["params"]["prefix_hit_rate"] == 0.25


def test_window_without_preemptions_is_zero_and_two_intervals_add() -> None:
    assert recompute_range(series(), 2.0, 3.0)["high"] == 0.0
    df = series()
    extra = pd.DataFrame(
        [
            ("r", 4.0, "vllm:num_preemptions_total", "", 5.0),
            ("r", 3.0, "vllm:kv_cache_usage_perc", "", 0.9),  # replaces nothing: t=3 exists
        ],
        columns=df.columns,
    )
    df = pd.concat([df[~((df.metric == "vllm:kv_cache_usage_perc") & (df.t == 3.0))], extra])
    df.loc[(df.metric == "vllm:num_requests_running") & (df.t == 3.0), "value"] = 6
    r = recompute_range(df)
    # second interval: 2 victims, Ctx = 0.9 * 1600 / 6 - 8 = 232
    assert r["preemptions"] == 5
    assert math.isclose(r["high"], 3 * 152 + 2 * 232)


def test_counter_reset_counts_preemptions_after_restart() -> None:
    df = series()
    df = pd.concat(
        [df, pd.DataFrame([("r", 4.0, "vllm:num_preemptions_total", "", 1.0)], columns=df.columns)]
    )
    assert recompute_range(df)["preemptions"] == 4


def test_unknown_pool_geometry_gives_no_estimate_unless_given() -> None:
    df = series(with_info=False)
    r = recompute_range(df)
    assert math.isnan(r["high"]) and r["preemptions"] == 3
    assert any("num_gpu_blocks and block_size unknown" in a for a in r["assumptions"])
    r = recompute_range(df, num_gpu_blocks=101, block_size=16)
    assert r["high"] == 456 and r["params"]["num_gpu_blocks_from"] == "given"
    # no cache_config_info: prefix caching judged from the query counter (stayed 0 -> off)
    assert r["params"]["prefix_caching"] is False


@pytest.fixture(scope="module")
def heavy():
    return ingest([HEAVY])


def test_heavy_reference_truth_lies_in_the_range(heavy) -> None:
    est = heavy.report["runs"]["heavy_closed_c64_fcfs"]["recompute_estimate"]
    assert est["preemptions"] == 95
    assert est["params"]["num_gpu_blocks"] == 2000 and est["params"]["block_size"] == 16
    assert est["params"]["prefix_caching"] is False
    assert est["low"] <= HEAVY_RECOMPUTED <= est["high"]
    true_ratio = HEAVY_RECOMPUTED / HEAVY_SCHEDULED
    assert est["ratio_low"] <= true_ratio <= est["ratio_high"]
    # The denominator (prompt + generated + recompute) is the scheduled total to within one
    # token per request (256 requests).
    assert abs(est["processed_tokens"] + HEAVY_RECOMPUTED - HEAVY_SCHEDULED) <= 256
    row = heavy.runs.iloc[0]
    assert row["recompute_ratio_low"] <= true_ratio <= row["recompute_ratio_high"]


def test_heavy_reference_by_windows_adds_up(heavy) -> None:
    s = heavy.series
    whole = recompute_range(s, origin="zero")
    t = sorted(s["t"].unique())
    cut = t[len(t) // 2]
    first = recompute_range(s, None, cut, origin="zero")
    second = recompute_range(s, cut, None, origin="zero")
    assert first["preemptions"] + second["preemptions"] == whole["preemptions"]
    assert math.isclose(first["high"] + second["high"], whole["high"])
