"""``kvpressure verify-remedy`` against real vLLM servers: a falling sweep, its twin, then a
remedy the twin predicts to raise throughput and a control, each measured in paired rounds on
servers started from one command line.

The setup preempts (``benchmarks/bench_twin.py``'s falling one, shorter): the e2e model with 64
blocks of 32 tokens, prompts of 256 +- 25% and 128 output tokens (a request ends holding 12
blocks, so the pool holds 5), prompts prefilled in chunks of 128 tokens, admission by the first
chunk and no prefix cache, so past 5 clients every preemption recomputes its whole context.
The remedy is the pool doubled (``--num-gpu-blocks-override 128``): 8 clients then run without
a preemption, all 8 at once; the measured change must have the twin's sign in every round and
lie within 10 points of its prediction where both are that fine, else inside the band the twin
claimed (or hold the prediction in its own interval). (``max_num_seqs`` lowered to 5, the benchmark's
+47% with 48 requests a level, changes these 16-request runs by a few percent, inside the
noise of a shared machine.) Raising ``max_num_seqs`` above the concurrency (64 to 128 at 8
clients) cannot act: its measured change must be no measurable effect (the interval holds 0).
The servers start with ``-O0`` (no compilation: no minute of compiling per setting); one
short sweep of 4 levels, two verifications of 3 rounds at one level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_server import SERVED_NAME, stop_group, tiny_model, vllm_python

from kvpressure.live.serve import Server, parse_serve_cmd
from prometheus_server import free_port

pytestmark = pytest.mark.e2e

LEVELS = "2,4,6,8"
AT = 8
LOAD = ["--input-len", "256", "--output-len", "128", "--range-ratio", "0.25",
        "--prompts-per-level", "16"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def _serve_cmd(python: Path, model: Path) -> str:
    return (f"{python.parent / 'vllm'} serve {model} --served-model-name {SERVED_NAME} "
            "--host 127.0.0.1 --dtype bfloat16 --num-gpu-blocks-override 64 --block-size 32 "
            "--max-model-len 1024 --max-num-seqs 64 --max-num-batched-tokens 128 "
            "--no-enable-prefix-caching --no-scheduler-reserve-full-isl -O0")


def _cli(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "kvpressure.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        stop_group(proc, grace_s=30)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# The largest change a restart of the same server made to a level's throughput on this machine
# (tests/data/twin_saved/README.md, the control), rounded up.
RESTART_NOISE_PCT = 10.0


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """The baseline server's sweep (collect --no-report; verify-remedy ingests it)."""
    python = vllm_python()
    model = tiny_model(python)
    cmd = _serve_cmd(python, model)
    work = tmp_path_factory.mktemp("verify")
    port = free_port()
    t0 = time.monotonic()
    server = Server([*parse_serve_cmd(cmd), "--port", str(port)], port, work / "sweep.log",
                    {**os.environ, **ENV})
    server.start()
    try:
        server.wait_ready(420.0)
        got = _cli(["collect", server.url, "--levels", LEVELS, "--out", str(work / "run"),
                    *LOAD, "--load-engine", "builtin", "--no-report", "--cooldown", "1",
                    "--warmup", "2", "--engine-args",
                    "{max_num_seqs: 64, max_num_batched_tokens: 128, "
                    "scheduler_reserve_full_isl: false, enable_prefix_caching: false}"], 300)
    finally:
        server.stop()
    assert got.returncode == 0, got.stderr[-3000:]
    return {"run": work / "run", "cmd": cmd, "work": work, "sweep_s": time.monotonic() - t0}


def _verify(sweep: dict, name: str, setting: str) -> tuple[dict, float]:
    t = time.monotonic()
    out = sweep["work"] / name
    got = _cli(["verify-remedy", str(sweep["run"]), "--serve-cmd", sweep["cmd"], "--set",
                setting, "--levels", str(AT), "--rounds", "3", "--port", str(free_port()),
                "--warmup", "2", "--cooldown", "1", "--bootstrap", "50", "--out", str(out)],
               600)
    assert got.returncode == 0, got.stderr[-3000:]
    doc = json.loads((out / "verify.json").read_text())
    assert (out / "verify.md").is_file()
    print(f"\n{name}: " + got.stderr.strip().splitlines()[-1], flush=True)
    return doc, time.monotonic() - t


def test_the_remedy_measures_the_predicted_change(sweep):
    doc, took = _verify(sweep, "remedy", "num_gpu_blocks=128")
    (row,) = doc["levels"]
    m, p = row["measured"], row["predicted"]
    print(f"remedy: measured {m['mean_pct']:+.1f}% ({m['interval_pct'][0]:+.1f} to "
          f"{m['interval_pct'][1]:+.1f}; rounds "
          + ", ".join(f"{x:+.1f}" for x in m["per_pair_pct"]) + f") vs predicted "
          f"{p['change_pct']:+.1f}%; preemptions {row['baseline']['preemptions']} -> "
          f"{row['remedy']['preemptions']}; sweep {sweep['sweep_s']:.0f} s, verify {took:.0f} s",
          flush=True)
    assert m["pairs"] == 3 and doc["rounds_done"] == 3 and doc["state"] == "complete"
    # the remedy server ran the command with that one flag changed
    assert doc["settings"]["remedy_cmd"][-2:] == ["--num-gpu-blocks-override", "128"]
    # the baseline preempts, the remedy does not: both read from each server's /metrics
    assert min(row["baseline"]["preemptions"]) > 10
    assert max(row["remedy"]["preemptions"]) == 0
    assert p["change_pct"] > 10 and p["effect"] == "raises"
    assert m["mean_pct"] > RESTART_NOISE_PCT  # beyond what a restart alone moves
    assert all(x > 0 for x in m["per_pair_pct"]), m["per_pair_pct"]
    # within 10 points where three rounds measure that finely and the twin claims as much (its
    # 90% band within 10 points: a twin fitted on 4 levels of 16 requests claims +-20 points
    # or more here, and its point has moved between +34 and +109% across runs); otherwise
    # the measured interval (a machine that moves between rounds: +78, +68, +52 on one CI run)
    # must hold the prediction, or the measured change lie inside the band the twin claimed
    lo, hi = m["interval_pct"]
    p_lo, p_hi = p["interval_pct"]
    if (hi - lo) / 2 < 10.0 and (p_hi - p_lo) / 2 < 10.0:
        assert abs(m["mean_pct"] - p["change_pct"]) <= 10.0, row["why"]
    else:
        assert lo <= p["change_pct"] <= hi or p_lo <= m["mean_pct"] <= p_hi, row["why"]
    assert row["held"] is True


# Two more servers and three more rounds (about 2 minutes): outside the CI budget, run with
# KVPRESSURE_E2E_CONTROL=1 (make e2e-control).
@pytest.mark.skipif(os.environ.get("KVPRESSURE_E2E_CONTROL") != "1",
                    reason="the control's rounds run with KVPRESSURE_E2E_CONTROL=1")
def test_a_control_that_cannot_act_measures_inside_its_noise(sweep):
    doc, took = _verify(sweep, "control", "max_num_seqs=128")
    (row,) = doc["levels"]
    m, p = row["measured"], row["predicted"]
    print(f"control: measured {m['mean_pct']:+.1f}% ({m['interval_pct'][0]:+.1f} to "
          f"{m['interval_pct'][1]:+.1f}) vs predicted {p['change_pct']:+.1f}%; verify "
          f"{took:.0f} s", flush=True)
    assert p["change_pct"] == pytest.approx(0.0, abs=0.5)
    # Two server processes differ by a few percent that paired rounds on the same two servers
    # cannot average out (a restart of the same server moved a level by -3.6% to +8.9% here:
    # tests/data/twin_saved/quiet, the control): inside that noise, far from the remedy's change.
    # Where the rounds scatter more than that (a machine that moves between rounds), the
    # interval is what the kit reads, and it must hold no change: no measurable effect.
    lo, hi = m["interval_pct"]
    if (hi - lo) / 2 < RESTART_NOISE_PCT:
        assert abs(m["mean_pct"]) <= RESTART_NOISE_PCT, m
    else:
        assert lo <= 0.0 <= hi and m["effect"] == "no measurable effect", m
