"""``kvpressure collect`` with the loads users run, against a real vLLM server: request-rate
levels (open loop, Poisson sends), a dataset file and a trace replay.

The server is the one of ``test_live_vllm.py`` (vLLM 0.32.0's CPU build, the seeded tiny Llama,
24 KV blocks of 32 tokens: three requests of 128 + 128 tokens fill it). On this machine it
drains about two such requests a second, so offered loads of 0.25 to 4 requests/s run from
well below saturation to well past it. The checks:

* the rate sweep's report reads its curve on the rate axis and finds a knee inside it; the
  server's own counters agree with each level's tokens;
* ``vllm bench serve`` as the load engine runs a rate level under a cap, with ``--bench-args``
  passed through;
* a dataset of token counts, a ShareGPT file and a Mooncake-style trace are sent with exactly
  their lengths (the
  server's ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total`` and
  ``vllm:request_success_total`` grow by the file's sums and count), the trace's requests at its
  times (within a tolerance).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from test_live_vllm import POOL, Poller, run_cli
from vllm_server import VllmServer, serving, vllm_python

from kvpressure.live.load import read_dataset, read_trace
from kvpressure.live.server import metric_total

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "data" / "rates"
RATES = [0.25, 0.5, 1, 2, 4]
INPUT_LEN = OUTPUT_LEN = 128
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:request_success_total")
ENGINE_ARGS = "{max_num_seqs: 32, max_num_batched_tokens: 512}"
# Client-side send stamps against the trace's times: the event loop and a shared 2-core
# machine may be late by this much, never early.
SEND_TOLERANCE_S = 0.25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # Its steps logged, as an open loop's twin is fitted on them.
    with serving(tmp_path_factory, POOL, ("--enable-logging-iteration-details",)) as srv:
        yield srv


def _served_exactly(before: dict[str, float], after: dict[str, float], requests: list) -> None:
    """The server counted exactly these requests' prompt and output tokens, and every one."""
    grew = {n: after[n] - before[n] for n in COUNTERS}
    assert grew["vllm:prompt_tokens_total"] == sum(r.input_len for r in requests)
    assert grew["vllm:generation_tokens_total"] == sum(r.output_len for r in requests)
    assert grew["vllm:request_success_total"] == len(requests)


def _totals(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5,
                     headers={"Accept": "text/plain; version=0.0.4"}).text
    return {n: float(metric_total(text, n) or 0.0) for n in COUNTERS}


def _settled(url: str) -> dict[str, float]:
    """The counters once the engine holds no request (its last step is then in /metrics)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        if not (metric_total(text, "vllm:num_requests_running") or 0) and not (
                metric_total(text, "vllm:num_requests_waiting") or 0):
            break
        time.sleep(0.2)
    time.sleep(0.5)
    return _totals(url)


def test_a_rate_sweep_gives_a_report_with_a_knee_on_the_rate_axis(
        server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "rates"
    with Poller(server.url + "/metrics") as poller:
        proc = run_cli(["collect", server.url, "--request-rate", ",".join(map(str, RATES)),
                        "--duration-per-level", "8", "--input-len", str(INPUT_LEN),
                        "--output-len", str(OUTPUT_LEN), "--out", str(out), "--cooldown", "1",
                        "--warmup", "2", "--engine-args", ENGINE_ARGS, "--load-engine",
                        "builtin", "--max-ttft", "0", "--server-log", str(server.log)],
                       timeout_s=420)
        time.sleep(0.5)
    sys.stderr.write(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    levels = json.loads((out / "levels.json").read_text())
    assert [lv["level"] for lv in levels["levels"]] == [f"r{r:g}" for r in RATES]
    assert sorted(p.name for p in (out / "bench").glob("*.json")) == sorted(
        f"r{r:g}.json" for r in RATES)
    cool = {c["after"]: c["end"] for c in levels["cooldowns"]}
    for lv in levels["levels"]:
        bench = json.loads((out / lv["result"]).read_text())
        assert bench["request_rate"] == lv["request_rate"] and bench["max_concurrency"] is None
        # Every request of the level, and its tokens, as the server counted them.
        t1 = cool.get(lv["level"], poller.samples[-1][0])
        gen = (poller.at(t1, "vllm:generation_tokens_total")
               - poller.at(lv["start"], "vllm:generation_tokens_total"))
        assert bench["total_output_tokens"] == gen == bench["completed"] * OUTPUT_LEN, lv
    record = yaml.safe_load((out / "report" / "record.yaml").read_text())
    w, perf = record["workload"], record["perf"]
    assert w["level_axis"] == "request_rate" and w["request_rates"] == [float(r) for r in RATES]
    assert perf["throughput_by_concurrency"] is None
    curve = {p["request_rate"]: p["output_throughput"] for p in perf["throughput_by_request_rate"]}
    print(f"\nmeasured curve (output tok/s by request rate): {curve}")
    # A knee on the rate axis: where throughput stops growing, or, on a machine quiet enough
    # that it still grows at the highest rate, where TTFT leaves the unloaded band (requests
    # queue: the server drains less than is offered).
    knee = perf["knee"]
    latency = json.loads((out / "report" / "analysis" / "knee.json").read_text())[
        "latency_knees"]["ttft_p95_s"]
    print(f"throughput knee {knee and knee['knee_x']}, TTFT knee {latency['knee_x']} (turns at "
          f"{latency['turn_x']})")
    if knee is not None and knee["knee_x"] is not None:
        assert knee["knee_x"] in curve and knee["knee_x"] < max(RATES)
    else:
        assert latency["knee_x"] in curve and latency["turn_x"] in curve, latency
        assert latency["knee_x"] < latency["turn_x"] <= max(RATES)
    # Past the knee the server drains less than is offered: 4 requests/s would be 512 tok/s.
    assert curve[max(RATES)] < 0.7 * max(RATES) * OUTPUT_LEN
    page = (out / "report" / "index.html").read_text()
    assert "request rate" in page and "req/s" in page
    # The server's log went to the report with the sweep: the twin of the open loop, keyed by
    # request rate, fitted on the server's own steps.
    twin = json.loads((out / "report" / "twin" / "twin.json").read_text())
    assert "refused" not in twin, twin.get("refused")
    rates = sorted(r["request_rate"] for r in twin["fit"]["levels"])
    assert rates == [float(r) for r in RATES]


def test_a_dataset_of_token_counts_is_sent_with_exactly_its_lengths(
        server: VllmServer, tmp_path: Path) -> None:
    path = DATA / "token_counts.jsonl"
    wanted = read_dataset(path, 1)
    before = _settled(server.url)
    proc = run_cli(["collect", server.url, "--dataset", str(path), "--levels", "2,4",
                    "--prompts-per-level", str(len(wanted) // 2), "--out",
                    str(tmp_path / "dataset"), "--warmup", "0", "--cooldown", "1",
                    "--load-engine", "builtin", "--no-report"], timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = _settled(server.url)
    _served_exactly(before, after, wanted)


def test_a_trace_is_replayed_at_its_times_with_its_lengths(
        server: VllmServer, tmp_path: Path) -> None:
    path = DATA / "mooncake_trace.jsonl"
    trace = read_trace(path)
    before = _settled(server.url)
    out = tmp_path / "trace"
    proc = run_cli(["collect", server.url, "--trace", str(path), "--out", str(out),
                    "--warmup", "0", "--load-engine", "builtin", "--no-report"], timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = _settled(server.url)
    _served_exactly(before, after, trace)
    bench = json.loads((out / "bench" / "trace.json").read_text())
    assert bench["input_lens"] == [r.input_len for r in trace]
    assert bench["output_lens"] == [r.output_len for r in trace]
    sent = [t - bench["start_times"][0] for t in bench["start_times"]]
    for at, want in zip(sent, (r.t_s for r in trace), strict=True):
        assert want - 0.01 <= at <= want + SEND_TOLERANCE_S, (at, want)


def test_a_sharegpt_dataset_is_tokenized_by_the_server_and_sent_as_its_lengths(
        server: VllmServer, tmp_path: Path) -> None:
    path = DATA / "sharegpt.json"
    chats = read_dataset(path, 1)

    def count(text: str, special: bool) -> int:
        resp = httpx.post(server.url + "/tokenize", timeout=30, json={
            "model": "kvp-tiny", "prompt": text, "add_special_tokens": special})
        return int(resp.json()["count"])

    prompts = [count(c.text, True) for c in chats]
    replies = [count(c.reply, False) for c in chats]
    before = _settled(server.url)
    out = tmp_path / "sharegpt"
    proc = run_cli(["collect", server.url, "--dataset", str(path), "--levels", "3",
                    "--prompts-per-level", str(len(chats)), "--out", str(out), "--warmup", "0",
                    "--load-engine", "builtin", "--no-report"], timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = _settled(server.url)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == sum(prompts)
    assert (after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
            == sum(replies))
    bench = json.loads((out / "bench" / "c3.json").read_text())
    assert sorted(bench["output_lens"]) == sorted(replies)


def test_vllm_bench_serve_runs_rate_levels_with_the_options_passed_through(
        server: VllmServer, tmp_path: Path) -> None:
    vllm = vllm_python().parent / "vllm"
    out = tmp_path / "vllm_bench_rates"
    before = _settled(server.url)
    # One level: vllm bench serve takes most of a minute to start on 2 shared cores.
    proc = run_cli(["collect", server.url, "--request-rate", "2", "--max-concurrency", "3",
                    "--prompts-per-level", "6", "--input-len", "64", "--output-len", "32",
                    "--out", str(out), "--warmup", "0", "--cooldown", "1",
                    "--load-engine", "vllm-bench", "--vllm", str(vllm),
                    "--bench-args", "--label kvp-rate-check", "--no-report"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = _settled(server.url)
    result = json.loads((out / "bench" / "r2.json").read_text())
    # vLLM's own writer, at the rate and the cap asked for, with the option passed through.
    assert result["request_rate"] == 2 and result["max_concurrency"] == 3
    assert result["label"] == "kvp-rate-check" and result["completed"] == 6
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] \
        == 6 * 32
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 6
