"""A real vLLM server (PyPI's CPU build) on loopback for the end-to-end tests.

Every process started here is started in its own process group and stopped by that group's id
(SIGTERM, then SIGKILL), also when a test fails: vLLM's API server forks an engine core, and
neither may outlive the test.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvpressure.live.serve import stop_group

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO / "scripts" / "vllm-env.sh"
MODEL_SCRIPT = REPO / "scripts" / "build-tiny-model.py"
SERVED_NAME = "kvp-tiny"


def vllm_python() -> Path:
    """The vLLM environment's interpreter: ``$KVPRESSURE_VLLM_PYTHON`` (set by ``make e2e``),
    else whatever ``scripts/vllm-env.sh`` creates or finds."""
    given = os.environ.get("KVPRESSURE_VLLM_PYTHON")
    if given:
        return Path(given)
    env = subprocess.run([str(ENV_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(env.stdout.strip().splitlines()[-1]) / "bin" / "python"


def tiny_model(python: Path) -> Path:
    """The seeded model, built once next to the vLLM environment (a changed builder script
    gives a new folder)."""
    digest = hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    folder = python.parent.parent.parent / "models" / f"kvp-tiny-llama-{digest}"
    if not (folder / "kvpressure-model.json").is_file():
        subprocess.run([str(python), str(MODEL_SCRIPT), str(folder)], check=True,
                       capture_output=True, text=True)
    return folder


@dataclass
class VllmServer:
    proc: subprocess.Popen
    url: str
    log: Path
    args: dict[str, int]

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_vllm(python: Path, model: Path, port: int, log: Path, *, num_gpu_blocks: int,
               block_size: int, max_model_len: int, max_num_seqs: int,
               max_num_batched_tokens: int, ready_s: float = 420.0,
               extra_args: tuple[str, ...] = ()) -> VllmServer:
    """Start the server and wait for ``/v1/models``; stop it and raise when it does not come
    up (the log's tail in the message). ``extra_args`` go on the command line as they are."""
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--num-gpu-blocks-override", str(num_gpu_blocks),
        "--block-size", str(block_size), "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--max-num-batched-tokens", str(max_num_batched_tokens),
        # No compilation: it took about 25 s a start here (vLLM's compile cache fails to load
        # again on each start) and the scheduler's decisions, all these tests read, are the same.
        "-O0", *extra_args,
    ]
    out = open(log, "wb")  # noqa: SIM115 - the child holds it; closed with the process
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    out.close()
    server = VllmServer(proc, f"http://127.0.0.1:{port}", log, {
        "num_gpu_blocks": num_gpu_blocks, "block_size": block_size,
        "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens})
    deadline = time.monotonic() + ready_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                if httpx.get(server.url + "/v1/models", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready in {ready_s:g} s:\n{server.log_tail()}")
            time.sleep(1.0)
    except BaseException:
        stop_group(proc)
        raise


@contextlib.contextmanager
def serving(tmp_path_factory: Any, pool: dict[str, int], extra_args: tuple[str, ...] = ()
            ) -> Iterator[VllmServer]:
    """A test module's server: the cached vLLM environment and model, a log of its own, its
    process group stopped however the module ends."""
    from prometheus_server import free_port

    python = vllm_python()
    model = tiny_model(python)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    srv = start_vllm(python, model, free_port(), log, **pool, extra_args=extra_args)
    try:
        yield srv
    finally:
        stop_group(srv.proc)
