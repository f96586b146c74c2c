"""A Dask cluster on this machine: ``dask scheduler`` and ``dask worker`` processes on
loopback, each on its own free port, stopped by process id. For trying ``--executor dask://``
without a cluster, and for the tests and the benchmark that must go through the real
scheduler and real worker processes (not an in-process cluster).

```python
with LoopbackCluster(workers=2, log_dir=tmp) as cluster:
    run_tune(..., executor=cluster.executor)
```
Workers run without a nanny, so one killed by its pid stays dead (the scheduler reruns its
tasks elsewhere). Every process dies with the one that started it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    from kvpressure.workers import die_with_parent

    die_with_parent()


class LoopbackCluster:
    def __init__(self, workers: int = 2, threads_per_worker: int = 1,
                 log_dir: str | os.PathLike[str] | None = None, timeout_s: float = 120.0
                 ) -> None:
        self.n_workers = workers
        self.threads = threads_per_worker
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvpressure-dask-"))
        self.timeout_s = timeout_s
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def executor(self) -> str:
        return f"dask://127.0.0.1:{self.port}"

    def _dask(self, args: list[str], log: str) -> subprocess.Popen:
        exe = Path(sys.executable).parent / "dask"
        cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "distributed.cli.dask"]
        env = {**os.environ, "MPLBACKEND": "Agg"}
        with open(self.log_dir / log, "wb") as fh:
            return subprocess.Popen([*cmd, *args], env=env, stdin=subprocess.DEVNULL,
                                    stdout=fh, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)

    def start(self) -> LoopbackCluster:
        try:
            from distributed import Client
        except ImportError:
            raise InputError("a Dask cluster needs pip install 'kvpressure[dask]'") from None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.scheduler = self._dask(["scheduler", "--host", "127.0.0.1", "--port",
                                     str(self.port), "--no-dashboard"], "scheduler.log")
        for i in range(self.n_workers):
            self.workers.append(self._dask(
                ["worker", self.address, "--host", "127.0.0.1", "--nthreads",
                 str(self.threads), "--no-nanny", "--no-dashboard", "--name", f"w{i}",
                 "--death-timeout", "60"], f"worker{i}.log"))
        with Client(self.address, timeout=f"{self.timeout_s}s", set_as_default=False) as c:
            c.wait_for_workers(self.n_workers, timeout=self.timeout_s)
        return self

    def worker_pids(self) -> dict[str, int]:
        """``{worker address: pid}`` of the workers this cluster started and still alive."""
        from distributed import Client

        ours = {p.pid for p in self.workers if p.poll() is None}
        with Client(self.address, timeout="30s", set_as_default=False) as c:
            return {a: pid for a, pid in c.run(os.getpid).items() if pid in ours}

    def stop(self) -> None:
        procs = [*self.workers, *([self.scheduler] if self.scheduler else [])]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def __enter__(self) -> LoopbackCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()
