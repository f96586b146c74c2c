"""The real exports of AIPerf 0.13.0 and GuideLLM 0.8.1, written against the real vLLM 0.32.0 CPU
server the end-to-end tests serve (the seeded tiny Llama, 24 KV blocks of 32 tokens), cut small
(``tests/data/bench_tables/README.md``): each becomes runs rows with the tool's own figures,
AIPerf's recorded server metrics become the canonical series, and the knee is found.

Every expected figure is read from the tool's own file by this test, apart from the kit's
readers (the export JSON's ``avg`` in ms, GuideLLM's ``successful`` distributions), so a reader
that picks the wrong field, unit or level fails here.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.ingestion import aiperf
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.bench_tables import table_format
from kvpressure.ingestion.counters import window_increase
from kvpressure.ingestion.sources import detect

DATA = Path(__file__).parent / "data" / "bench_tables"
AIPERF = DATA / "aiperf_0.13"
GUIDELLM = DATA / "guidellm_0.8"
LEVELS = [1.0, 4.0, 16.0]


def _aiperf_export(c: int) -> dict:
    return json.loads((AIPERF / f"concurrency_{c}" / "profile_export_aiperf.json").read_text())


def _aiperf_summary(c: int) -> dict:
    return json.loads((AIPERF / f"concurrency_{c}" / "server_metrics_export.json").read_text())


def _knee(capsys, *argv: str) -> dict:
    assert main(["knee", *argv]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------- AIPerf 0.13
def test_aiperf_sweep_folder_gives_one_row_per_level_with_its_own_figures():
    res = ingest([AIPERF])
    runs = res.runs.sort_values("concurrency").reset_index(drop=True)
    assert runs["concurrency"].tolist() == LEVELS
    for k, c in enumerate((1, 4, 16)):
        export, row = _aiperf_export(c), runs.iloc[k]
        # The level is the profiling phase's (0.13 has no input_config.loadgen).
        (phase,) = [p for p in export["input_config"]["phases"] if p["kind"] == "profiling"]
        assert phase["concurrency"] == c and "loadgen" not in export["input_config"]
        assert row["output_throughput"] == export["output_token_throughput"]["avg"]
        assert row["request_throughput"] == export["request_throughput"]["avg"]
        assert export["time_to_first_token"]["unit"] == "ms"
        assert row["ttft_mean_s"] == pytest.approx(export["time_to_first_token"]["avg"] / 1e3)
        assert row["ttft_p95_s"] == pytest.approx(export["time_to_first_token"]["p95"] / 1e3)
        assert row["itl_p99_s"] == pytest.approx(export["inter_token_latency"]["p99"] / 1e3)
        assert row["e2e_mean_s"] == pytest.approx(export["request_latency"]["avg"] / 1e3)
        assert row["num_requests"] == export["request_count"]["avg"] == 12
        assert row["duration_s"] == export["benchmark_duration"]["avg"]
        assert row["model"] == "kvp-tiny"
        # The window is the profiling phase's span in unix time, from the server-metrics JSON.
        span = _aiperf_summary(c)["summary"]["phase_time_ranges"]["profiling"]
        notes: list[str] = []
        (read,) = aiperf.read(AIPERF / f"concurrency_{c}" / "profile_export_aiperf.json", "r",
                              notes)
        assert (read["window_start"], read["window_end"]) == (span["start_ns"] / 1e9,
                                                              span["end_ns"] / 1e9)
        assert notes == []
        # ... which the scrape times bound (the end snapped to the next scrape).
        assert row["t_start"] == read["window_start"]
        assert read["window_end"] <= row["t_end"] < read["window_end"] + 1.0
    # Only the exports and the server metrics are sources: the server-metrics CSV, the
    # per-request JSONL, inputs.json, the aggregate folders are not read as tables.
    kinds = sorted((Path(s.location).name, s.kind) for s in detect(AIPERF))
    assert kinds == sorted([("profile_export_aiperf.json", "bench")] * 3
                           + [("server_metrics_export.jsonl", "aiperf_metrics")] * 3)


def test_aiperf_server_metrics_become_canonical_series_that_agree_with_its_summary():
    res = ingest([AIPERF])
    series = res.series
    names = set(series["metric"])
    assert {"vllm:num_preemptions_total", "vllm:generation_tokens_total",
            "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
            "vllm:inter_token_latency_seconds_bucket", "vllm:cache_config_info"} <= names
    assert "vllm:num_preemptions" not in names  # counters take their _total
    info = series[series["metric"] == "vllm:cache_config_info"]["labels"].iloc[0]
    assert "num_gpu_blocks=24" in info and "block_size=32" in info
    runs = res.runs.sort_values("concurrency").reset_index(drop=True)
    for k, c in enumerate((1, 4, 16)):
        summary = _aiperf_summary(c)["metrics"]
        row = runs.iloc[k]
        for counter, column in (("vllm:num_preemptions", "preemptions"),
                                ("vllm:generation_tokens", None)):
            (one,) = summary[counter]["series"]
            cut = window_increase(series, f"{counter}_total", row["t_start"], row["t_end"])
            # AIPerf counts from its last scrape before the phase, the kit from the last
            # scrape at or before the window's start: the same scrape.
            assert cut == one["stats"]["total"], (c, counter)
            if column:
                assert row[column] == one["stats"]["total"]
    # Below the pool's three requests nothing is preempted; at 16 clients the pool is short.
    assert runs["preemptions"].tolist()[:2] == [0.0, 0.0] and runs["preemptions"].iloc[2] > 0


def test_aiperf_parquet_gives_the_same_increases_as_the_jsonl():
    parquet = ingest([DATA / "aiperf_0.13_parquet"])
    jsonl = ingest([AIPERF / "concurrency_16"])
    assert [Path(s.location).name for s in detect(DATA / "aiperf_0.13_parquet")] == [
        "profile_export_aiperf.json", "server_metrics_export.parquet"]
    a, b = parquet.runs.iloc[0], jsonl.runs.iloc[0]
    assert a["concurrency"] == b["concurrency"] == 16
    for name in ("vllm:num_preemptions_total", "vllm:generation_tokens_total",
                 "vllm:prompt_tokens_total"):
        assert window_increase(parquet.series, name, a["t_start"], a["t_end"]) == \
            window_increase(jsonl.series, name, b["t_start"], b["t_end"]), name
    assert any("Parquet holds counters as increases" in w for w in parquet.report.warnings)


def test_one_aiperf_level_folder_is_one_row_not_two():
    res = ingest([AIPERF / "concurrency_4"])
    assert len(res.runs) == 1 and res.runs.iloc[0]["concurrency"] == 4


def test_aiperf_csv_alone_takes_the_level_from_0_13s_folder_name(tmp_path):
    level = tmp_path / "concurrency_16"
    level.mkdir()
    (level / "profile_export_aiperf.csv").write_bytes(
        (AIPERF / "concurrency_16" / "profile_export_aiperf.csv").read_bytes())
    res = ingest([level / "profile_export_aiperf.csv"])
    row = res.runs.iloc[0]
    assert row["concurrency"] == 16
    assert row["output_throughput"] == pytest.approx(
        _aiperf_export(16)["output_token_throughput"]["avg"], rel=1e-4)
    assert any("concurrency 16 read from the artifact folder" in w
               for w in res.report.warnings)


def test_aiperf_sweep_knee(capsys):
    d = _knee(capsys, str(AIPERF))
    tput = {c: _aiperf_export(c)["output_token_throughput"]["avg"] for c in (1, 4, 16)}
    assert [p["x"] for p in d["points"]] == LEVELS
    assert [p["y"] for p in d["points"]] == [tput[1], tput[4], tput[16]]
    # From 1 to 4 clients throughput grows 4x; from 4 to 16 it gains a fraction of that.
    assert d["knee_x"] == 4.0 and d["peak_x"] == 16.0


# ---------------------------------------------------------------------- GuideLLM 0.8
def _guidellm_benchmarks() -> list[dict]:
    return json.loads((GUIDELLM / "benchmarks.json").read_text())["benchmarks"]


@pytest.mark.parametrize("name", ["benchmarks.json", "benchmarks.yaml", "benchmarks.csv"])
def test_guidellm_report_rows(name, capsys):
    path = GUIDELLM / name
    assert table_format(path) == "guidellm"
    runs = ingest([path]).runs.reset_index(drop=True)
    assert runs["concurrency"].tolist() == LEVELS
    for row, b in zip(runs.to_dict("records"), _guidellm_benchmarks(), strict=True):
        m = b["metrics"]
        assert b["config"]["strategy"]["streams"] == row["concurrency"]
        ok = {k: m[k]["successful"] for k in ("output_tokens_per_second",
                                              "time_to_first_token_ms",
                                              "inter_token_latency_ms", "request_latency")}
        assert row["output_throughput"] == pytest.approx(ok["output_tokens_per_second"]["mean"])
        assert row["ttft_mean_s"] == pytest.approx(ok["time_to_first_token_ms"]["mean"] / 1e3)
        assert row["ttft_p95_s"] == pytest.approx(
            ok["time_to_first_token_ms"]["percentiles"]["p95"] / 1e3)
        assert row["itl_mean_s"] == pytest.approx(ok["inter_token_latency_ms"]["mean"] / 1e3)
        assert row["e2e_mean_s"] == pytest.approx(ok["request_latency"]["mean"])
        assert row["num_requests"] == m["request_totals"]["successful"]
    d = _knee(capsys, str(path))
    assert [p["x"] for p in d["points"]] == LEVELS
    assert d["knee_x"] == 4.0


def test_a_guidellm_output_folder_reads_its_report_once():
    res = ingest([GUIDELLM])
    assert res.runs["concurrency"].tolist() == LEVELS
    assert {Path(str(x).split("#")[0]).name for x in res.runs["source"]} == {"benchmarks.json"}


def test_guidellm_0_8_json_carries_the_measured_span_and_its_version():
    from kvpressure.ingestion import guidellm
    from kvpressure.ingestion.provenance import load_tool

    notes: list[str] = []
    rows = guidellm.read(GUIDELLM / "benchmarks.json", "r", notes)
    for row, b in zip(rows, _guidellm_benchmarks(), strict=True):
        assert (row["window_start"], row["window_end"]) == (b["start_time"], b["end_time"])
    assert load_tool([], [str(GUIDELLM / "benchmarks.json")]) == "GuideLLM 0.8.1"
    assert load_tool([], [str(AIPERF / "concurrency_1" / "profile_export_aiperf.json")]) == \
        "AIPerf 0.13.0"


def test_guidellm_0_8_csv_names_the_level_in_its_strategy():
    with open(GUIDELLM / "benchmarks.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    col = list(zip(rows[0], rows[1], strict=False)).index(("Benchmark", "Strategy"))
    assert [r[col] for r in rows[3:]] == ["concurrent@1", "concurrent@4", "concurrent@16"]


# ---------------------------------------------------------------------- vllm bench serve 0.32
def test_vllm_0_32_save_detailed_result():
    path = DATA.parent / "bench" / "vllm_0.32_save_detailed" / "c4.json"
    result = json.loads(path.read_text())
    assert len(result["ttfts"]) == result["completed"] == 8  # --save-detailed's arrays
    row = ingest([path]).runs.iloc[0]
    assert row["concurrency"] == result["max_concurrency"] == 4
    assert row["output_throughput"] == result["output_throughput"]
    assert row["ttft_p99_s"] == pytest.approx(result["p99_ttft_ms"] / 1e3)
    assert row["num_requests"] == 8


def test_aiperf_phase_copies_of_a_warmed_up_run_are_not_levels(tmp_path):
    # With --warmup-request-count AIPerf 0.13 also writes each phase's export under
    # phases/profiling/ and phases/warmup/ beside the level's own.
    import shutil

    level = tmp_path / "concurrency_4"
    shutil.copytree(AIPERF / "concurrency_4", level)
    for phase in ("profiling", "warmup"):
        (level / "phases" / phase).mkdir(parents=True)
        shutil.copy(level / "profile_export_aiperf.json",
                    level / "phases" / phase / "profile_export_aiperf.json")
    assert len(ingest([tmp_path]).runs) == 1
    # A level folder holding only the phase copies reads its profiling phase.
    (level / "profile_export_aiperf.json").unlink()
    (level / "profile_export_aiperf.csv").unlink()
    runs = ingest([tmp_path]).runs
    assert len(runs) == 1 and "phases/profiling" in runs.iloc[0]["source"]


# ---------------------------------------------------------------------- vllm bench sweep 0.32
@pytest.mark.parametrize("part", ["", "summary.csv", "BENCH--max_concurrency=4"])
def test_vllm_0_32_sweep_results(part):
    root = DATA / "vllm_sweep_0.32"
    runs = ingest([root / part] if part else [root]).runs.sort_values("concurrency")
    expect = [1.0, 4.0] if part != "BENCH--max_concurrency=4" else [4.0]
    assert runs["concurrency"].tolist() == expect
    for row in runs.to_dict("records"):
        c = int(row["concurrency"])
        result = json.loads((root / f"BENCH--max_concurrency={c}" / "run=0.json").read_text())
        assert row["output_throughput"] == pytest.approx(result["output_throughput"])
        assert row["ttft_p99_s"] == pytest.approx(result["p99_ttft_ms"] / 1e3)
        assert row["num_requests"] == result["completed"] == 8
