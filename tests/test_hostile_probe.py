"""What benchmarks/probe_hostile.py found, one test each: a user's file kept, a bad value named,
no exit 1, no markup from a run's name on the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.paths import data_dir

TESTS = Path(__file__).parent
CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"
DUMP = (TESTS / "data" / "real" / "vllm_0.32_cpu_loaded.prom").read_text()
IDLE = (TESTS / "data" / "real" / "vllm_0.32_cpu_idle.prom").read_text()
BENCH = json.loads((TESTS / "data" / "bench" / "vllm033_c32.json").read_text())
SAVED = TESTS / "data" / "twin_saved" / "pool64_firstchunk"
SCENARIO = {"name": "tiny", "settings": {"num_gpu_blocks": 64, "max_num_seqs": 4},
            "requests": [{"id": "a", "prompt_len": 40, "output_len": 4}]}


def refused(capsys: pytest.CaptureFixture, argv: list, *words: str) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def _log(texts: list[str]) -> str:
    return "".join(json.dumps({"t": 1.7e9 + 5 * i, "text": t}) + "\n"
                   for i, t in enumerate(texts))


def _vllm(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines()
                   if line.startswith(("vllm:", "# TYPE vllm:", "# HELP vllm:")))


# --------------------------------------------------------------------------- the page
# --------------------------------------------------------------------------- the user's files
@pytest.mark.parametrize("command", ["simulate", "ingest"])
def test_out_under_a_file_is_refused_naming_the_file(tmp_path, capsys, command):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    source = tmp_path / "s.json"
    source.write_text(json.dumps(SCENARIO))
    if command == "ingest":
        source = tmp_path / "s.jsonl"
        source.write_text(_log([_vllm(IDLE), _vllm(DUMP)]))
    refused(capsys, [command, source, "--out", notes / "sub"], str(notes), "is a file")
    assert notes.read_text() == "mine\n"


def test_twin_never_replaces_a_users_file_in_out(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["ingest", str(SAVED / "bench"), str(SAVED / "metrics.prom.jsonl.gz"),
                 "--out", str(run)]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "twin.md").write_text("my own notes\n")
    refused(capsys, ["twin", run, "--out", mine, "--bootstrap", "0", "--no-remedies"],
            "--out", "did not write")
    assert (mine / "twin.md").read_text() == "my own notes\n"
    assert sorted(p.name for p in mine.iterdir()) == ["twin.md"]


@pytest.mark.parametrize("content", ["my notes\n", "concurrency,output_throughput\n4,100\n"])
def test_scrape_never_appends_to_a_file_that_is_no_scrape_log(tmp_path, capsys, content):
    notes = tmp_path / "notes.txt"
    notes.write_text(content)
    refused(capsys, ["scrape", "http://127.0.0.1:9/metrics", "--out", notes, "--count", "1",
                     "--timeout", "0.5"], str(notes), "not a scrape log")
    assert notes.read_text() == content


def test_scrape_still_appends_to_its_own_log():
    import tempfile

    from kvpressure.ingestion.live_scrape import _check_appendable
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        log.write_text(_log([_vllm(IDLE)]))
        _check_appendable(log)
        log.write_text('{"t": 1.0, "text": "cut by a kill')
        _check_appendable(log)


# --------------------------------------------------------------------------- real data
@pytest.mark.parametrize("change, field", [
    ({"max_concurrency": True}, "max_concurrency"),
    ({"duration": -50.0}, "duration"),
    ({"duration": 0}, "duration"),
    ({"completed": "200"}, "completed"),
    ({"total_output_tokens": -5}, "total_output_tokens"),
    ({"p99_ttft_ms": "fast"}, "p99_ttft_ms"),
])
def test_bench_fields_vllm_never_writes_are_refused_naming_them(tmp_path, capsys, change, field):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({**BENCH, **change}))
    refused(capsys, ["ingest", path, "--out", tmp_path / "o"], str(path), f"'{field}'")


def test_a_negative_counter_is_refused_naming_its_line(tmp_path, capsys):
    path = tmp_path / "d.prom"
    path.write_text(re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\1 -20",
                           _vllm(DUMP)))
    refused(capsys, ["ingest", path, "--out", tmp_path / "o"], str(path), "line",
            "vllm:num_preemptions_total", "negative")


def test_a_dump_without_vllm_metrics_is_refused(tmp_path, capsys):
    path = tmp_path / "d.prom"
    path.write_text("".join(line + "\n" for line in DUMP.splitlines()
                            if line.startswith("python_")))
    refused(capsys, ["ingest", path, "--out", tmp_path / "o"], str(path), "vLLM metric")


@pytest.mark.parametrize("mistake, words", [
    ("latin1", ["UTF-8"]),
    ("duplicate", ["'t'", "twice", "line 1"]),
    ("deep", ["nested"]),
    ("nan", ["'t'"]),
])
def test_a_scrape_log_line_with_a_hand_edit_mistake_is_named(tmp_path, capsys, mistake, words):
    good = _log([_vllm(IDLE), _vllm(DUMP)]).splitlines()
    first = {"latin1": good[0][:-2].encode() + b'\xe9"}',
             "duplicate": good[0].replace('{"t": ', '{"t": 1.0, "t": ', 1).encode(),
             "deep": ('{"t": 1, "text": "x", "extra": ' + "[" * 100_000 + "]" * 100_000
                      + "}").encode(),
             "nan": good[0].replace('{"t": 1700000000.0', '{"t": NaN', 1).encode()}[mistake]
    path = tmp_path / "s.jsonl"
    path.write_bytes(first + b"\n" + good[1].encode() + b"\n")
    refused(capsys, ["ingest", path, "--out", tmp_path / "o"], str(path), *words)


# --------------------------------------------------------------------------- option values
LOG = _log([_vllm(IDLE), _vllm(DUMP)])


@pytest.mark.parametrize("argv, option", [
    (["--timeout", "nan", "--start", "0", "--end", "10"], "--timeout"),
    (["--timeout", "0", "--start", "0", "--end", "10"], "--timeout"),
    (["--block-size", "7"], "--block-size"),
    (["--num-gpu-blocks", "0"], "--num-gpu-blocks"),
    (["--log-year", "0"], "--log-year"),
    (["--bench-timezone", "Mars/Base"], "--bench-timezone"),
    (["--log-timezone", "+25:00"], "--log-timezone"),
    (["--run", ""], "--run"),
])
def test_ingest_options_are_named(tmp_path, capsys, argv, option):
    source = "http://127.0.0.1:9" if "--start" in argv else tmp_path / "s.jsonl"
    (tmp_path / "s.jsonl").write_text(LOG)
    refused(capsys, ["ingest", source, "--out", tmp_path / "o", *argv], option)


@pytest.mark.parametrize("argv, option", [
    (["--time-scale", "0"], "--time-scale"),
    (["--time-scale", "-1"], "--time-scale"),
    (["--time-scale", "2"], "--trace"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "100000000000"], "--concurrency"),
])
def test_simulate_options_are_named(tmp_path, capsys, argv, option):
    refused(capsys, ["simulate", CI_SMALL, "--out", tmp_path / "o", "--no-metrics", *argv],
            option)


def test_simulate_rate_is_named(tmp_path, capsys):
    data = yaml.safe_load(CI_SMALL.read_text())
    data["workload"].pop("concurrency")
    data["workload"]["request_rates"] = [1, 2]
    data["focus"] = {}
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump(data))
    for rate in ("-1", "0", "nan"):
        refused(capsys, ["simulate", path, "--out", tmp_path / "o", "--no-metrics",
                         "--request-rate", rate], "--request-rate")


@pytest.mark.parametrize("tol", ["nan", "-1", "5"])
def test_knee_plateau_tol_is_named(tmp_path, capsys, tol):
    runs = tmp_path / "runs.csv"
    runs.write_text("concurrency,output_throughput\n4,100\n8,180\n16,240\n")
    refused(capsys, ["knee", runs, "--plateau-tol", tol], "--plateau-tol")


def test_twin_limits_settings_focus_and_tp_are_named():
    from kvpressure.analysis.limits import parse_limits
    from kvpressure.twin.settings import parse_set

    with pytest.raises(InputError, match="--limits"):
        parse_limits("ttft_p95=1e400s")
    with pytest.raises(InputError, match=r"--set.*'max_num_seqs'"):
        parse_set(["max_num_seq=4"])
    assert parse_set(["max_num_seqs=4"]) == {"max_num_seqs": "4"}


@pytest.mark.parametrize("argv, option", [(["--focus", "nan"], "--focus"),
                                          (["--tp", "0"], "--tp")])
def test_twin_options_are_named_before_the_run_folder_is_read(tmp_path, capsys, argv, option):
    refused(capsys, ["twin", tmp_path, "--out", tmp_path / "t", *argv], option)


@pytest.mark.parametrize("param, words", [
    ("focus_concurrency=abc", ["focus_concurrency", "whole number"]),
    ("engine_args={max_num_seqs: 1, max_num_seqs: 2}", ["engine_args", "max_num_seqs", "twice"]),
    ("engine_args=256", ["engine_args", "mapping"]),
])
def test_report_params_are_typed_before_any_notebook(tmp_path, capsys, param, words):
    err = refused(capsys, ["report", "--experiment", CI_SMALL, "--out", tmp_path / "r",
                           "--param", param], *words)
    assert "notebook" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("change, option", [
    ({"range_ratio": float("nan")}, "--range-ratio"),
    ({"range_ratio": 2.0}, "--range-ratio"),
    ({"input_len": 0}, "--input-len"),
    ({"output_len": -1}, "--output-len"),
    ({"engine_args": {"max_num_seqs": True}}, "max_num_seqs"),
])
def test_collect_options_are_checked_before_any_load(tmp_path, change, option):
    from kvpressure.live.runner import CollectOptions

    opts = CollectOptions(url="http://127.0.0.1:9", out=tmp_path / "c", levels=[1], **change)
    with pytest.raises(InputError, match=re.escape(option)):
        opts.check()


def test_capacity_sequence_lengths_and_startup_log(tmp_path, capsys):
    base = ["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b"]
    refused(capsys, [*base, "--avg-seq-len", "100000000000000000000"], "--avg-seq-len",
            "max_model_len")
    log = tmp_path / "start.log"
    log.write_bytes("INFO caf\xe9\n".encode("latin-1"))
    refused(capsys, [*base, "--from-log", log], "--from-log", str(log), "UTF-8")
    assert main([*base, "--num-gpu-blocks-override", "1000000000000000", "--json"]) == 0
    assert "more than the card" in json.dumps(json.loads(capsys.readouterr().out))


def test_knee_refuses_a_negative_throughput_naming_the_row(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    runs.write_text("concurrency,output_throughput\n4,100\n8,180\n16,-240\n32,230\n")
    refused(capsys, ["knee", runs], str(runs), "row 3", "never negative")


def test_a_set_value_nested_past_the_stack_names_the_option(tmp_path, capsys):
    deep = "[" * 5000 + "]" * 5000
    refused(capsys, ["simulate", CI_SMALL, "--out", tmp_path / "o", "--no-metrics",
                     "--set", f"max_num_seqs={deep}"], "--set max_num_seqs", "nested")


def test_collect_refuses_a_metrics_endpoint_that_is_no_prometheus_text():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kvpressure.live.server import probe

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = (b'{"data": [{"id": "m"}]}' if self.path == "/v1/models"
                    else b"<html>login</html>")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(InputError, match=r"/metrics: not Prometheus text"):
            probe(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
    finally:
        server.shutdown()
