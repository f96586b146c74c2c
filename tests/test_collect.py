"""``kvpressure collect`` against a stand-in server: levels, windows, faults, Ctrl-C.

The real thing (vLLM serving a model, a real Prometheus) is in ``tests/e2e/`` (``make e2e``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.bench import read_bench
from kvpressure.ingestion.counters import window_increase
from kvpressure.live.prompts import RequestSource
from live_fake import fake_vllm
from prometheus_server import free_port

FAST = ["--input-len", "8", "--output-len", "20", "--cooldown", "0.3",
        "--scrape-interval", "0.2", "--warmup", "2", "--no-report", "--load-engine", "builtin"]


def _levels(out: Path) -> dict:
    return json.loads((out / "levels.json").read_text())


def test_requests_are_exact_and_the_same_on_every_run() -> None:
    a = RequestSource(100, 30, seed=7, stream=4, range_ratio=0.5)
    b = RequestSource(100, 30, seed=7, stream=4, range_ratio=0.5)
    firsts = [a(k) for k in range(50)]
    assert firsts == [b(k) for k in range(50)]
    assert all(50 <= len(p) <= 150 and 15 <= o <= 45 for p, o in firsts)
    assert all(10 <= t < 1000 for p, _ in firsts for t in p)
    # Another level (stream) never repeats a prompt: no prefix-cache hits across levels.
    other = {tuple(RequestSource(100, 30, seed=7, stream=8)(k)[0]) for k in range(50)}
    assert not other & {tuple(p) for p, _ in firsts}
    fixed = RequestSource(64, 16, seed=1)
    assert {(len(p), o) for p, o in (fixed(k) for k in range(20))} == {(64, 16)}


def test_each_level_is_a_bench_result_whose_window_cuts_the_scrape_log_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    with fake_vllm(token_s=0.003, kv_capacity=2) as (url, state):
        code = main(["collect", url, "--levels", "1,3", "--out", str(out),
                     "--prompts-per-level", "6", "--engine-args", "{max_num_seqs: 8}", *FAST])
        preemptions = state.preemptions
    assert code == 0
    doc = _levels(out)
    assert doc["state"] == "complete" and doc["load_engine"] == "builtin"
    assert [(lv["concurrency"], lv["status"], lv["completed"]) for lv in doc["levels"]] == [
        (1, "complete", 6), (3, "complete", 6)]
    # Warm-up, then a cool-down before each level; nothing overlaps.
    spans = [(doc["warmup"]["start"], doc["warmup"]["end"])]
    for cool, lv in zip(doc["cooldowns"], doc["levels"], strict=True):
        spans += [(cool["start"], cool["end"]), (lv["start"], lv["end"])]
    assert all(a < b for a, b in spans) and all(
        s1[1] <= s2[0] for s1, s2 in zip(spans, spans[1:], strict=False))
    engine = json.loads((out / "engine.json").read_text())
    assert engine["engine_args"] == {"max_num_seqs": 8, "num_gpu_blocks": 64, "block_size": 16,
                                     "enable_prefix_caching": True, "max_model_len": 1024}
    assert engine["engine_args_from"]["num_gpu_blocks"] == "vllm:cache_config_info"
    assert engine["not_exported"] == ["max_num_batched_tokens"]

    notes: list[str] = []
    rows = read_bench(out / "bench" / "c3.json", "x", notes)
    assert rows[0]["num_requests"] == 6 and rows[0]["concurrency"] == 3
    assert rows[0]["window_start"] == doc["levels"][1]["start"]
    # One reader for both: the scrape log cut at each result's window.
    res = ingest([out / "bench", out / "metrics.prom.jsonl"], run="load_test")
    runs = res.runs.sort_values("concurrency").reset_index(drop=True)
    assert list(runs["concurrency"]) == [1.0, 3.0]
    for lv, (_, row) in zip(doc["levels"], runs.iterrows(), strict=True):
        bench = json.loads((out / lv["result"]).read_text())
        tokens = window_increase(res.series, "vllm:generation_tokens_total", row["t_start"],
                                 row["t_end"])
        assert tokens == bench["total_output_tokens"] == 6 * 20
    # Every preemption happened inside a level (the warm-up runs one request at a time).
    assert runs["preemptions"].sum() == preemptions and runs["preemptions"].iloc[0] == 0
    assert "c=3" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["500", "429"])
def test_a_server_refusing_every_request_ends_the_sweep_with_the_reason(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    started = time.monotonic()
    with fake_vllm(mode=mode) as (url, state):
        code = main(["collect", url, "--levels", "2,4", "--out", str(out),
                     "--prompts-per-level", "50", *FAST,
                     "--warmup", "0"])
        sent = state.completions
    assert code == 5
    assert time.monotonic() - started < 20
    levels = _levels(out)["levels"]
    assert levels[0]["status"] == "incomplete" and f"HTTP {mode}" in levels[0]["reason"]
    assert levels[0]["failed"] == levels[0]["requests"] > 0 and sent < 50
    assert levels[1]["status"] == "not run" and "c=2 incomplete" in levels[1]["reason"]
    result = json.loads((out / "bench" / "c2.json").read_text())
    assert result["kvpressure_level"]["complete"] is False
    # The reader keeps an incomplete level off the curve and says so.
    notes: list[str] = []
    assert read_bench(out / "bench" / "c2.json", "x", notes) == []
    assert "level incomplete" in notes[0]
    assert f"HTTP {mode}" in capsys.readouterr().err


def test_a_stalled_server_times_out_and_never_hangs(tmp_path: Path) -> None:
    started = time.monotonic()
    with fake_vllm(mode="stall") as (url, _):
        code = main(["collect", url, "--levels", "2", "--out", str(tmp_path / "a"),
                     "--prompts-per-level", "4", "--request-timeout", "1", *FAST,
                     "--warmup", "0"])
        level = _levels(tmp_path / "a")["levels"][0]
        assert code == 5 and "timeout" in level["reason"]
        # A level timeout cuts a level whose requests wait longer than it lasts.
        code = main(["collect", url, "--levels", "2", "--out", str(tmp_path / "b"),
                     "--prompts-per-level", "4", "--level-timeout", "1.5", *FAST,
                     "--warmup", "0"])
        level = _levels(tmp_path / "b")["levels"][0]
        assert code == 5 and "level timeout (1.5 s)" in level["reason"]
    assert time.monotonic() - started < 30


def test_a_wrong_url_exits_2_at_once_naming_it(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert main(["collect", url, "--levels", "4", "--out", str(tmp_path / "run")]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert url in err and "no OpenAI-compatible server" in err
    assert not (tmp_path / "run").exists()
    assert main(["collect", "http://[::1", "--levels", "4", "--out", str(tmp_path / "r")]) == 2
    assert "http://[::1" in capsys.readouterr().err
    with fake_vllm() as (good, _):
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "keep.txt").write_text("mine")
        assert main(["collect", good, "--levels", "4", "--out", str(tmp_path / "full")]) == 2
        assert "already holds files" in capsys.readouterr().err
        assert main(["collect", good, "--levels", "4,0", "--out", str(tmp_path / "x")]) == 2
        assert main(["collect", good + "/metrics", "--levels", "4", "--model", "other",
                     "--out", str(tmp_path / "y")]) == 2
        assert "serves fake" in capsys.readouterr().err


def test_ctrl_c_keeps_completed_levels_and_the_scrape_log(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with fake_vllm(token_s=0.02) as (url, _):
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvpressure.cli", "collect", url, "--levels", "1,2",
             "--out", str(out), "--duration-per-level", "60", *FAST],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if (out / "levels.json").is_file() and _levels(out)["levels"][0].get("start"):
                    break
                time.sleep(0.1)
            time.sleep(1.5)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    doc = _levels(out)
    assert doc["state"] == "interrupted"
    first = doc["levels"][0]
    assert first["status"] == "incomplete" and "interrupted" in first["reason"]
    assert first["completed"] > 0
    assert doc["levels"][1]["status"] == "not run"
    lines = (out / "metrics.prom.jsonl").read_text().splitlines()
    assert len(lines) > 3 and all("text" in json.loads(x) for x in lines)
    assert "Traceback" not in err


def test_a_level_over_max_ttft_is_kept_and_ends_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with fake_vllm(token_s=0.01) as (url, _):
        code = main(["collect", url, "--levels", "1,2,4", "--out", str(out),
                     "--prompts-per-level", "3", "--max-ttft", "0.005", *FAST])
    assert code == 0
    levels = _levels(out)["levels"]
    assert levels[0]["status"] == "complete" and levels[0]["saturated"] is True
    assert levels[0]["ttft_p95_s"] > 0.005
    assert [lv["status"] for lv in levels[1:]] == ["not run", "not run"]
    assert "saturated" in levels[1]["reason"] and "--max-ttft" in levels[1]["reason"]


def test_an_engine_argument_typo_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with fake_vllm() as (url, state):
        code = main(["collect", url, "--levels", "2", "--out", str(tmp_path / "run"),
                     "--engine-args", "{max_num_seq: 8}", *FAST])
        assert code == 2 and state.completions == 0
    assert "did you mean 'max_num_seqs'" in capsys.readouterr().err


FAKE_VLLM = """#!{python}
import json, os, sys, time
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
with open(os.environ["FAKE_VLLM_PIDS"], "a") as fh:
    fh.write(f"{{os.getpid()}}\\n")
time.sleep(float(os.environ.get("FAKE_VLLM_SLEEP", "0")))
result = {{"date": "20260101-000000", "backend": "vllm", "duration": 0.5, "completed": 4,
          "failed": 0, "max_concurrency": int(opt("--max-concurrency")),
          "num_prompts": int(opt("--num-prompts")), "total_input_tokens": 32,
          "total_output_tokens": 80, "output_throughput": 160.0, "mean_ttft_ms": 5.0}}
with open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w") as fh:
    json.dump(result, fh)
"""


def test_vllm_bench_serve_runs_each_level_and_is_stopped_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake = tmp_path / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    with fake_vllm() as (url, _):
        code = main(["collect", url, "--levels", "2,4", "--out", str(tmp_path / "a"),
                     "--vllm", str(fake), "--prompts-per-level", "4", *FAST,
                     "--load-engine", "auto"])
        doc = _levels(tmp_path / "a")
        assert code == 0 and doc["load_engine"] == "vllm-bench"
        result = json.loads((tmp_path / "a" / "bench" / "c4.json").read_text())
        assert result["max_concurrency"] == 4 and result["num_prompts"] == 4
        window = result["kvpressure_window"]
        assert window["start"] < window["end"] and doc["levels"][1]["start"] == window["start"]
        # A child still running at the level timeout is stopped, and the level is incomplete.
        monkeypatch.setenv("FAKE_VLLM_SLEEP", "60")
        started = time.monotonic()
        code = main(["collect", url, "--levels", "2", "--out", str(tmp_path / "b"),
                     "--vllm", str(fake), "--level-timeout", "1", *FAST,
                     "--load-engine", "vllm-bench"])
        assert code == 5 and time.monotonic() - started < 20
        level = _levels(tmp_path / "b")["levels"][0]
        assert level["status"] == "incomplete" and "level timeout (1 s)" in level["reason"]
        # Duration-bound levels are the built-in client's: vllm bench runs a number of prompts.
        capsys.readouterr()
        assert main(["collect", url, "--levels", "2", "--out", str(tmp_path / "c"), "--vllm",
                     str(fake), "--duration-per-level", "5", "--load-engine", "vllm-bench"]) == 2
        assert "give --prompts-per-level" in capsys.readouterr().err
    last = int(pids.read_text().split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(last, 0)


def test_the_server_log_gives_engine_json_its_device_and_version(tmp_path: Path) -> None:
    log = Path(__file__).parent / "data" / "logs" / "v1_kv_bound.log"
    out = tmp_path / "run"
    with fake_vllm(token_s=0.002) as (url, _):
        assert main(["collect", url, "--levels", "1", "--out", str(out), "--prompts-per-level",
                     "2", "--server-log", str(log), *FAST]) == 0
    server = json.loads((out / "engine.json").read_text())["server"]
    assert server["device"] == "cuda" and server["from_log"] == str(log)
    assert _levels(out)["options"]["server_log"] == str(log)
    # the log as it stood at the sweep's end, kept in the run folder for the report to read
    # (the running server goes on writing the file given)
    assert (out / "server.log").read_bytes() == log.read_bytes()
    # a log that is not there is refused before any request, naming it
    assert main(["collect", url, "--levels", "1", "--out", str(tmp_path / "b"),
                 "--server-log", str(tmp_path / "none.log"), *FAST]) == 2
    assert not (tmp_path / "b").exists()
