"""The twin's engine settings and workload, read from what a run folder measured."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvpressure.errors import InputError
from kvpressure.twin.api import build_twin
from kvpressure.twin.fit_report import growth_stops, verdict

RUNS = pd.DataFrame({
    "run": ["c4", "c8", "c16"], "variant": ["default"] * 3, "concurrency": [4, 8, 16],
    "num_requests": [32, 32, 64], "duration_s": [10.0, 8.0, 16.0],
    "output_throughput": [320.0, 400.0, 400.0], "total_token_throughput": [960.0, 1200.0, 1200.0],
    "ttft_mean_s": [0.1, 0.3, 1.0], "itl_mean_s": [0.01, 0.02, 0.04],
})


def _folder(tmp_path, series_rows=None, files=None):
    d = tmp_path / "run"
    d.mkdir()
    RUNS.to_csv(d / "runs.csv", index=False)
    if series_rows is not None:
        pd.DataFrame(series_rows, columns=["run", "t", "metric", "labels", "value"]).to_csv(
            d / "series.csv", index=False)
    for name, text in (files or {}).items():
        (d / name).write_text(text)
    return d


def test_pool_and_block_size_come_from_cache_config_info(tmp_path):
    labels = ("block_size=32,cache_dtype=auto,enable_prefix_caching=False,"
              "gpu_memory_utilization=0.9,num_cpu_blocks=None,num_gpu_blocks=123")
    d = _folder(tmp_path, [["x", 1.0, "vllm:cache_config_info", labels, 1.0]])
    twin = build_twin(d)
    assert twin.settings["num_gpu_blocks"] == 123
    assert twin.settings["block_size"] == 32
    assert twin.settings["enable_prefix_caching"] is False
    for key in ("num_gpu_blocks", "block_size", "enable_prefix_caching"):
        assert "vllm:cache_config_info" in twin.settings_source[key]
    # What the metrics do not carry is a vLLM default, and said to be assumed.
    assert "assumed" in twin.settings_source["max_num_seqs"]
    assert any(a.startswith("max_num_seqs = ") for a in twin.assumptions())
    # vLLM refuses a max_model_len the pool cannot hold: unknown, it is the pool.
    assert twin.settings["max_model_len"] == 123 * 32


def test_the_workload_is_the_levels_mean_lengths_without_per_request_data(tmp_path):
    d = _folder(tmp_path, [["x", 1.0, "vllm:cache_config_info", "block_size=16,"
                                                                 "num_gpu_blocks=64", 1.0]])
    twin = build_twin(d)
    w = twin.workloads[4]
    # 320 tok/s x 10 s / 32 requests = 100 output tokens; (960 - 320) x 10 / 32 = 200 prompt.
    assert (w.num_requests, set(w.output_lens), set(w.prompt_lens)) == (32, {100}, {200})
    assert not w.exact
    assert any("mean prompt and output length" in a for a in twin.assumptions())


def test_settings_file_and_overrides_take_precedence(tmp_path):
    d = _folder(tmp_path, [["x", 1.0, "vllm:cache_config_info", "block_size=16,"
                                                                 "num_gpu_blocks=64", 1.0]],
                {"engine.json": json.dumps({"engine_args": {"max_num_seqs": 12,
                                                            "num_gpu_blocks_override": 50}})})
    twin = build_twin(d, overrides={"max_num_batched_tokens": "512"})
    assert twin.settings["max_num_seqs"] == 12
    assert twin.settings["num_gpu_blocks"] == 50  # the file beats the metric
    assert twin.settings["max_num_batched_tokens"] == 512
    assert twin.settings_source["max_num_batched_tokens"] == "given (--set)"
    assert twin.settings_source["max_num_seqs"].endswith("engine.json")


def test_pool_from_a_server_log(tmp_path):
    log = ("INFO 12-01 14:00:00 [cpu_worker.py:88] block_size=32\n"
           "INFO 12-01 14:00:01 [kv_cache_utils.py:1] CPU KV cache size: 4,096 tokens\n")
    d = _folder(tmp_path, None, {"server.log": log})
    twin = build_twin(d)
    assert twin.settings["num_gpu_blocks"] == 128
    assert "server.log" in twin.settings_source["num_gpu_blocks"]


def test_no_pool_size_is_refused_naming_the_option(tmp_path):
    d = _folder(tmp_path)
    with pytest.raises(InputError, match="--set num_gpu_blocks=N"):
        build_twin(d)


def test_async_scheduling_is_refused(tmp_path):
    d = _folder(tmp_path, None, {"engine.json": json.dumps({"num_gpu_blocks": 10,
                                                            "async_scheduling": True})})
    with pytest.raises(InputError, match="async_scheduling"):
        build_twin(d)


def test_verdict_on_a_hand_worked_table():
    levels = [1, 2, 4, 8, 16]
    measured = [100.0, 180.0, 300.0, 310.0, 305.0]
    # growth stops at the first level within 5% of the peak (310 -> 294.5): concurrency 4
    assert growth_stops(levels, measured) == 4
    twin = [104.0, 175.0, 250.0, 300.0, 300.0]  # -16.7% at 4; stops at 8: one level apart
    table = pd.DataFrame({
        "concurrency": levels,
        "output_throughput_measured": measured, "output_throughput_twin": twin,
        "output_throughput_error_pct": [100 * (t - m) / m for t, m in zip(twin, measured,
                                                                          strict=True)],
        "preemptions_measured": [0.0, 0.0, 10.0, 100.0, 200.0],
        "preemptions_twin": [1.0, 2.0, 12.0, 109.0, 230.0],  # misses only at 16 (30 > 20)
        "ttft_p95_s_error_pct": [0.0] * 5, "itl_p95_s_error_pct": [-30.0] + [0.0] * 4,
    })
    v = verdict(table)
    assert not v.fits
    # the record's knee of each curve (analysis.knee): both at 4
    assert v.knee["measured"] == 4 and v.knee["twin"] == 4 and v.knee["ok"]
    assert [m["concurrency"] for m in v.throughput_misses] == [4]
    assert [m["concurrency"] for m in v.preemption_misses] == [16]
    assert v.text == ("does not fit: throughput at c=4 (-17%); preemptions at c=16 (200 measured,"
                      " 230 twin); latency caveat: ITL P95 off by up to 30%")
    table["output_throughput_twin"] = [102.0, 181.0, 295.0, 305.0, 300.0]
    table["output_throughput_error_pct"] = [2.0, 0.6, -1.7, -1.6, -1.6]
    table["preemptions_twin"] = [1.0, 2.0, 12.0, 109.0, 215.0]
    v = verdict(table)
    assert v.fits and v.text.startswith("twin fits within 2% (output throughput, every level)")
    # A twin still rising where the measured curve has its knee misses it by more than a level.
    table["output_throughput_twin"] = [100.0, 200.0, 400.0, 800.0, 1600.0]
    v = verdict(table)
    assert v.knee["measured"] == 4 and v.knee["twin"] is None and not v.knee["ok"]
    assert "knee at c=4 measured, none (still rising) twin" in v.text


def test_engine_arguments_a_bench_result_records_are_used_and_the_rest_named(tmp_path):
    from kvpressure.twin.settings import assumed_settings, twin_settings

    settings, source = twin_settings(
        tmp_path, pd.DataFrame({"concurrency": [1]}), None, {}, {"num_gpu_blocks": "64"}, [],
        bench={"max_num_seqs": "8", "scheduler_reserve_full_isl": "false", "seed": "0"})
    assert settings["max_num_seqs"] == 8 and settings["scheduler_reserve_full_isl"] is False
    assert source["max_num_seqs"] == "the bench result (--metadata)"
    assert source["num_gpu_blocks"] == "given (--set)"
    # what neither gives is vLLM's default, and named as assumed
    assert "max_num_batched_tokens" in assumed_settings(source)
    assert "max_num_seqs" not in assumed_settings(source)
