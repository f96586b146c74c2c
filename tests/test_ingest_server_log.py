"""vLLM server logs -> the canonical series, checked against numbers worked out by hand.

The logs in ``tests/data/logs/`` are written line for line in the formats vLLM prints
(``vllm/v1/metrics/loggers.py``, ``vllm/engine/metrics.py``, ``vllm/core/scheduler.py``,
``vllm/v1/core/kv_cache_utils.py``, ``vllm/logger.py``): a V1 0.33 server bound by its KV
blocks, a V1 server bound by prefill with an idle pause, a V0 server that preempts, and the
first V1 releases' lines (no engine prefix, the older line prefix).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpressure.analysis.status import KV_BOUND
from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.labels import parse_labels
from kvpressure.ingestion.sources import detect
from kvpressure.paths import REPO_ROOT

LOGS = REPO_ROOT / "tests" / "data" / "logs"
KV_BOUND_LOG = LOGS / "v1_kv_bound.log"
PREFILL_LOG = LOGS / "v1_prefill_bound.log"
V0_LOG = LOGS / "v0_preemptions.log"
EARLY_LOG = LOGS / "v1_early.log"
UTC = dt.UTC


def _read(path: Path, **kw):
    kw.setdefault("log_year", 2026)
    kw.setdefault("log_timezone", "UTC")
    return ingest([path], run="r", options=IngestOptions(**kw))


def _series(result, metric: str) -> pd.Series:
    s = result.series
    rows = s[s["metric"].astype(str) == metric]
    return pd.Series(rows["value"].to_numpy(), index=rows["t"].to_numpy())


def _at(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()


def _log_info(result) -> dict:
    return result.report.runs["r"]["server_log"]


# ------------------------------------------------------------------ V1, bound by KV blocks
def test_v1_gauges_are_the_logged_values_at_the_logged_times():
    res = _read(KV_BOUND_LOG)
    running = _series(res, "vllm:num_requests_running")
    assert running.tolist() == [18, 21, 22, 20, 23, 22, 21, 24, 22, 21, 23, 22]
    assert _series(res, "vllm:num_requests_waiting").tolist() == [
        30, 38, 41, 40, 39, 42, 40, 37, 41, 40, 38, 39]
    usage = _series(res, "vllm:kv_cache_usage_perc")
    assert usage.iloc[0] == pytest.approx(0.912) and usage.max() == pytest.approx(1.0)
    # "(APIServer pid=4242) INFO 12-01 14:21:10 [loggers.py:259] Engine 000: ..."
    assert running.index[0] == _at(2026, 12, 1, 14, 21, 10)
    assert running.index[-1] == _at(2026, 12, 1, 14, 23, 1)


def test_v1_token_counters_integrate_the_logged_throughput_over_each_interval():
    res = _read(KV_BOUND_LOG)
    prompt = _series(res, "vllm:prompt_tokens_total")
    gen = _series(res, "vllm:generation_tokens_total")
    # Lines 10 s apart except one 11 s step (14:21:20 -> 14:21:31); the first line covers one
    # median interval (10 s) before it: 500*10 + 1000*10 + 1000*11 + 9 * 1000*10.
    assert prompt.iloc[-1] == pytest.approx(116_000)
    assert gen.iloc[-1] == pytest.approx(100 * 10 + 250 * 10 + 250 * 11 + 9 * 250 * 10)
    # sampled at the stats lines only, like the gauges: the first line holds its own interval
    assert prompt.index.tolist() == _series(res, "vllm:num_requests_running").index.tolist()
    assert prompt.iloc[0] == 500 * 10
    # increases count from the first sample, as from a scrape log's first scrape
    assert res.runs.iloc[0]["output_throughput"] == pytest.approx(
        (gen.iloc[-1] - 100 * 10) / (_at(2026, 12, 1, 14, 23, 1) - _at(2026, 12, 1, 14, 21, 10)))
    # the rate over any interval gives back the throughput the log printed for it
    t0, t1 = _at(2026, 12, 1, 14, 21, 20), _at(2026, 12, 1, 14, 21, 31)
    assert (prompt[t1] - prompt[t0]) / (t1 - t0) == pytest.approx(1000.0)
    assert np.all(np.diff(prompt.to_numpy()) >= 0)
    notes = " ".join(_log_info(res)["notes"])
    assert "approximations" in notes


def test_v1_log_gives_the_pool_and_the_engine_arguments_it_shows():
    res = _read(KV_BOUND_LOG)
    args = _log_info(res)["engine_args"]
    assert args["max_num_seqs"] == 64  # non-default args
    assert args["max_num_batched_tokens"] == 2048  # "Chunked prefill is enabled with ..."
    assert args["max_model_len"] == 8192  # "Maximum concurrency for 8,192 tokens per request"
    assert args["kv_cache_size_tokens"] == 16_384  # "GPU KV cache size: 16,384 tokens"
    assert args["num_gpu_blocks"] == 16_384 // 16  # the pool in blocks of block_size 16
    assert args["enable_prefix_caching"] is False
    info = res.series[res.series["metric"].astype(str) == "vllm:cache_config_info"]
    labels = parse_labels(str(info["labels"].iloc[0]))
    assert labels["num_gpu_blocks"] == "1024" and labels["block_size"] == "16"
    # one info sample per stats line, as a scrape would give: a window cut anywhere keeps it
    assert len(info) == 12
    assert _log_info(res)["version"] == "0.33.0"
    assert res.report.runs["r"]["dropped_labels"]["model_name"] == "/models/llama-8b"


def test_v1_preemptions_are_missing_not_zero():
    res = _read(KV_BOUND_LOG)
    assert _series(res, "vllm:num_preemptions_total").empty
    run = res.report.runs["r"]
    assert "vllm:num_preemptions_total" in run["metrics_missing"]
    assert "does not print preemptions" in run["server_log"]["missing"][
        "vllm:num_preemptions_total"]
    assert np.isnan(res.runs.iloc[0]["preemptions"])
    assert any("not zero" in w for w in res.report.warnings)


def test_v1_preemptions_printed_per_interval_are_added_up(tmp_path):
    """A build that prints 'Preemptions: N' (vLLM prints it only when N > 0)."""
    lines = [
        "(APIServer pid=1) INFO 12-01 10:00:00 [loggers.py:259] Engine 000: Avg prompt "
        "throughput: 100.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 4 reqs, "
        "Waiting: 1 reqs, Preemptions: 3, GPU KV cache usage: 99.0%",
        "(APIServer pid=1) INFO 12-01 10:00:10 [loggers.py:259] Engine 000: Avg prompt "
        "throughput: 100.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 4 reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 90.0%",
        "(APIServer pid=1) INFO 12-01 10:00:20 [loggers.py:259] Engine 000: Avg prompt "
        "throughput: 100.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 4 reqs, "
        "Waiting: 2 reqs, Deferred: 1 reqs, Preemptions: 5, GPU KV cache usage: 100.0%",
    ]
    path = tmp_path / "p.log"
    path.write_text("\n".join(lines) + "\n")
    res = _read(path)
    assert _series(res, "vllm:num_preemptions_total").tolist() == [3, 3, 8]
    assert _series(res, "vllm:num_requests_waiting").tolist() == [1, 0, 2]


# ------------------------------------------------------------------ V1, bound by prefill
def test_v1_idle_silence_is_filled_as_idle_and_counts_nothing():
    res = _read(PREFILL_LOG)
    running = _series(res, "vllm:num_requests_running")
    # the line at 09:01:40 logged 0 tokens/s; V1 then stays silent until load returns at
    # 09:02:40, whose line covers 09:02:30-09:02:40: idle samples at 09:01:50 ... 09:02:30
    idle = [_at(2026, 12, 2, 9, 1, 50) + 10 * k for k in range(5)]
    assert running.loc[idle].tolist() == [0] * 5
    assert _series(res, "vllm:kv_cache_usage_perc").loc[idle].tolist() == [0] * 5
    prompt = _series(res, "vllm:prompt_tokens_total")
    assert prompt[_at(2026, 12, 2, 9, 2, 30)] == prompt[_at(2026, 12, 2, 9, 1, 40)]
    assert prompt.iloc[-1] == pytest.approx(
        (8000 + 9500 + 9100 + 9800 + 0 + 7000 + 9900 + 9600) * 10)
    assert _log_info(res)["idle_intervals_filled"] == 5
    args = _log_info(res)["engine_args"]
    assert args["num_gpu_blocks"] == 480_000 // 16 and args["enable_prefix_caching"] is True


def test_a_silence_after_a_busy_line_is_reported_not_filled(tmp_path):
    lines = PREFILL_LOG.read_text().splitlines()
    busy = [ln for ln in lines if "Avg prompt throughput: 0.0" not in ln]
    path = tmp_path / "stall.log"
    path.write_text("\n".join(busy) + "\n")
    res = _read(path)
    assert _log_info(res)["idle_intervals_filled"] == 0
    assert any("no stats line for 70 s" in w for w in res.report.warnings)


# ------------------------------------------------------------------ V0, with preemption warnings
def test_v0_cumulative_preemptions_from_the_warnings():
    res = _read(V0_LOG)
    pre = _series(res, "vllm:num_preemptions_total")
    # at each stats line (22:01:00, :05 ... :25) the total of the last warning before it
    # (warnings at :06, :12, :19, :24 print 1, 51, 101, 151); 0 before the first one, the log
    # starting with the engine ("# GPU blocks" at 22:00:30)
    assert list(pre.items()) == [(_at(2026, 11, 30, 22, 1, 5 * k), v) for k, v in
                                 enumerate([0.0, 0.0, 1.0, 51.0, 101.0, 151.0])]
    assert res.runs.iloc[0]["preemptions"] == 151
    run = res.report.runs["r"]
    assert run["generation"] == "v0"
    assert run["server_log"]["preemption_modes"] == ["RECOMPUTE"]
    assert "up to 49 behind" in " ".join(run["server_log"]["notes"])


def test_v0_stats_lines_give_the_v0_gauges():
    res = _read(V0_LOG)
    assert _series(res, "vllm:num_requests_waiting").tolist() == [20, 55, 60, 62, 58, 61]
    assert _series(res, "vllm:num_requests_swapped").tolist() == [0] * 6
    assert _series(res, "vllm:kv_cache_usage_perc").tolist() == pytest.approx(
        [0.85, 0.991, 0.998, 0.995, 1.0, 0.999])
    assert res.report.runs["r"]["mapped_names"] == {
        "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc"}
    # V0 averages over the time since its previous line: 5 s steps, the first one 5 s too
    prompt = _series(res, "vllm:prompt_tokens_total")
    assert prompt.iloc[-1] == pytest.approx((3000 + 2500 + 2200 + 2300 + 2100 + 2400) * 5)
    args = _log_info(res)["engine_args"]
    assert (args["num_gpu_blocks"], args["num_cpu_blocks"], args["max_num_seqs"]) == (
        2000, 512, 256)
    assert args["block_size"] == 16 and args["gpu_memory_utilization"] == 0.9


def test_v0_without_warnings_is_zero_only_when_the_log_starts_with_the_engine(tmp_path):
    lines = [ln for ln in V0_LOG.read_text().splitlines() if "preempted" not in ln]
    whole = tmp_path / "whole.log"
    whole.write_text("\n".join(lines) + "\n")
    assert set(_series(_read(whole), "vllm:num_preemptions_total")) == {0.0}
    tail = tmp_path / "tail.log"
    tail.write_text("\n".join(ln for ln in lines if "metrics.py" in ln) + "\n")
    res = _read(tail)
    assert _series(res, "vllm:num_preemptions_total").empty
    assert "vllm:num_preemptions_total" in res.report.runs["r"]["metrics_missing"]


# ------------------------------------------------------------------ other shapes
def test_first_v1_releases_lines_without_engine_prefix():
    res = _read(EARLY_LOG)
    info = _log_info(res)
    assert info["format"] == "v1-early"
    # logged from the engine loop: a line covers the time since the previous one (5 s, 12 s);
    # the first one the median step (8.5 s)
    prompt = _series(res, "vllm:prompt_tokens_total")
    assert prompt.iloc[-1] == pytest.approx(400 * 8.5 + 600 * 5 + 300 * 12)
    assert info["engine_args"]["num_gpu_blocks"] == 5000  # "# GPU blocks: 5000"
    assert "engine argument max_num_seqs" in info["missing"]
    assert "engine=" not in "".join(res.series["labels"].astype(str))


def test_gzip_log_reads_as_the_plain_one(tmp_path):
    packed = tmp_path / "server.log.gz"
    packed.write_bytes(gzip.compress(KV_BOUND_LOG.read_bytes()))
    assert detect(packed)[0].kind == "server_log"
    a = _read(KV_BOUND_LOG).series
    b = _read(packed).series
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def _rollover_log(path: Path) -> Path:
    stamps = ["12-31 23:59:40", "12-31 23:59:50", "01-01 00:00:00", "01-01 00:00:10"]
    path.write_text("".join(
        f"(APIServer pid=9) INFO {s} [loggers.py:259] Engine 000: Avg prompt throughput: "
        "10.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 "
        "reqs, GPU KV cache usage: 1.0%\n" for s in stamps))
    return path


def test_year_rollover_december_to_january(tmp_path):
    res = _read(_rollover_log(tmp_path / "nye.log"), log_year=2025)
    t = _series(res, "vllm:num_requests_running").index
    assert t.tolist() == [_at(2025, 12, 31, 23, 59, 40) + 10 * k for k in range(4)]
    assert _log_info(res)["year"]["rollovers"] == 1


def test_year_from_the_file_time_when_not_given(tmp_path):
    path = _rollover_log(tmp_path / "nye.log")
    written = _at(2026, 1, 1, 0, 5, 0)
    os.utime(path, (written, written))
    res = ingest([path], run="r", options=IngestOptions(log_timezone="UTC"))
    assert _series(res, "vllm:num_requests_running").index[0] == _at(2025, 12, 31, 23, 59, 40)
    assert any("no year" in w and "--log-year" in w for w in res.report.warnings)


def test_iso_prefix_colours_and_data_parallel_engines(tmp_path):
    line = ("{iso} \x1b[0;36m(APIServer pid=1)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m01-01 "
            "00:00:00\x1b[0m \x1b[90m[loggers.py:259]\x1b[0m Engine 00{e}: Avg prompt "
            "throughput: 5.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: {r} "
            "reqs, Waiting: 0 reqs, GPU KV cache usage: 50.0%\n")
    path = tmp_path / "docker.log"
    path.write_text(line.format(iso="2026-12-01T14:25:31.250000000Z", e=0, r=3)
                    + line.format(iso="2026-12-01T14:25:31.500000000Z", e=1, r=5))
    res = _read(path, log_year=1999)  # the collector's ISO time wins over the year-less date
    s = res.series[res.series["metric"].astype(str) == "vllm:num_requests_running"]
    got = {parse_labels(str(lab))["engine"]: (t, v)
           for lab, t, v in zip(s["labels"], s["t"], s["value"], strict=True)}
    base = _at(2026, 12, 1, 14, 25, 31)
    assert got == {"0": (base + 0.25, 3.0), "1": (base + 0.5, 5.0)}


def test_aggregated_data_parallel_lines_win_over_per_engine_ones(tmp_path):
    line = ("(APIServer pid=1) INFO 12-01 10:00:{s} [loggers.py:259] {who}: Avg prompt "
            "throughput: 10.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: {r} "
            "reqs, Waiting: 0 reqs, GPU KV cache usage: 50.0%\n")
    path = tmp_path / "dp.log"
    path.write_text(line.format(s="00", who="Engine 000", r=2)
                    + line.format(s="00", who="Engine 001", r=3)
                    + line.format(s="00", who="2 Engines Aggregated", r=5))
    res = _read(path)
    assert _series(res, "vllm:num_requests_running").tolist() == [5]
    assert any("twice" in w for w in res.report.warnings)


def test_json_log_records(tmp_path):
    """vLLM's ``--logging-config.formatter json``: one record per line, the time in asctime."""
    msg = ("Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 2.0 "
           "tokens/s, Running: {r} reqs, Waiting: 1 reqs, GPU KV cache usage: 75.0%")
    records = [{"asctime": f"2026-12-01 08:00:{s},500", "levelname": "INFO",
                "name": "vllm.v1.metrics.loggers", "processName": "MainProcess", "process": 7,
                "message": msg.format(r=r)} for s, r in (("00", 2), ("10", 3))]
    path = tmp_path / "server.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert detect(path)[0].kind == "server_log"
    running = _series(_read(path), "vllm:num_requests_running")
    assert list(running.items()) == [(_at(2026, 12, 1, 8, 0, 0) + 0.5, 2.0),
                                     (_at(2026, 12, 1, 8, 0, 10) + 0.5, 3.0)]


def test_a_log_after_a_long_head_of_other_output_is_found(tmp_path):
    path = tmp_path / "server.out"
    junk = "".join(f"Downloading shard {i}: {'#' * 80}\n" for i in range(2000))  # ~190 KB
    path.write_bytes(junk.encode() + KV_BOUND_LOG.read_bytes())
    assert detect(path)[0].kind == "server_log"
    assert _series(_read(path), "vllm:num_requests_running").tolist()[:2] == [18, 21]


def test_a_log_file_in_a_folder_is_found_by_its_content(tmp_path):
    (tmp_path / "server.out").write_bytes(KV_BOUND_LOG.read_bytes())
    kinds = [s.kind for s in detect(tmp_path)]
    assert kinds == ["server_log"]


def test_bench_result_matched_to_the_log_by_time(tmp_path):
    """``vllm bench serve`` ran 100 s and stamped 14:23:01: its row takes the log's gauges."""
    bench = json.loads((REPO_ROOT / "tests" / "data" / "bench" / "vllm033_c32.json").read_text())
    bench.update(date="20261201-142301", duration=100.0)
    path = tmp_path / "c32.json"
    path.write_text(json.dumps(bench))
    # both written in +08:00: the log is read in the bench results' zone unless told otherwise
    res = ingest([path, KV_BOUND_LOG], run="load",
                 options=IngestOptions(bench_timezone="+08:00", log_year=2026))
    row = res.runs.iloc[0]
    assert len(res.runs) == 1 and row["concurrency"] == 32
    assert row["t_start"] == _at(2026, 12, 1, 14, 21, 21) - 8 * 3600  # date - duration
    assert row["max_running"] == 24 and 20 <= row["mean_running"] <= 24
    assert row["mean_kv_usage"] > 0.95 and np.isnan(row["preemptions"])
    assert str(KV_BOUND_LOG) in row["source"]


def test_a_real_vllm_cpu_server_log():
    """vLLM 0.32.0's CPU build serving a tiny model with a 32-block pool, as it wrote its log."""
    res = _read(LOGS / "vllm_cpu_0.32.0.log.gz")
    info = _log_info(res)
    assert info["version"] == "0.32.0" and info["stats_lines"] == 12
    # "... Running: 5 reqs, Waiting: 7 reqs, CPU KV cache usage: 93.5%" at 14:33:26
    t = _at(2026, 12, 1, 14, 33, 26)
    assert _series(res, "vllm:num_requests_running")[t] == 5
    assert _series(res, "vllm:num_requests_waiting")[t] == 7
    assert _series(res, "vllm:kv_cache_usage_perc")[t] == pytest.approx(0.935)
    args = info["engine_args"]
    # --max-num-seqs 32 --block-size 32 --num-gpu-blocks-override 32: "CPU KV cache size:
    # 1,024 tokens"
    assert (args["max_num_seqs"], args["block_size"], args["num_gpu_blocks"]) == (32, 32, 32)
    assert args["kv_cache_size_tokens"] == 1024 and args["pool_device"] == "CPU"
    assert res.report.runs["r"]["dropped_labels"]["model_name"] == "tiny"
    # silences after the 0.0 tokens/s lines at 14:29:45 and 14:31:05 (next lines 14:30:45 and
    # 14:32:45): 5 + 9 idle intervals
    assert info["idle_intervals_filled"] == 14
    assert not [w for w in res.report.warnings if "series" in w]


# ------------------------------------------------------------------ refusals
def test_garbage_is_refused_with_exit_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "notes.log"
    bad.write_text("Traceback (most recent call last):\n  it broke, see attached\n")
    assert main(["ingest", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "vLLM server log" in err


def test_a_log_without_stats_lines_is_refused_naming_the_file(tmp_path, capsys):
    head = [ln for ln in KV_BOUND_LOG.read_text().splitlines() if "loggers.py" not in ln]
    path = tmp_path / "startup_only.log"
    path.write_text("\n".join(head) + "\n")
    with pytest.raises(InputError, match="no vLLM stats line") as err:
        _read(path)
    assert str(path) in str(err.value) and "start-up line" in str(err.value)
    assert main(["ingest", str(path), "--out", str(tmp_path / "out")]) == 2
    assert str(path) in capsys.readouterr().err


def test_a_date_the_given_year_lacks_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "leap.log"
    path.write_text("INFO 02-29 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 "
                    "tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, "
                    "Waiting: 0 reqs, GPU KV cache usage: 1.0%\n")
    with pytest.raises(InputError, match=r"line 1: 02-29 10:00:00 is not a time in 2026"):
        _read(path)
    assert _read(path, log_year=2028).series["t"].min() == _at(2028, 2, 29, 10, 0, 0)


_SEEDS = [KV_BOUND_LOG.read_bytes(), V0_LOG.read_bytes(), EARLY_LOG.read_bytes(),
          gzip.decompress((LOGS / "vllm_cpu_0.32.0.log.gz").read_bytes())]


@st.composite
def _damaged_logs(draw) -> bytes:
    """A real-format log cut anywhere, with lines dropped, swapped, or a character changed
    (digits, dates, separators): what a truncated copy or a corrupt line gives."""
    lines = draw(st.sampled_from(_SEEDS)).split(b"\n")
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["drop", "swap", "poke"]))
        if how == "drop":
            del lines[i]
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif lines[i]:
            k = draw(st.integers(0, len(lines[i]) - 1))
            c = draw(st.sampled_from(list(b"0912-:.,%x ") + [0xff]))
            lines[i] = lines[i][:k] + bytes([c]) + lines[i][k + 1:]
        if not lines:
            break
    data = b"\n".join(lines)
    return data[:draw(st.integers(0, len(data)))]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=_damaged_logs(), packed=st.booleans())
def test_damaged_logs_exit_0_or_2_without_a_traceback(tmp_path, data, packed):
    path = tmp_path / ("server.log.gz" if packed else "server.log")
    path.write_bytes(gzip.compress(data, mtime=0) if packed else data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["ingest", str(path), "--out", str(tmp_path / "out"), "--force",
                     "--log-year", "2026"])
    assert code in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()


# ------------------------------------------------------------------ end to end
def test_ingest_cli_writes_the_tables(tmp_path):
    out = tmp_path / "out"
    code = main(["ingest", str(KV_BOUND_LOG), "--out", str(out), "--log-year", "2026",
                 "--log-timezone", "UTC"])
    assert code == 0
    series = pd.read_csv(out / "series.csv")
    assert "vllm:prompt_tokens_total" in set(series["metric"])
    assert (out / "runs.csv").is_file()


@pytest.mark.slow
def test_report_on_a_kv_bound_log_says_bound_by_kv_blocks(tmp_path):
    out = tmp_path / "kv"
    assert main(["report", "--source", str(KV_BOUND_LOG), "--out", str(out)]) == 0
    record = yaml.safe_load((out / "record.yaml").read_text())
    assert record["status"] == KV_BOUND
    # the engine arguments come from the log's start-up lines
    assert record["scheduler"]["max_num_seqs"] == 64
    assert record["scheduler"]["num_gpu_blocks"] == 1024
    assert record["counters"]["num_preemptions_total"] is None
    # the report says what the log's numbers are worth
    page = (out / "index.html").read_text()
    assert "token counters are approximations" in page and "missing (not zero)" in page


@pytest.mark.slow
def test_report_on_a_prefill_bound_log_is_not_kv_bound(tmp_path):
    out = tmp_path / "prefill"
    assert main(["report", "--source", str(PREFILL_LOG), "--out", str(out)]) == 0
    record = yaml.safe_load((out / "record.yaml").read_text())
    assert record["status"] != KV_BOUND
    assert record["scheduler"]["max_num_seqs"] == 256
