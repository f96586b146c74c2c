"""Prometheus text, folders of dumps and JSONL scrape logs -> the ``series`` table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import gauge_mean, window_increase
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.labels import format_labels, parse_labels

DATA = Path(__file__).parent / "data" / "prom"
HEAVY = DATA / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"

# vLLM 0.33.0's own totals for the heavy reference run (its summary.json).
HEAVY_PREEMPTIONS = 95
HEAVY_PROMPT_TOKENS = 330_624
HEAVY_OUTPUT_TOKENS = 144_039
HEAVY_REQUESTS = 256


def _jsonl(path: Path, scrapes: list[tuple[float, str]]) -> Path:
    path.write_text(
        "".join(json.dumps({"t": t, "text": text}) + "\n" for t, text in scrapes),
        encoding="utf-8",
    )
    return path


def _gauge(name: str, value: float | str, labels: str = "") -> str:
    inner = f"{{{labels}}}" if labels else ""
    return f"# TYPE {name} gauge\n{name}{inner} {value}\n"


def _counter(name: str, value: float | str, labels: str = "") -> str:
    inner = f"{{{labels}}}" if labels else ""
    return f"# TYPE {name}_total counter\n{name}_total{inner} {value}\n"


@pytest.fixture(scope="module")
def heavy():
    return ingest([HEAVY])


def test_heavy_run_totals_match_vllm(heavy) -> None:
    s = heavy.series
    run = "heavy_closed_c64_fcfs"
    assert set(s["run"].unique()) == {run}
    # The last scrape holds vLLM's final counters; the log starts with the process.
    assert window_increase(s, "vllm:num_preemptions_total", origin="zero") == HEAVY_PREEMPTIONS
    assert window_increase(s, "vllm:prompt_tokens_total", origin="zero") == HEAVY_PROMPT_TOKENS
    gen = window_increase(s, "vllm:generation_tokens_total", origin="zero")
    assert gen == HEAVY_OUTPUT_TOKENS
    # docs/scheduler.md#met-iteration: iteration_tokens_total_sum = local-compute prompt tokens +
    # generated tokens.
    it_sum = window_increase(s, "vllm:iteration_tokens_total_sum", origin="zero")
    assert it_sum == HEAVY_PROMPT_TOKENS + HEAVY_OUTPUT_TOKENS
    row = heavy.runs.iloc[0]
    assert row["num_requests"] == HEAVY_REQUESTS
    assert row["preemptions"] == HEAVY_PREEMPTIONS
    assert heavy.report.runs[run]["counter_origin"]["origin"] == "zero"


def test_heavy_run_names_labels_and_generation(heavy) -> None:
    info = heavy.report.runs["heavy_closed_c64_fcfs"]
    assert info["generation"] == "v1"
    assert info["dropped_labels"] == {"model_name": "llama-reference", "engine": "0"}
    metrics = set(heavy.series["metric"].astype(str).unique())
    assert "vllm:num_preemptions_total" in metrics
    assert "vllm:time_to_first_token_seconds_bucket" in metrics
    assert not any(m.endswith("_created") for m in metrics)
    buckets = heavy.series[heavy.series["metric"] == "vllm:time_to_first_token_seconds_bucket"]
    les = {parse_labels(x)["le"] for x in buckets["labels"].astype(str).unique()}
    assert "+Inf" in les and "0.001" in les
    # 159 scrapes, one row per series per scrape: every series has one value per scrape.
    per_series = heavy.series.groupby(["metric", "labels"], observed=True).size()
    assert set(per_series) == {159}
    assert info["metrics_missing"] == []


def test_v0_names_are_mapped_and_generation_detected(tmp_path: Path) -> None:
    result = ingest([DATA / "v0_engine.prom"], run="old")
    info = result.report.runs["old"]
    assert info["generation"] == "v0"
    assert "vllm:num_requests_swapped" in info["generation_evidence"]
    assert info["mapped_names"]["vllm:gpu_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    s = result.series
    usage = s[s["metric"] == "vllm:kv_cache_usage_perc"]["value"].tolist()
    assert usage == [0.97]
    itl = s[s["metric"] == "vllm:inter_token_latency_seconds_count"]["value"].tolist()
    assert itl == [40.0]
    # V0-only names stay as they are.
    assert s[s["metric"] == "vllm:num_requests_swapped"]["value"].tolist() == [3.0]
    # HELP/TYPE without a sample: missing, never a zero row.
    assert "vllm:lora_requests_info" in info["declared_without_samples"]
    assert "vllm:lora_requests_info" in info["metrics_missing"]
    assert (s["metric"] == "vllm:lora_requests_info").sum() == 0


def test_family_without_samples_is_missing_not_zero(tmp_path: Path) -> None:
    text = (
        _gauge("vllm:num_requests_running", 3)
        + "# HELP vllm:num_preemptions_total Cumulative number of preemption.\n"
        + "# TYPE vllm:num_preemptions_total counter\n"
    )
    log = _jsonl(tmp_path / "m.jsonl", [(0.0, text), (1.0, text)])
    result = ingest([log], run="r")
    assert "vllm:num_preemptions_total" in result.report.runs["r"]["metrics_missing"]
    assert math.isnan(window_increase(result.series, "vllm:num_preemptions_total"))
    assert math.isnan(result.runs.iloc[0]["preemptions"])
    assert result.report.runs["r"]["recompute_estimate"]["assumptions"][0].startswith(
        "vllm:num_preemptions_total is missing"
    )


def test_escaped_names_two_engines_keep_engine_label() -> None:
    result = ingest([DATA / "two_engines_escaped.prom"], run="dp2")
    s = result.series
    info = result.report.runs["dp2"]
    assert info["mapped_names"]["vllm_num_requests_running"] == "vllm:num_requests_running"
    assert info["dropped_labels"] == {"model_name": "m"}
    assert info["target_labels_kept"] == {"engine": ["0", "1"]}
    running = s[s["metric"] == "vllm:num_requests_running"]
    assert sorted(running["labels"].astype(str)) == ["engine=0", "engine=1"]
    # Counters of both engines add up; KV usage (a fraction) is averaged.
    pre = s[s["metric"] == "vllm:num_preemptions_total"]
    assert sorted(pre["value"]) == [2.0, 3.0]
    assert gauge_mean(s, "vllm:num_requests_running") == 12.0
    assert gauge_mean(s, "vllm:kv_cache_usage_perc") == 0.75
    assert gauge_mean(s, "vllm:num_requests_running", labels="engine=1") == 7.0


def test_openmetrics_counter_without_total_suffix(tmp_path: Path) -> None:
    text = "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 4\n"
    path = tmp_path / "dump_1700000000.prom"
    path.write_text(text, encoding="utf-8")
    result = ingest([path], run="r")
    s = result.series
    assert s["metric"].astype(str).tolist() == ["vllm:num_preemptions_total"]
    assert s["t"].tolist() == [1_700_000_000.0]


def test_not_prometheus_text_names_file_and_first_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text(
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 3\n"
        "this line is prose, not a sample\n"
        "more prose\n",
        encoding="utf-8",
    )
    with pytest.raises(InputError) as err:
        ingest([path])
    message = str(err.value)
    assert str(path) in message and "line 3" in message and "prose" in message


def test_bad_line_inside_jsonl_scrape_names_line_of_log_and_of_text(tmp_path: Path) -> None:
    good = _gauge("vllm:num_requests_running", 1)
    bad = good + 'vllm:kv_cache_usage_perc{engine="0" 0.5\n'
    log = _jsonl(tmp_path / "m.jsonl", [(0.0, good), (1.0, bad)])
    with pytest.raises(InputError) as err:
        ingest([log])
    assert "JSONL line 2" in str(err.value) and "line 3" in str(err.value)


def test_truncated_text_keeps_complete_samples_and_reports_the_cut(tmp_path: Path) -> None:
    full = (
        _gauge("vllm:num_requests_running", 5)
        + _counter("vllm:num_preemptions", 12)
        + _gauge("vllm:kv_cache_usage_perc", 0.875)
    )
    cut = full[: full.rindex("0.875") + 2]  # "...perc 0." : the value is cut
    path = tmp_path / "dump_1700000000.prom"
    path.write_text(cut, encoding="utf-8")
    result = ingest([path], run="r")
    s = result.series
    assert sorted(s["metric"].astype(str)) == [
        "vllm:num_preemptions_total",
        "vllm:num_requests_running",
    ]
    warnings = " ".join(result.report.warnings)
    assert "cut" in warnings and "line 6" in warnings


def test_truncated_jsonl_and_gzip_keep_complete_scrapes(tmp_path: Path) -> None:
    scrapes = [(float(k), _counter("vllm:num_preemptions", k)) for k in range(5)]
    log = _jsonl(tmp_path / "m.jsonl", scrapes)
    raw = log.read_bytes()
    log.write_bytes(raw[: len(raw) - 20])  # the last line loses its end
    result = ingest([log], run="r")
    assert result.series["value"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert any("line 5" in w and "middle of a scrape" in w for w in result.report.warnings)

    # A download of the reference log that stopped at 60 %: the scrapes before the cut stay.
    gz = tmp_path / "cut.metrics.prom.jsonl.gz"
    data = HEAVY.read_bytes()
    gz.write_bytes(data[: len(data) * 6 // 10])
    cut = ingest([gz], run="g", options=IngestOptions(counter_origin="zero")).series
    full = ingest([HEAVY], run="g", options=IngestOptions(counter_origin="zero")).series
    n = cut["t"].nunique()
    assert 10 < n < full["t"].nunique()
    assert cut.reset_index(drop=True).equals(full.iloc[: len(cut)].reset_index(drop=True))
    assert len(cut) == n * full.groupby(["metric", "labels"], observed=True).ngroups
    assert any("compressed stream ends early" in w for w in ingest([gz]).report.warnings)


def test_unsorted_and_duplicate_timestamps(tmp_path: Path) -> None:
    scrapes = [
        (2.0, _gauge("vllm:num_requests_running", 20)),
        (1.0, _gauge("vllm:num_requests_running", 10)),
        (3.0, _gauge("vllm:num_requests_running", 30)),
        (3.0, _gauge("vllm:num_requests_running", 31)),  # the same instant read again
    ]
    result = ingest([_jsonl(tmp_path / "m.jsonl", scrapes)], run="r")
    s = result.series
    assert s["t"].tolist() == [1.0, 2.0, 3.0]
    assert s["value"].tolist() == [10.0, 20.0, 31.0]  # the last one read wins
    assert result.report.runs["r"]["duplicates_dropped"] == 1
    assert any("repeated a series" in w for w in result.report.warnings)
    # the first line out of order is named
    assert any("line 2: t 1.000 is earlier than line 1's 2.000" in w
               for w in result.report.warnings)


def test_nan_and_inf_values_are_kept_and_reported(tmp_path: Path) -> None:
    scrapes = [
        (0.0, _gauge("vllm:kv_cache_usage_perc", 0.5)),
        (1.0, _gauge("vllm:kv_cache_usage_perc", "NaN")),
        (2.0, _gauge("vllm:kv_cache_usage_perc", "+Inf")),
        (3.0, _gauge("vllm:kv_cache_usage_perc", 1.0)),
    ]
    result = ingest([_jsonl(tmp_path / "m.jsonl", scrapes)], run="r")
    values = result.series["value"].tolist()
    assert math.isnan(values[1]) and math.isinf(values[2])
    assert result.report.runs["r"]["nonfinite_values"] == {
        "vllm:kv_cache_usage_perc": {"nan": 1, "inf": 1}
    }
    # A NaN sample is skipped by the mean; the held values are 0.5 (2 s: 0..1 and through the
    # NaN's second), inf (1 s) and 1.0 -> only finite samples count when inf is dropped.
    finite = result.series[result.series["value"].map(math.isfinite)]
    assert gauge_mean(finite, "vllm:kv_cache_usage_perc", how="samples") == 0.75


def test_empty_folder_and_empty_file_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "scrapes"
    empty.mkdir()
    with pytest.raises(InputError, match="empty folder"):
        ingest([empty])
    blank = tmp_path / "blank.prom"
    blank.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="empty file"):
        ingest([blank])


def test_folder_of_timestamped_dumps_is_one_run_in_time_order(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "metrics-2024-05-01T12:00:10Z.prom").write_text(
        _counter("vllm:num_preemptions", 7), encoding="utf-8"
    )
    (folder / "metrics-2024-05-01T12:00:00Z.prom").write_text(
        _counter("vllm:num_preemptions", 3), encoding="utf-8"
    )
    result = ingest([folder])
    s = result.series
    assert set(s["run"].unique()) == {"dumps"}
    t0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
    assert s["t"].tolist() == [t0, t0 + 10]
    assert window_increase(s, "vllm:num_preemptions_total") == 4.0


def test_several_models_keep_model_name(tmp_path: Path) -> None:
    text = _gauge("vllm:num_requests_running", 2, 'model_name="a"').replace(
        "\n", '\nvllm:num_requests_running{model_name="b"} 9\n', 1
    )
    result = ingest([_jsonl(tmp_path / "m.jsonl", [(0.0, text)])], run="r")
    labels = sorted(result.series["labels"].astype(str))
    assert labels == ["model_name=a", "model_name=b"]


def test_metrics_filter_keeps_only_asked_families(tmp_path: Path) -> None:
    text = _gauge("vllm:num_requests_running", 2) + _gauge("vllm:engine_sleep_state", 1)
    result = ingest([_jsonl(tmp_path / "m.jsonl", [(0.0, text)])], run="r",
                    options=IngestOptions(metrics="core"))
    assert result.series["metric"].astype(str).tolist() == ["vllm:num_requests_running"]
    assert result.report.runs["r"]["filtered_out_families"] == ["vllm:engine_sleep_state"]


def test_label_strings_round_trip_with_separators() -> None:
    labels = {"z": "1", "a": "x,y=z\\w", "le": "1"}
    text = format_labels(labels)
    assert text == "a=x\\,y\\=z\\\\w,le=1.0,z=1"
    assert parse_labels(text) == {"z": "1", "a": "x,y=z\\w", "le": "1.0"}


def test_same_input_gives_byte_identical_files(tmp_path: Path) -> None:
    for name in ("a", "b"):
        ingest([HEAVY]).write(tmp_path / name)
    for f in ("series.csv", "runs.csv", "ingest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
