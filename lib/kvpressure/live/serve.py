"""The user's own ``vllm serve`` command line: read, changed one setting at a time, started and
stopped.

A remedy is an engine setting in vLLM's engine-argument name (``max_num_seqs``); on the
command line it is that argument's flag (``--max-num-seqs``), a few under another name
(``num_gpu_blocks`` is ``--num-gpu-blocks-override``), the booleans as ``--flag`` /
``--no-flag``. A setting with no flag (the simulation's own knobs) cannot be served: refused,
named. Changing a setting removes every form of its flag from the command and appends the new
one, so the remedy server runs the user's command with exactly that difference.

A server runs in a session of its own and is stopped by that group's id (SIGTERM, then
SIGKILL): vLLM's API server forks an engine core, and neither may outlive the run. It is ready
when ``/health`` and ``/v1/models`` answer; one that exits first is reported with its log's
tail.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvpressure.errors import InputError, nearest

# engine setting -> (flag, kind): kind "int", "float", "str" or "bool" (--flag / --no-flag)
FLAGS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("--max-num-seqs", "int"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "int"),
    "num_gpu_blocks": ("--num-gpu-blocks-override", "int"),
    "block_size": ("--block-size", "int"),
    "max_model_len": ("--max-model-len", "int"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", "float"),
    "long_prefill_token_threshold": ("--long-prefill-token-threshold", "int"),
    "policy": ("--scheduling-policy", "str"),
    "enable_prefix_caching": ("--enable-prefix-caching", "bool"),
    "enable_chunked_prefill": ("--enable-chunked-prefill", "bool"),
    "scheduler_reserve_full_isl": ("--scheduler-reserve-full-isl", "bool"),
    "async_scheduling": ("--async-scheduling", "bool"),
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def flag_for(key: str) -> tuple[str, str]:
    """The flag and kind of an engine setting; InputError naming a setting with none."""
    if key not in FLAGS:
        from kvpressure.simulation.experiment import ENGINE_ARGS

        guess = nearest(key, FLAGS)
        if key in ENGINE_ARGS or key in ("watermark", "max_num_active_seqs"):
            raise InputError(f"--set {key}: no vLLM command-line flag sets it, so no server can "
                             f"be started with it changed; settings with a flag: "
                             f"{', '.join(sorted(FLAGS))}")
        raise InputError(f"--set {key}: not an engine setting with a vLLM flag"
                         + (f"; did you mean {guess!r}?" if guess else
                            f"; known: {', '.join(sorted(FLAGS))}"))
    return FLAGS[key]


def typed_value(key: str, text: Any) -> Any:
    """A ``--set`` value as its setting's type; InputError naming the setting otherwise."""
    _, kind = flag_for(key)
    raw = str(text).strip()
    try:
        if kind == "bool":
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError
        if kind == "int":
            value = int(raw)
            if value < 1:
                raise ValueError
            return value
        if kind == "float":
            return float(raw)
    except ValueError:
        want = {"bool": "true or false", "int": "a whole number >= 1", "float": "a number"}[kind]
        raise InputError(f"--set {key}={text}: give {want}") from None
    return raw


def parse_serve_cmd(text: str) -> list[str]:
    """The command line as arguments; InputError when it is empty or unparsable."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise InputError(f"--serve-cmd {text!r}: cannot split it into arguments ({exc})") from None
    if not argv:
        raise InputError("--serve-cmd: give the command that starts the server, e.g. "
                         "\"vllm serve MODEL --max-num-seqs 64\"")
    return argv


def _drop(argv: Sequence[str], flag: str, boolean: bool) -> list[str]:
    """``argv`` without any form of ``flag`` (``--f v``, ``--f=v``; booleans also ``--no-f``;
    vLLM accepts underscores in flags too)."""
    names = {flag, flag.replace("-", "_").replace("__", "--", 1)}
    if boolean:
        names |= {"--no-" + flag[2:], "--no_" + flag[2:].replace("-", "_")}
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        head = arg.split("=", 1)[0]
        if head in names:
            # A value-taking flag written apart from its value takes the next argument along.
            skip = not boolean and "=" not in arg
            continue
        out.append(arg)
    return out


def with_setting(argv: Sequence[str], key: str, value: Any) -> list[str]:
    """The command with ``key`` set to ``value`` (and nothing else changed)."""
    flag, kind = flag_for(key)
    out = _drop(argv, flag, kind == "bool")
    if kind == "bool":
        return [*out, flag if value else "--no-" + flag[2:]]
    return [*out, flag, str(value)]


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """The command listening on ``port``."""
    return [*_drop(argv, "--port", False), "--port", str(port)]


def settings_in(argv: Sequence[str]) -> dict[str, Any]:
    """The engine settings the command line gives explicitly (the last form of a flag wins)."""
    found: dict[str, Any] = {}
    for key, (flag, kind) in FLAGS.items():
        for i, arg in enumerate(argv):
            head, eq, tail = arg.partition("=")
            head = head.replace("_", "-")
            if kind == "bool" and head in (flag, "--no-" + flag[2:]) and not eq:
                found[key] = head == flag
            elif kind != "bool" and head == flag:
                raw = tail if eq else (argv[i + 1] if i + 1 < len(argv) else None)
                if raw is not None:
                    try:
                        found[key] = typed_value(key, raw)
                    except InputError:
                        pass
    return found


def host_in(argv: Sequence[str]) -> str:
    """Where to reach the server from here: its ``--host`` unless that is every interface."""
    for i, arg in enumerate(argv):
        head, eq, tail = arg.partition("=")
        if head == "--host":
            host = tail if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return "127.0.0.1"


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) != 0


@dataclass
class Server:
    """One server process started from a command line, stopped by its process group's id."""

    argv: list[str]
    port: int
    log: Path
    env: Mapping[str, str] | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started_at: float | None = None
    runs: int = 0  # load runs since the start

    @property
    def url(self) -> str:
        return f"http://{host_in(self.argv)}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if not port_free(host_in(self.argv), self.port):
            # Another server there would answer the health check in this one's place.
            raise InputError(f"port {self.port} is in use: give --port with a free one (the "
                             "remedy server of --mode ports takes the next port too)")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL,
                                         env=dict(self.env) if self.env is not None else None,
                                         start_new_session=True)
        except OSError as exc:
            raise InputError(f"--serve-cmd: cannot start {self.argv[0]!r}: "
                             f"{exc.strerror or exc}") from None
        finally:
            fh.close()
        self.started_at = time.monotonic()
        self.runs = 0

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` and ``/v1/models`` answer; RuntimeError when the process
        exits first or nothing answers in ``timeout_s``."""
        assert self.proc is not None and self.started_at is not None
        deadline = self.started_at + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server on port {self.port} exited with "
                                   f"{self.proc.returncode} before it was ready; its log "
                                   f"({self.log}) ends:\n{self.tail()}")
            try:
                health = httpx.get(self.url + "/health", timeout=2.0)
                models = httpx.get(self.url + "/v1/models", timeout=2.0)
                if health.status_code == 200 and models.status_code == 200:
                    return time.monotonic() - self.started_at
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(f"the server on port {self.port} did not answer /health "
                                   f"within {timeout_s:g} s; its log ({self.log}) ends:\n"
                                   f"{self.tail()}")
            time.sleep(1.0)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the group, SIGKILL to what is left after ``grace_s``."""
        if self.proc is not None:
            stop_group(self.proc, grace_s)
        self.proc = None


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop the process group ``proc`` leads (a server started in a session of its own):
    SIGTERM, then SIGKILL to what is left after ``grace_s``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine core, if it outlived its parent
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


class ServerFailed(RuntimeError):
    """A server that did not come up or went away."""
