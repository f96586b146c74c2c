"""The load tools users run, run for real against the real vLLM server, read back by the kit.

On the server of ``test_live_vllm.py`` (vLLM 0.32.0's CPU build, the seeded tiny Llama, 24 KV
blocks of 32 tokens, here without the prefix cache: three requests of 128 + 128 tokens fill the
pool) the same four levels,
below and past that knee, are loaded three ways:

* ``kvpressure collect`` (the kit's own client, ``/metrics`` recorded by the kit);
* AIPerf 0.13.0 (``scripts/aiperf-env.sh``) as a concurrency sweep, the server metrics it
  records itself (``--server-metrics-formats json jsonl``) the only engine metrics;
* GuideLLM 0.8.1 (``scripts/guidellm-env.sh``), a concurrent profile over the same stream
  counts, with ``kvpressure scrape`` recording ``/metrics`` beside it.

``kvpressure report --source`` on each tool's output folder (and the scrape log) gives the same
status as the collect run's report, and its knee within one level of collect's. The machine's
cores are shared, so no throughput is compared across the runs, only what the reports conclude.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from vllm_server import SERVED_NAME, VllmServer, serving, stop_group, tiny_model, vllm_python

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
POOL = {"num_gpu_blocks": 24, "block_size": 32, "max_model_len": 512, "max_num_seqs": 32,
        "max_num_batched_tokens": 512}
INPUT_LEN = OUTPUT_LEN = 128
LEVELS = [1, 2, 4, 8]
SECONDS = 6  # a level's load
ENGINE_ARGS = "{max_num_seqs: 32, max_num_batched_tokens: 512}"


def _tool(script: str, command: str) -> Path:
    """The tool's command in its cached environment (built by its script when missing)."""
    env = subprocess.run([str(REPO / "scripts" / script)], check=True, capture_output=True,
                         text=True, timeout=1800)
    return Path(env.stdout.strip().splitlines()[-1]) / "bin" / command


def _run(cmd: list[str], timeout_s: float, log: Path, env: dict | None = None
         ) -> subprocess.CompletedProcess:
    """A command in its own process group (stopped with its children on a timeout), its
    output in ``log``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=env)
        try:
            proc.wait(timeout=timeout_s)
        except BaseException:
            stop_group(proc, grace_s=10)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text(errors="replace"))


def _kvpressure(args: list[str], timeout_s: float, log: Path) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "kvpressure.cli", *args], timeout_s, log)


def _record(folder: Path) -> dict:
    return yaml.safe_load((folder / "record.yaml").read_text())


def _verdict(folder: Path) -> tuple[str, int | None, int | None]:
    """(status, knee level, focus level) of a report; None where it found none."""
    record = _record(folder)
    knee, focus = record["perf"]["knee"]["knee_x"], record["counters"]["window"]["concurrency"]
    return (record["status"], None if knee is None else int(knee),
            None if focus is None else int(focus))


def _report(sources: list[Path], out: Path, log: Path, engine_args: str | None = ENGINE_ARGS
            ) -> tuple[str, int, int]:
    """The record a report on ``sources`` gives, computed by ``kvpressure analyse`` (the
    report's library calls without Jupyter, byte-equal results: tests/test_report_pipeline.py),
    for collect's run folder as for the tools' exports (the full page is test_live_vllm.py's)."""
    given = ["--param", f"engine_args={engine_args}"] if engine_args else []
    proc = _kvpressure(["analyse", str(out), "--source", *map(str, sources), *given], 300, log)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return _verdict(out)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # Without the prefix cache: AIPerf's synthetic prompts share most of their blocks, which
    # would let its requests fit the pool more densely than the others' and move its knee.
    with serving(tmp_path_factory, POOL, ("--no-enable-prefix-caching",)) as srv:
        yield srv


@pytest.fixture(scope="module")
def collected(server: VllmServer, tmp_path_factory: pytest.TempPathFactory):
    """``kvpressure collect`` on the levels, and its report's verdict."""
    tmp = tmp_path_factory.mktemp("collect")
    out = tmp / "run"
    t0 = time.monotonic()
    proc = _kvpressure(["collect", server.url, "--levels", ",".join(map(str, LEVELS)),
                        "--out", str(out), "--input-len", str(INPUT_LEN),
                        "--output-len", str(OUTPUT_LEN), "--duration-per-level", str(SECONDS),
                        "--cooldown", "1", "--warmup", "2", "--engine-args", ENGINE_ARGS,
                        "--load-engine", "builtin", "--no-report"], 480, tmp / "collect.log")
    assert proc.returncode == 0, proc.stdout[-4000:]
    # the run folder alone: collect recorded the engine arguments it was given
    verdict = _report([out], tmp / "report", tmp / "report.log", engine_args=None)
    print(f"\ncollect: {verdict} in {time.monotonic() - t0:.0f} s")
    return verdict


def test_aiperf_sweep_reads_to_the_verdict_of_collect(server: VllmServer, collected,
                                                      tmp_path: Path) -> None:
    aiperf = _tool("aiperf-env.sh", "aiperf")
    out = tmp_path / "aiperf"
    t0 = time.monotonic()
    # AIPerf loads a local tokenizer by path only when not told to stay offline (offline it
    # looks the path up in the hub's cache).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    proc = _run([str(aiperf), "profile", "--model", SERVED_NAME,
                 "--tokenizer", str(tiny_model(vllm_python())), "--url", server.url,
                 "--endpoint-type", "completions", "--streaming",
                 "--concurrency", ",".join(map(str, LEVELS)),
                 "--benchmark-duration", str(SECONDS), "--benchmark-grace-period", "30",
                 "--warmup-request-count", "2",
                 "--isl", str(INPUT_LEN), "--isl-stddev", "0", "--osl", str(OUTPUT_LEN),
                 "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true",
                 "--random-seed", "7", "--artifact-dir", str(out), "--ui-type", "none",
                 "--server-metrics-formats", "json", "jsonl"],
                600, tmp_path / "aiperf.log", env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    took = time.monotonic() - t0
    # AIPerf 0.13 lays a sweep out as one folder per level, the level in its phases[].
    for c in LEVELS:
        export = json.loads((out / f"concurrency_{c}" / "profile_export_aiperf.json").read_text())
        assert export["aiperf_version"] == "0.13.0"
        (phase,) = [p for p in export["input_config"]["phases"] if p["kind"] == "profiling"]
        assert phase["concurrency"] == c
    verdict = _report([out], tmp_path / "report", tmp_path / "report.log")
    record = _record(tmp_path / "report")
    print(f"\naiperf: {verdict} (collect {collected}); sweep {took:.0f} s")
    assert record["provenance"]["load_tool"] == "AIPerf 0.13.0"
    # The engine metrics came from the server metrics AIPerf recorded: preemptions past the
    # pool's capacity.
    assert record["counters"]["num_preemptions_total"] > 0, record["counters"]
    # AIPerf scrapes /metrics every 333 ms, but a scrape of the busy CPU server can fail: a level
    # whose export holds no gauge sample inside its profiling phase carries no evidence of the
    # gauges (the kit then reads the phase's edges, idle), so only its knee can agree.
    inside = _gauge_samples_inside(tmp_path / "report")
    print(f"aiperf: {inside} running-gauge samples inside the focus level's window", flush=True)
    _agree(verdict, collected, status=inside >= 3)


def _gauge_samples_inside(folder: Path) -> int:
    import pandas as pd

    focus = json.loads((folder / "analysis" / "collect.json").read_text())["focus"]
    t0, t1 = focus["gauge_t0"], focus["gauge_t1"]
    margin = 0.1 * (t1 - t0)
    series = pd.read_csv(folder / "series.csv")
    gauge = series[(series["metric"] == "vllm:num_requests_running")
                   & (series["run"] == focus["run"])]
    return int(((gauge["t"] > t0 + margin) & (gauge["t"] < t1 - margin)).sum())


def test_guidellm_concurrent_profile_reads_to_the_verdict_of_collect(
        server: VllmServer, collected, tmp_path: Path) -> None:
    guidellm = _tool("guidellm-env.sh", "guidellm")
    out = tmp_path / "guidellm"
    out.mkdir()
    # Prompts of the model's own words (its tokenizer knows only w0..w1023): GuideLLM's
    # synthetic text is English, which this vocabulary turns into nothing.
    rng = random.Random(3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({
        "prompt": " ".join(f"w{rng.randrange(1024)}" for _ in range(INPUT_LEN)),
        "output_tokens_count": OUTPUT_LEN}) + "\n" for _ in range(64)))
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"spec": {
        "backend": {"kind": "openai_http", "target": server.url, "model": SERVED_NAME,
                    "request_format": "/v1/completions",
                    "extras": {"body": {"ignore_eos": True}}},
        "profile": {"kind": "concurrent", "streams": LEVELS},
        "tokenizer": {"kind": "huggingface_auto", "model": str(tiny_model(vllm_python()))},
        "data": [{"kind": "json_file", "path": str(prompts)}],
        "constraints": [{"kind": "max_duration", "seconds": SECONDS}],
        "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")},
                    {"kind": "yaml", "path": str(out / "benchmarks.yaml")}]}}))
    scrape_log = tmp_path / "metrics.prom.jsonl"
    scraper = subprocess.Popen(
        [sys.executable, "-m", "kvpressure.cli", "scrape", server.url + "/metrics", "--out",
         str(scrape_log), "--interval", "0.5", "--duration", "400"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    try:
        time.sleep(1.5)  # a scrape before the first request
        proc = _run([str(guidellm), "run", "--scenario", str(scenario),
                     "--disable-console-interactive"], 400, tmp_path / "guidellm.log",
                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
        time.sleep(1.5)  # and one after the last
    finally:
        stop_group(scraper, grace_s=5)
    assert proc.returncode == 0, proc.stdout[-4000:]
    took = time.monotonic() - t0
    report = json.loads((out / "benchmarks.json").read_text())
    assert report["metadata"]["guidellm_version"] == "0.8.1"
    assert [b["config"]["strategy"]["streams"] for b in report["benchmarks"]] == LEVELS
    # The folder holds the report as JSON and YAML: read once, and the YAML alone reads the
    # same rows.
    from kvpressure.ingestion.api import ingest

    by_json = ingest([out / "benchmarks.json"]).runs
    by_yaml = ingest([out / "benchmarks.yaml"]).runs
    for column in ("concurrency", "output_throughput", "ttft_p95_s", "itl_mean_s", "e2e_mean_s"):
        assert by_yaml[column].tolist() == pytest.approx(by_json[column].tolist()), column
    verdict = _report([out, scrape_log], tmp_path / "report", tmp_path / "report.log")
    print(f"\nguidellm: {verdict} (collect {collected}); profile {took:.0f} s")
    record = _record(tmp_path / "report")
    assert record["provenance"]["load_tool"] == "GuideLLM 0.8.1"
    assert record["counters"]["num_preemptions_total"] > 0, record["counters"]
    _agree(verdict, collected)


def _agree(tool: tuple, collect: tuple, status: bool = True) -> None:
    got, knee, _ = tool
    if status:
        assert got == collect[0], (tool, collect)
    assert knee is not None and collect[1] is not None, (tool, collect)
    assert abs(LEVELS.index(knee) - LEVELS.index(collect[1])) <= 1, (tool, collect)
