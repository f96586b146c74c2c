"""``vllm bench serve`` as the load engine of one level, when it is installed.

It runs as a child process in its own process group (a level timeout or Ctrl-C ends all of it)
with vLLM's random dataset at the same lengths, ``--ignore-eos``, a closed loop
(``--max-concurrency``, ``--request-rate inf``) and ``--save-detailed``. Its result file is
kept as written, plus the two fields :mod:`kvpressure.live.results` adds: whether the level
completed, and the window, from the child's start to its exit. The server is idle before and
after the child's own load (the runner cools down first; no warm-up or ready-check requests
are sent), so the counters cut at that window are exactly the level's; vLLM's whole-second
``date`` stamped after its statistics cannot place the load that closely.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.live.results import LEVEL, WINDOW


def find_vllm(command: str | None = None) -> str | None:
    """The ``vllm`` executable: ``command`` when given (it must exist), else on PATH."""
    if command:
        path = shutil.which(command)
        if path is None:
            raise InputError(f"--vllm {command!r}: no such executable")
        return path
    return shutil.which("vllm")


@dataclass
class BenchRun:
    result: dict[str, Any] | None
    reason: str | None  # why there is no complete result
    log: Path


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def run_level(
    vllm: str,
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    concurrency: int | None,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    work_dir: Path,
    timeout_s: float,
    cancel: threading.Event | None = None,
    request_rate: float | None = None,
    burstiness: float | None = None,
    extra_args: list[str] | None = None,
    name: str | None = None,
) -> BenchRun:
    """One level with ``vllm bench serve``; never raises for the child's failures.

    A closed loop of ``concurrency`` clients (``--request-rate inf``), or requests at
    ``request_rate`` (``--burstiness``; None: vLLM's evenly spaced sends are not asked for, its
    default shape 1 is Poisson), capped at ``concurrency`` when given. ``extra_args`` go to
    ``vllm bench serve`` as they are, after the kit's own (a later option wins there)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    level = name or f"c{concurrency}"
    name = f"vllm-bench-{level}.json"
    log = work_dir / f"vllm-bench-{level}.log"
    load = ["--request-rate", "inf" if request_rate is None else f"{request_rate:g}"]
    if concurrency is not None:
        load = ["--max-concurrency", str(concurrency), *load]
    if request_rate is not None and burstiness is not None:
        load += ["--burstiness", f"{burstiness:g}"]
    cmd = [
        vllm, "bench", "serve", "--backend", "vllm", "--base-url", base_url,
        "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--random-range-ratio", str(range_ratio),
        "--ignore-eos", "--temperature", "0", "--num-prompts", str(num_prompts),
        *load, "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
        "--num-warmups", "0", "--ready-check-timeout-sec", "0",
        "--save-result", "--save-detailed", "--result-dir", str(work_dir),
        "--result-filename", name, "--disable-tqdm", *(extra_args or []),
    ]
    launched = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if cancel is not None and cancel.is_set():
                    _stop_group(proc)
                    return BenchRun(None, "interrupted (Ctrl-C)", log)
                if time.monotonic() > deadline:
                    _stop_group(proc)
                    return BenchRun(None, f"level timeout ({timeout_s:g} s)", log)
        except BaseException:
            _stop_group(proc)
            raise
    exited = time.time()
    path = work_dir / name
    if code != 0 or not path.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return BenchRun(None, f"vllm bench serve exited with {code}: {tail[0][:200]}", log)
    result = json.loads(path.read_text(encoding="utf-8"))
    result[WINDOW] = {"start": launched, "end": exited}
    result[LEVEL] = {"complete": True, "reason": None}
    path.unlink()
    return BenchRun(result, None, log)
