"""``kvpressure collect`` against a real vLLM server with a real Prometheus scraping it.

The server (vLLM 0.32.0's CPU build, ``scripts/vllm-env.sh``) serves a seeded random-weight
Llama (``scripts/build-tiny-model.py``) with a KV pool of 24 blocks of 32 tokens: a request of
128 prompt + 128 output tokens ends holding 8 blocks, so the pool holds 3 such requests and
throughput cannot grow much past concurrency 3 (from 4 clients on, one always waits). The sweep runs 1, 2, 4, 8, 16 clients. The checks
are structural (the machine's 2 cores are shared, so no absolute throughput is asserted):

* the report completes; the status at the focus level past the knee is "bound by KV blocks",
  at a level below the knee it is not;
* the preemptions and token totals in the run folder equal the server's own counters (read
  from /metrics by this test, apart from the kit) over the same windows;
* the knee lies where the measured throughput stops growing;
* the series read back through Prometheus equal those of the scrape log;
* killing the server mid-level keeps the levels before it and the scrape log, marks the level
  incomplete and the report names it (this one runs last: it stops the server).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from vllm_server import SERVED_NAME, VllmServer, serving, stop_group, vllm_python

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.counters import window_increase
from kvpressure.investigation.report import make_report
from kvpressure.live.server import metric_total
from prometheus_server import prometheus_server, require_prometheus

pytestmark = pytest.mark.e2e

POOL = {"num_gpu_blocks": 24, "block_size": 32, "max_model_len": 512, "max_num_seqs": 32,
        "max_num_batched_tokens": 512}
INPUT_LEN = OUTPUT_LEN = 128
REQUESTS_IN_POOL = POOL["num_gpu_blocks"] * POOL["block_size"] // (INPUT_LEN + OUTPUT_LEN)
LEVELS = [1, 2, 4, 8, 16]
COUNTERS = ("vllm:num_preemptions_total", "vllm:generation_tokens_total",
            "vllm:request_success_total")
ENGINE_ARGS = "{max_num_seqs: 32, max_num_batched_tokens: 512}"
KV_BOUND = "bound by KV blocks"


class Poller:
    """This test's own reads of the server's /metrics, every 0.2 s, apart from the kit."""

    NAMES = (*COUNTERS, "vllm:num_requests_running", "vllm:num_requests_waiting")

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, dict[str, float | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5, headers={"Accept": "text/plain; version=0.0.4"}) as http:
            while not self._stop.is_set():
                try:
                    text = http.get(self.url).text
                    t = time.time()  # after the answer: the values are at most this old
                    self.samples.append((t, {n: metric_total(text, n) for n in self.NAMES}))
                except httpx.HTTPError:
                    pass
                self._stop.wait(0.2)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def at(self, t: float, name: str) -> float:
        """The value read last at or before ``t``."""
        before = [v[name] for ts, v in self.samples if ts <= t and v[name] is not None]
        assert before, f"no direct read of {name} before {t}"
        return float(before[-1])


def run_cli(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``kvpressure ARGS`` in its own process group, stopped with all its children on a
    timeout."""
    proc = subprocess.Popen([sys.executable, "-m", "kvpressure.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        stop_group(proc, grace_s=10)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@dataclass
class Sweep:
    out: Path
    proc: subprocess.CompletedProcess
    poller: Poller
    levels: dict
    engine: dict

    @property
    def why(self) -> str:
        return f"exit {self.proc.returncode}\n{self.proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with serving(tmp_path_factory, POOL) as srv:
        yield srv


@pytest.fixture(scope="module")
def sweep(server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    binary = require_prometheus()
    out = tmp_path_factory.mktemp("collect") / "run"
    target = server.url.split("://", 1)[1]
    with Poller(server.url + "/metrics") as poller, prometheus_server(target, binary) as prom:
        proc = run_cli(["collect", server.url, "--levels", ",".join(map(str, LEVELS)),
                        "--out", str(out), "--input-len", str(INPUT_LEN),
                        "--output-len", str(OUTPUT_LEN), "--duration-per-level", "6",
                        "--cooldown", "1", "--warmup", "2", "--engine-args", ENGINE_ARGS,
                        "--prometheus", prom, "--load-engine", "builtin",
                        "--server-log", str(server.log)], timeout_s=480)
        time.sleep(0.5)  # one more direct read after the sweep
    sys.stderr.write(proc.stderr)
    levels = json.loads((out / "levels.json").read_text()) if (out / "levels.json").is_file() \
        else {}
    engine = json.loads((out / "engine.json").read_text()) if (out / "engine.json").is_file() \
        else {}
    return Sweep(out, proc, poller, levels, engine)


def _runs(sweep: Sweep) -> pd.DataFrame:
    runs = pd.read_csv(sweep.out / "report" / "runs.csv")
    return runs.sort_values("concurrency").reset_index(drop=True)


def _record(folder: Path) -> dict:
    return yaml.safe_load((folder / "record.yaml").read_text())


def _end_of_idle_after(sweep: Sweep, k: int) -> float:
    """A time when the server is idle after level ``k``: the end of the cool-down after it, or
    the last direct read after the sweep."""
    c = LEVELS[k]
    cool = [x for x in sweep.levels["cooldowns"] if x["after"] == f"c{c}"]
    return cool[0]["end"] if cool else sweep.poller.samples[-1][0]


def test_the_sweep_runs_every_level_and_the_report_completes(sweep: Sweep) -> None:
    assert sweep.proc.returncode == 0, sweep.why
    assert sweep.levels["state"] == "complete"
    assert [lv["status"] for lv in sweep.levels["levels"]] == ["complete"] * len(LEVELS)
    for name in ("index.html", "record.yaml", "runs.csv"):
        assert (sweep.out / "report" / name).stat().st_size > 0
    # Every number on the page of a real server's report is right or marked missing.
    from kvpressure.report.page_check import page_problems

    report = sweep.out / "report"
    page = (report / "index.html").read_text()
    assert page_problems(page, report) == []
    # The record names the vLLM that served the data, and the page says it differs from the
    # scheduler rules the kit follows.
    from kvpressure.record.io import load_record

    served = load_record(report / "record.yaml").provenance.vllm_version_served
    assert served is not None and served.startswith("0.32"), served
    # ... on the CPU: the server's log (collect --server-log) says; /version does not
    prov = load_record(report / "record.yaml").provenance
    assert prov.platform == "cpu", prov.platform
    assert prov.load_tool.startswith("kvpressure collect") and "(builtin client)" in prov.load_tool
    assert sweep.engine["server"]["device"] == "cpu"
    assert "The data comes from a vLLM 0.32" in page and "verify-vllm" in page
    assert sorted(p.name for p in (sweep.out / "bench").glob("c*.json")) == sorted(
        f"c{c}.json" for c in LEVELS)
    # The engine configuration came from the server where it exports it.
    args = sweep.engine["engine_args"]
    assert args == {**POOL, "enable_prefix_caching": True}
    assert sweep.engine["engine_args_from"]["num_gpu_blocks"] == "vllm:cache_config_info"
    assert sweep.engine["engine_args_from"]["max_num_seqs"] == "--engine-args"
    assert sweep.engine["server"]["model"] == SERVED_NAME
    # Every level is idle-bounded: a cool-down between levels, recorded as such.
    assert all(c["idle"] for c in sweep.levels["cooldowns"])
    curve = [(lv["concurrency"], round(lv["output_throughput"], 1))
             for lv in sweep.levels["levels"]]
    print(f"\nmeasured curve (output tok/s by concurrency): {curve}")


def test_preemptions_and_tokens_equal_the_servers_own_counters(sweep: Sweep) -> None:
    assert sweep.proc.returncode == 0, sweep.why
    runs = _runs(sweep)
    assert list(runs["concurrency"]) == LEVELS
    per_level = []
    for k, lv in enumerate(sweep.levels["levels"]):
        t0, t1 = lv["start"], _end_of_idle_after(sweep, k)
        direct = {n: sweep.poller.at(t1, n) - sweep.poller.at(t0, n) for n in COUNTERS}
        bench = json.loads((sweep.out / lv["result"]).read_text())
        row = runs.iloc[k]
        assert row["preemptions"] == direct["vllm:num_preemptions_total"], lv["concurrency"]
        assert bench["total_output_tokens"] == direct["vllm:generation_tokens_total"]
        assert bench["total_output_tokens"] == bench["completed"] * OUTPUT_LEN
        assert bench["completed"] == direct["vllm:request_success_total"]
        per_level.append((lv["concurrency"], int(row["preemptions"])))
    # Below the pool's capacity nothing is preempted; past it the scheduler preempts.
    preempted = dict(per_level)
    assert preempted[1] == preempted[2] == 0
    assert preempted[8] > 0 and preempted[16] > 0
    print(f"\npreemptions by concurrency: {per_level}")


def test_the_knee_lies_where_measured_throughput_stops_growing(sweep: Sweep) -> None:
    assert sweep.proc.returncode == 0, sweep.why
    runs = _runs(sweep)
    tput = dict(zip(runs["concurrency"].astype(int), runs["output_throughput"], strict=True))
    knee = _record(sweep.out / "report")["perf"]["knee"]
    k = int(knee["knee_x"])
    print(f"\nknee at {k}, peak at {knee['peak_x']}: {tput}")
    # Past the knee each added client gains little next to what one gained below it. Not a
    # bound on the total gain: a real closed loop leaves a slot empty while a client turns
    # around, which waiting requests hide at high levels, so a quiet machine's curve still
    # creeps up (measured 367 -> 480 tok/s from 2 to 16 clients, 160 tok/s from 1 to 2).
    first, last = LEVELS[0], LEVELS[-1]
    if k > first:
        slope_below = (tput[k] - tput[first]) / (k - first)
        slope_past = (max(tput[c] for c in LEVELS if c >= k) - tput[k]) / (last - k)
        assert slope_past <= 0.25 * slope_below, (slope_past, slope_below)
    # The knee is not late: it still grew over the level below (from 2 to 4 clients the pool
    # lets running grow only from 2 to 3, so that step is small by construction).
    below = [c for c in LEVELS if c < k]
    assert not below or tput[k] >= 1.05 * tput[below[-1]]
    # The pool holds REQUESTS_IN_POOL requests: the knee lies next to the first level that
    # preempts (the first past that number), at most one level past it. On a quiet machine
    # the clients' turnaround leaves slots the extra clients fill, so the curve may still
    # grow for one level after the pool is full (measured 286 -> 350 tok/s from 4 to 8).
    pre = dict(zip(runs["concurrency"].astype(int), runs["preemptions"], strict=True))
    first = LEVELS.index(min(c for c in LEVELS if pre[c] > 0))
    assert first == LEVELS.index(min(c for c in LEVELS if c > REQUESTS_IN_POOL)), pre
    assert k in LEVELS[max(first - 1, 0):first + 2], (k, pre)


def test_status_is_kv_bound_past_the_knee_and_not_below_it(sweep: Sweep,
                                                           tmp_path: Path) -> None:
    assert sweep.proc.returncode == 0, sweep.why
    record = _record(sweep.out / "report")
    focus = record["counters"]["window"]["concurrency"]
    knee = record["perf"]["knee"]["knee_x"]
    assert focus > knee
    assert record["status"] == KV_BOUND, (record["status"], record["evidence"])
    # below the pool's capacity: the largest level nothing was preempted at
    runs = _runs(sweep)
    below = max(int(c) for c, p in zip(runs["concurrency"], runs["preemptions"], strict=True)
                if p == 0 and c < knee)
    params = {"engine_args": sweep.engine["engine_args"], "model_name": SERVED_NAME,
              "focus_concurrency": below}
    make_report(tmp_path / "below", sources=[sweep.out / "bench",
                                             sweep.out / "metrics.prom.jsonl"], params=params)
    low = _record(tmp_path / "below")
    assert low["counters"]["window"]["concurrency"] == below
    assert low["status"] != KV_BOUND, (low["status"], low["evidence"])
    print(f"\nstatus at c={focus}: {record['status']}; at c={below}: {low['status']}")


def test_series_read_through_prometheus_equal_the_scrape_log(sweep: Sweep) -> None:
    assert sweep.proc.returncode == 0, sweep.why
    info = sweep.levels["prometheus"]
    assert "error" not in info, info
    prom = pd.read_csv(sweep.out / "prometheus" / "series.csv")
    log = ingest([sweep.out / "metrics.prom.jsonl"], run="log").series

    def value(frame: pd.DataFrame, name: str, t: float | None) -> float | None:
        part = frame[frame["metric"] == name]
        times = sorted(part["t"].unique())
        before = [x for x in times if t is None or x <= t]
        if not before:
            return None
        return float(part[part["t"] == before[-1]]["value"].sum())

    # Where the server is idle (each cool-down's end, the sweep's end) every reader agrees.
    # Prometheus' first scrape may come after the first cool-down: those instants are skipped,
    # but the sweep's end and the later cool-downs must be compared.
    idle = [c["end"] for c in sweep.levels["cooldowns"]] + [None]
    compared = 0
    for t in idle:
        for name in (*COUNTERS, "vllm:num_requests_running"):
            through_prom, from_log = value(prom, name, t), value(log, name, t)
            if through_prom is None:
                continue
            compared += 1
            assert through_prom == from_log, (name, t)
            if t is not None:
                assert from_log == sweep.poller.at(t, name), (name, t)
    assert compared >= 2 * len(COUNTERS) + 2, compared
    # Every family the analysis reads came through Prometheus under its canonical name.
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
            "vllm:inter_token_latency_seconds_bucket"} <= set(prom["metric"])


def test_vllm_bench_serve_as_the_load_engine_gives_results_the_same_reader_cuts(
    server: VllmServer, sweep: Sweep, tmp_path: Path
) -> None:
    vllm = vllm_python().parent / "vllm"
    out = tmp_path / "vllm_bench"
    with Poller(server.url + "/metrics") as poller:
        proc = run_cli(["collect", server.url, "--levels", "4", "--out", str(out),
                        "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
                        "--prompts-per-level", "8", "--cooldown", "1", "--warmup", "2",
                        "--load-engine", "vllm-bench", "--vllm", str(vllm), "--no-report"],
                       timeout_s=300)
        time.sleep(0.5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "levels.json").read_text())
    assert doc["load_engine"] == "vllm-bench"
    (lv,) = doc["levels"]
    result = json.loads((out / "bench" / "c4.json").read_text())
    # vLLM's own writer: its fields, plus the window the kit stamps from the file's time.
    assert result["backend"] == "vllm" and result["max_concurrency"] == 4
    assert result["completed"] == 8 and result["total_output_tokens"] == 8 * OUTPUT_LEN
    assert len(result["ttfts"]) == 8 and len(result["itls"]) == 8
    assert lv["start"] == result["kvpressure_window"]["start"]
    res = ingest([out / "bench", out / "metrics.prom.jsonl"], run="load_test")
    row = res.runs.iloc[0]
    direct = (poller.samples[-1][1]["vllm:generation_tokens_total"]
              - poller.at(lv["start"], "vllm:generation_tokens_total"))
    cut = window_increase(res.series, "vllm:generation_tokens_total", row["t_start"],
                          row["t_end"])
    assert cut == direct == result["total_output_tokens"]


def test_a_server_killed_mid_level_keeps_what_was_measured(server: VllmServer,
                                                           tmp_path: Path) -> None:
    """Runs last: it kills the server."""
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpressure.cli", "collect", server.url, "--levels", "4,16",
         "--out", str(out), "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
         "--duration-per-level", "10", "--cooldown", "1", "--warmup", "0",
         "--scrape-interval", "0.5", "--engine-args", ENGINE_ARGS, "--load-engine", "builtin"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        killed_at = None
        while time.monotonic() < deadline:
            levels_file = out / "levels.json"
            if levels_file.is_file():
                second = json.loads(levels_file.read_text())["levels"][1]
                if second["status"] == "running" and time.time() > second["start"] + 3:
                    os.killpg(server.proc.pid, signal.SIGKILL)
                    killed_at = time.time()
                    break
            time.sleep(0.2)
        assert killed_at is not None, "the second level never started"
        _, err = proc.communicate(timeout=240)
    finally:
        stop_group(proc, grace_s=10)
    assert proc.returncode == 5, err[-3000:]  # a level ended early
    doc = json.loads((out / "levels.json").read_text())
    first, second = doc["levels"]
    assert first["status"] == "complete"
    assert second["status"] == "incomplete" and "stopped answering" in second["reason"]
    assert json.loads((out / "bench" / "c16.json").read_text())["kvpressure_level"][
        "complete"] is False
    # The scrape log: every line whole, the scrapes before the kill kept, gaps after it.
    lines = [json.loads(x) for x in (out / "metrics.prom.jsonl").read_text().splitlines()]
    assert any("text" in x and x["t"] > second["start"] for x in lines)
    assert any("gap" in x and x["t"] >= killed_at for x in lines)
    # The report is made from the complete level and says which one is missing and why.
    runs = pd.read_csv(out / "report" / "runs.csv")
    assert list(runs["concurrency"]) == [4]
    collect = json.loads((out / "report" / "analysis" / "collect.json").read_text())
    assert [lv["concurrency"] for lv in collect["incomplete_levels"]] == [16]
    assert "stopped answering" in collect["incomplete_levels"][0]["reason"]
    page = (out / "report" / "index.html").read_text()
    assert "Level 16 was not measured in full" in page
