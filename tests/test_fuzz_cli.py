"""Random bytes, truncated files and random JSON/YAML through every subcommand: each exits 0 or 2,
never another code, and never shows a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpressure.cli import main
from kvpressure.paths import data_dir

TESTS = Path(__file__).parent
RUNS_CSV = (
    "variant,concurrency,output_throughput\n"
    "baseline,4,100\nbaseline,8,180\nbaseline,16,240\nbaseline,32,230\n"
)
SCRAPES = "".join(
    json.dumps({"t": 5.0 * i, "text": "# TYPE vllm:num_preemptions counter\n"
                f'vllm:num_preemptions_total{{engine="0"}} {i}\n'}) + "\n" for i in range(4))
# Valid inputs, cut anywhere: the parsers meet every prefix of a real file.
SEEDS = {
    "scenario": (TESTS / "data" / "vllm-0.33-scheduler"
                 / "light_open_prefix_groups.scenario.json").read_bytes(),
    "experiment": (data_dir() / "experiments" / "ci_small.yaml").read_bytes(),
    "bench": (TESTS / "data" / "bench" / "vllm033_c32.json").read_bytes(),
    "prom": (TESTS / "data" / "prom" / "v0_engine.prom").read_bytes(),
    "scrapes": SCRAPES.encode(),
    "runs": RUNS_CSV.encode(),
    "hardware": (data_dir() / "hardware" / "l40s.yaml").read_bytes(),
    "model": (data_dir() / "models" / "llama-3.1-8b.yaml").read_bytes(),
}
# Real field names, so random documents get past the first check and into the validation.
KEYS = ["name", "mode", "type", "concurrency", "settings", "num_gpu_blocks", "requests", "id",
        "prompt_len", "output_len", "arrival_step", "prefix_groups", "length", "workload",
        "engine", "hardware", "model", "num_requests", "seed", "input_len", "t", "text",
        "status", "data", "result", "max_concurrency", "output_throughput", "duration",
        "memory_gib", "num_hidden_layers", "comparison", "values", "cost_model"]
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(KEYS))
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5),
    max_leaves=20,
)


def _as_bytes(doc, as_yaml: bool) -> bytes:
    if as_yaml:
        return yaml.safe_dump(doc).encode()
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def contents(draw, seed: str) -> bytes:
    kind = draw(st.sampled_from(["bytes", "cut", "doc"]))
    if kind == "bytes":
        return draw(st.binary(max_size=600))
    if kind == "cut":
        data = SEEDS[seed]
        return data[:draw(st.integers(0, len(data)))]
    return _as_bytes(draw(DOCS), draw(st.booleans()))


# Each command with its file argument; the options keep a valid input's run small.
COMMANDS = {
    "simulate-scenario": ("scenario", ".json", lambda f, o: [
        "simulate", f, "--out", o, "--no-metrics"]),
    "simulate-experiment": ("experiment", ".yaml", lambda f, o: [
        "simulate", f, "--out", o, "--no-metrics", "--concurrency", "4"]),
    "sweep": ("experiment", ".yaml", lambda f, o: [
        "sweep", f, "--out", o, "--concurrency", "4", "--no-compare", "--jobs", "1"]),
    "ingest-prom": ("prom", ".prom", lambda f, o: ["ingest", f, "--out", o]),
    "ingest-jsonl": ("scrapes", ".jsonl", lambda f, o: ["ingest", f, "--out", o]),
    "ingest-bench": ("bench", ".json", lambda f, o: ["ingest", f, "--out", o]),
    "knee": ("runs", ".csv", lambda f, o: ["knee", f]),
    "capacity-hardware": ("hardware", ".yaml", lambda f, o: [
        "capacity", "--hardware", f, "--model", "llama-3.1-8b"]),
    "capacity-model": ("model", ".yaml", lambda f, o: [
        "capacity", "--hardware", "l40s", "--model", f]),
    # never a valid experiment from these (no truncation of one): no notebook runs
    "report": ("bench", ".yaml", lambda f, o: ["report", "--experiment", f, "--out", o]),
}


def _run_in_process(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_input_exits_0_or_2_without_a_traceback(command):
    seed, suffix, argv_of = COMMANDS[command]

    @settings(max_examples=20, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=contents(seed))
    def check(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"input{suffix}"
            path.write_bytes(data)
            code, err = _run_in_process([str(a) for a in argv_of(path, Path(tmp) / "out")])
            assert code in (0, 2), (code, err)
            assert "Traceback" not in err, err

    check()


def test_arguments_themselves_are_checked():
    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(st.sampled_from(["--concurrency", "--jobs", "--set"]),
           st.text(min_size=1, max_size=8).filter(lambda s: not s.startswith("-")))
    def check(option: str, value: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            exp = str(data_dir() / "experiments" / "ci_small.yaml")
            argv = {"--concurrency": ["sweep", exp, "--concurrency", value, "--no-compare"],
                    "--jobs": ["sweep", exp, "--jobs", value, "--concurrency", "4"],
                    "--set": ["simulate", exp, "--set", value, "--concurrency", "4"]}[option]
            code, err = _run_in_process([*argv, "--out", str(Path(tmp) / "o"), *(
                ["--no-metrics"] if argv[0] == "simulate" else [])])
            assert code in (0, 2), (code, err)
            assert "Traceback" not in err, err

    check()


@pytest.mark.parametrize("command", ["simulate-scenario", "ingest-jsonl", "report"])
def test_real_processes_refuse_binary_input_cleanly(tmp_path, command):
    seed, suffix, argv_of = COMMANDS[command]
    path = tmp_path / f"input{suffix}"
    path.write_bytes(bytes(range(256)) * 4)
    proc = subprocess.run(
        [sys.executable, "-m", "kvpressure.cli", *map(str, argv_of(path, tmp_path / "o"))],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_scrape_urls_and_numbers_are_checked():
    urls = st.one_of(
        st.text(max_size=16),
        st.builds(lambda p: f"http://127.0.0.1:9/{p}", st.text(max_size=8)),
        st.sampled_from(["http://[::1", "http://[::1/metrics", "ftp://127.0.0.1/metrics",
                         "http://", "http://127.0.0.1:99999/metrics"]))
    numbers = st.sampled_from(["0", "-5", "nan", "inf", "1e-300", "0.2"])

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(urls.filter(lambda u: not u.startswith("-")), numbers, numbers)
    def check(url: str, interval: str, timeout: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            code, err = _run_in_process([
                "scrape", url, "--out", str(Path(tmp) / "log.jsonl"), "--count", "1",
                "--interval", interval, "--timeout", timeout, "--max-failures", "1"])
            assert code in (0, 2), (code, err)
            assert "Traceback" not in err, err

    check()


# --------------------------------------------------------------------------- hostile edits
# Mistakes a hand-edited YAML or JSON file carries, applied at a random place of a real file:
# a key given twice, nesting far past any real input, `true` where a number was, a Latin-1
# byte. The first two are refused whatever else the file holds, and so is the last by every
# JSON and YAML reader; `true` for a number is refused unless the number sat in free text.
STRUCTURED = {"simulate-scenario", "simulate-experiment", "sweep", "ingest-bench",
              "capacity-hardware", "capacity-model", "report"}
_YAML_KEY = re.compile(r"(?m)^( *)([A-Za-z_][\w]*):(.*)$")
_JSON_KEY = re.compile(r'"([A-Za-z_]\w*)":\s*')
_YAML_NUMBER = re.compile(r"(?m)^( *[A-Za-z_]\w*: *)(-?\d+(?:\.\d+)?)\s*$")
_JSON_NUMBER = re.compile(r'("[A-Za-z_]\w*":\s*)(-?\d+(?:\.\d+)?)')


@st.composite
def hostile_edits(draw, seed: str, mistake: str) -> bytes:
    data = SEEDS[seed]
    text = data.decode()
    as_json = text.lstrip()[:1] in "{["
    if mistake == "latin1":
        at = draw(st.integers(0, len(data)))
        return data[:at] + b"\xe9" + data[at:]
    if mistake == "bool":
        numbers = list((_JSON_NUMBER if as_json else _YAML_NUMBER).finditer(text))
        m = draw(st.sampled_from(numbers))
        return (text[:m.start(2)] + "true" + text[m.end(2):]).encode()
    keys = list((_JSON_KEY if as_json else _YAML_KEY).finditer(text))
    m = draw(st.sampled_from(keys))
    if mistake == "duplicate":
        if as_json:  # the same key once more, just before it, in the same object
            return (text[:m.start()] + f'"{m.group(1)}": 0, ' + text[m.start():]).encode()
        return (text[:m.end()] + "\n" + m.group(0) + text[m.end():]).encode()
    depth = draw(st.integers(70, 5000))
    deep = "[" * depth + "]" * depth
    if as_json:
        return (text[:m.start()] + f'"deep": {deep}, ' + text[m.start():]).encode()
    return (text[:m.start()] + f"{m.group(1)}deep: {deep}\n" + text[m.start():]).encode()


@pytest.mark.parametrize("mistake", ["duplicate", "deep", "bool", "latin1"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_hand_edit_mistakes_are_refused(command, mistake):
    seed, suffix, argv_of = COMMANDS[command]
    structured = command in STRUCTURED
    if not structured and mistake != "latin1":
        pytest.skip("not a YAML or JSON input")
    must_refuse = mistake in ("duplicate", "deep") or (mistake == "latin1" and structured)

    @settings(max_examples=5, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=hostile_edits(seed, mistake))
    def check(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"input{suffix}"
            path.write_bytes(data)
            code, err = _run_in_process([str(a) for a in argv_of(path, Path(tmp) / "out")])
            assert code in ((2,) if must_refuse else (0, 2)), (code, err)
            assert "Traceback" not in err, err
            if must_refuse:
                assert str(path) in err, err

    check()
