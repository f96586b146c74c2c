"""The recomputed-token estimate (FCFS victim rule, the docs/scheduler.md#rec-estimate range):
constructed series with a known answer, and vLLM's own metrics of the heavy reference run against
the scheduler's exact count."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import window_increase
from kvpressure.ingestion.engine_facts import EngineFacts
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
    r = recompute_range(df, engine=EngineFacts(num_gpu_blocks=101, block_size=16))
    assert r["high"] == 456 and r["params"]["num_gpu_blocks_from"] == "given"
    # no cache_config_info: prefix caching judged from the query counter (stayed 0 -> off)
    assert r["params"]["prefix_caching"] is False


def with_prompts(spread: bool = False) -> pd.DataFrame:
    """``series()`` plus 10 new requests of 100 prompt tokens on average; with ``spread``, half
    of them in the (0, 100] bucket and half in (100, 200]."""
    rows = [("r", 0.0, "vllm:prompt_tokens_total", "", 0.0),
            ("r", 3.0, "vllm:prompt_tokens_total", "", 1000.0),
            ("r", 0.0, "vllm:time_to_first_token_seconds_count", "", 0.0),
            ("r", 3.0, "vllm:time_to_first_token_seconds_count", "", 10.0)]
    if spread:
        for le, n in (("100.0", 5.0), ("200.0", 10.0), ("+Inf", 10.0)):
            rows += [("r", 0.0, "vllm:request_prompt_tokens_bucket", f"le={le}", 0.0),
                     ("r", 3.0, "vllm:request_prompt_tokens_bucket", f"le={le}", n)]
    df = series()
    return pd.concat([df, pd.DataFrame(rows, columns=df.columns)], ignore_index=True)


def test_fcfs_victim_is_a_new_prompt_and_the_rule_decides_the_range() -> None:
    df = with_prompts()
    full = recompute_range(df,
                           engine=EngineFacts(scheduling_policy="fcfs",
                                              scheduler_reserve_full_isl=True))
    # Victim = mean new prompt 1000 / 10 + B/2 = 108 tokens, 3 victims; no spread known. D4's
    # resident context is 152 > 108: a quarter of the victims may hold it (resumed victims).
    assert full["point"] == full["low"] == 3 * 108
    assert full["high"] == pytest.approx(3 * 108 + 0.25 * 3 * (152 - 108))
    assert math.isclose(full["ratio_point"], 324 / (1544 + 324))
    assert full["d4"]["high"] == 3 * 152 and full["victim_context_tokens"] == 108
    # Admission by first chunk, or the priority policy: D4's range and point.
    for kw in ({"scheduler_reserve_full_isl": False}, {"scheduling_policy": "priority"}):
        d4 = recompute_range(df, engine=EngineFacts(**kw))
        assert (d4["low"], d4["point"], d4["high"]) == (22.5, 456, 456)
    # Unknown rule or policy: the FCFS point inside both ranges.
    for kw in ({"scheduling_policy": "fcfs"}, {"scheduler_reserve_full_isl": True}, {}):
        u = recompute_range(df, engine=EngineFacts(**kw))
        assert (u["low"], u["point"], u["high"]) == (22.5, 324, 456)


def test_prompt_spread_widens_the_fcfs_range() -> None:
    r = recompute_range(with_prompts(spread=True),
                        engine=EngineFacts(scheduling_policy="fcfs",
                                           scheduler_reserve_full_isl=True))
    # Buckets (0,100] x5, (100,200] x5, uniform inside: var = 50^2 + 100^2/12 = 10000/3;
    # +- 2 sd * sqrt(3 victims) = +- 200 tokens around 324.
    assert r["point"] == 324
    assert r["low"] == pytest.approx(124) and r["high"] == pytest.approx(524)


def test_bad_engine_arguments_are_refused_naming_them() -> None:
    with pytest.raises(InputError, match="policy"):
        recompute_range(series(), engine=EngineFacts(scheduling_policy="lifo"))
    with pytest.raises(InputError, match="scheduler_reserve_full_isl"):
        ingest([HEAVY],
               engine=EngineFacts(scheduler_reserve_full_isl="yes"))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def heavy():
    return ingest([HEAVY])


def test_heavy_reference_truth_lies_in_the_range(heavy) -> None:
    est = heavy.report.runs["heavy_closed_c64_fcfs"]["recompute_estimate"]
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
    # D4's range is a sum over scrape intervals (the FCFS spread grows as sqrt(P) and does not
    # add): the priority policy uses it alone.
    whole = recompute_range(s, origin="zero", engine=EngineFacts(scheduling_policy="priority"))
    t = sorted(s["t"].unique())
    cut = t[len(t) // 2]
    first = recompute_range(s, None, cut, origin="zero",
                            engine=EngineFacts(scheduling_policy="priority"))
    second = recompute_range(s, cut, None, origin="zero",
                             engine=EngineFacts(scheduling_policy="priority"))
    assert first["preemptions"] + second["preemptions"] == whole["preemptions"]
    assert math.isclose(first["high"] + second["high"], whole["high"])


def test_ingest_narrows_the_runs_row_with_the_engine_arguments(heavy) -> None:
    told = ingest([HEAVY],
                  engine=EngineFacts(scheduling_policy="fcfs", scheduler_reserve_full_isl=True))
    row, wide = told.runs.iloc[0], heavy.runs.iloc[0]
    est = told.report.runs["heavy_closed_c64_fcfs"]["recompute_estimate"]
    # The log starts with the process: every prompt counts, 95 victims of mean prompt + B/2.
    s = told.series
    prompt = window_increase(s, "vllm:prompt_tokens_total", origin="zero")
    firsts = window_increase(s, "vllm:time_to_first_token_seconds_count", origin="zero")
    assert row["recomputed_tokens"] == pytest.approx(95 * (prompt / firsts + 8))
    assert (row["recomputed_tokens_low"], row["recompute_ratio"]) == (est["low"],
                                                                      est["ratio_point"])
    # The same point as with the rule unknown, inside a range narrower than it and than D4's.
    assert row["recompute_ratio"] == wide["recompute_ratio"]
    assert wide["recompute_ratio_low"] < row["recompute_ratio_low"]
    assert row["recompute_ratio_high"] < wide["recompute_ratio_high"] == est["d4"]["ratio_high"]
    true_ratio = HEAVY_RECOMPUTED / HEAVY_SCHEDULED
    assert row["recompute_ratio_low"] <= true_ratio <= row["recompute_ratio_high"]
    assert abs(row["recomputed_tokens"] - HEAVY_RECOMPUTED) / HEAVY_RECOMPUTED < 0.05


def test_cache_config_reads_the_labels_and_leaves_unset_fields_out() -> None:
    from kvpressure.ingestion.cache_config import cache_config

    labels = ("block_size=16,enable_prefix_caching=True,gpu_memory_utilization=0.9,"
              "num_gpu_blocks=None")
    s = pd.DataFrame([("r", 0.0, "vllm:cache_config_info", labels, 1.0)],
                     columns=["run", "t", "metric", "labels", "value"])
    assert cache_config(s) == {"block_size": 16, "enable_prefix_caching": True,
                               "gpu_memory_utilization": 0.9}
    assert cache_config(s.assign(metric="vllm:num_requests_running")) == {}
