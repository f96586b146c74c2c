"""``vllm bench serve --save-result`` JSON -> ``runs`` rows (vLLM 0.33.0 field names)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest

DATA = Path(__file__).parent / "data" / "bench"
HEAVY = Path(__file__).parent / "data" / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"


def test_aggregate_result_converts_ms_to_seconds() -> None:
    result = ingest([DATA / "vllm033_c32.json"], run="sweep")
    assert result.series.empty and len(result.runs) == 1
    row = result.runs.iloc[0]
    assert row["run"] == "sweep" and row["variant"] == "default"
    assert row["concurrency"] == 32 and math.isinf(row["request_rate"])
    assert row["num_requests"] == 200 and row["duration_s"] == 50.0
    assert row["output_throughput"] == 1024.0 and row["total_token_throughput"] == 5120.0
    assert row["ttft_mean_s"] == 0.25 and row["itl_mean_s"] == 0.0285
    assert row["itl_p99_s"] == 0.06 and row["tpot_mean_s"] == 0.028
    # vLLM wrote only p99 and no e2el statistics: unknown, and the report says how to get them.
    assert math.isnan(row["ttft_p95_s"]) and math.isnan(row["e2e_mean_s"])
    assert any("ttft_p95_s" in w and "--save-detailed" in w for w in result.report.warnings)
    # A bench run carries no preemption data.
    assert math.isnan(row["preemptions"]) and math.isnan(row["recompute_ratio"])


def test_detailed_arrays_give_the_missing_statistics() -> None:
    row = ingest([DATA / "vllm033_detailed_c4.json"]).runs.iloc[0]
    assert row["variant"] == "fcfs" and row["concurrency"] == 4 and row["failed"] == 1
    # successful requests' TTFTs 0.1..0.5 (the failed one is left out): linear percentile
    assert math.isclose(row["ttft_p95_s"], 0.48)
    # all inter-token gaps of successful requests, 0.01..0.09: position 7.6 of 8
    assert math.isclose(row["itl_p95_s"], 0.086)
    assert row["e2e_mean_s"] == 3.0
    # what vLLM wrote wins over a recomputation
    assert row["ttft_mean_s"] == 0.3 and row["itl_p99_s"] == 0.0892


def test_appended_results_are_one_run_each() -> None:
    runs = ingest([DATA / "vllm033_append_c8_c16.json"], run="sweep").runs
    assert runs["concurrency"].tolist() == [8, 16]
    assert runs["output_throughput"].tolist() == [125.0, 200.0]
    assert runs["source"].str.endswith(("#1", "#2")).all()


def test_older_vllm_without_max_concurrency_is_read_with_a_note() -> None:
    result = ingest([DATA / "vllm_old_no_concurrency.json"])
    row = result.runs.iloc[0]
    assert math.isnan(row["concurrency"]) and row["request_rate"] == 4.0
    assert row["total_token_throughput"] == (1000 + 5000) / 100.0  # computed from totals
    assert any("max_concurrency" in w for w in result.report.warnings)


def test_other_tool_and_missing_fields_are_refused_by_name() -> None:
    with pytest.raises(InputError, match="neither a Prometheus scrape log"):
        ingest([DATA / "other_tool.json"])
    with pytest.raises(InputError, match=r"missing field\(s\) duration"):
        ingest([DATA / "missing_duration.json"])


def test_pytorch_benchmark_records_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "result.pytorch.json"
    path.write_text(json.dumps([{"benchmark": {"name": "vLLM benchmark"}}]), encoding="utf-8")
    with pytest.raises(InputError, match="pytorch"):
        ingest([path])


def test_sweep_folder_gives_one_row_per_point(tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    folder.mkdir()
    for name in ("vllm033_c32.json", "vllm033_append_c8_c16.json"):
        (folder / name).write_bytes((DATA / name).read_bytes())
    runs = ingest([folder], run="sweep").runs
    assert sorted(runs["concurrency"]) == [8, 16, 32]


def test_bench_with_scrape_log_of_the_same_run_gets_preemptions(tmp_path: Path) -> None:
    result = ingest([DATA / "vllm033_c32.json", HEAVY], run="c32")
    assert len(result.runs) == 1
    row = result.runs.iloc[0]
    assert row["concurrency"] == 32 and row["output_throughput"] == 1024.0
    assert row["preemptions"] == 95  # vLLM's count for the heavy run
    assert row["recompute_ratio_low"] <= row["recompute_ratio"] <= row["recompute_ratio_high"]
    assert "+" in row["source"]
