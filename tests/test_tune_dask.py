"""kvpressure tune on a real Dask cluster: a ``dask scheduler`` and two ``dask worker``
processes on loopback, started here on their own ports and stopped by process id. The cluster
gives the same bytes as the serial run, and survives a worker killed mid-run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpressure.paths import data_dir
from kvpressure.tune.api import run_tune

distributed = pytest.importorskip("distributed")

CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"
BIN = Path(sys.executable).parent
LIMITS = "ttft_p95=10s,itl_p95=150ms"
CONFIGS = [{"max_num_seqs": n} for n in (4, 8, 12, 16, 20, 24)] + [
    {"tensor_parallel_size": 3}, {"scheduler_reserve_full_isl": True}]
OUTPUTS = ("tune.csv", "levels.csv", "invalid.csv", "pareto.csv", "recommendation.json",
           "tune.md")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    from kvpressure.pipeline.workers import die_with_parent

    die_with_parent()


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen] = []
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        env = {**os.environ, "MPLBACKEND": "Agg", "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
        proc = subprocess.Popen([str(BIN / "dask"), *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=open(self.folder / log, "wb"), stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
        self.procs.append(proc)
        return proc

    def start(self, workers: int = 2) -> None:
        self._start(["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                     "--no-dashboard"], "scheduler.log")
        self.workers = [self._start(
            ["worker", self.address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--name", f"w{i}", "--death-timeout", "60"], f"worker{i}.log")
            for i in range(workers)]
        with distributed.Client(self.address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture
def cluster(tmp_path, request):
    c = Cluster(tmp_path)
    request.addfinalizer(c.stop)
    c.start()
    return c


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    run_tune(str(CI_SMALL), out, configs=CONFIGS, limits=LIMITS)
    return {name: (out / name).read_bytes() for name in OUTPUTS}


def _outputs(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in OUTPUTS}


@pytest.mark.slow
def test_dask_cluster_gives_the_serial_bytes_and_survives_a_killed_worker(cluster, serial,
                                                                          tmp_path):
    out = tmp_path / "dask"
    got = run_tune(str(CI_SMALL), out, configs=CONFIGS, limits=LIMITS,
                   executor=f"dask://127.0.0.1:{cluster.port}", batch=2)
    assert "Dask cluster" in got.executor and got.simulated == len(CONFIGS) + 1
    assert _outputs(out) == serial

    # Again into a new folder, one configuration a task; after the first result, kill a
    # worker that is running a task. Dask reruns its tasks on the other worker.
    killed: dict[str, object] = {}

    def kill_a_busy_worker(done: int) -> None:
        if killed:
            return
        with distributed.Client(cluster.address, timeout="30s") as client:
            pids = client.run(os.getpid)
            busy = [a for a, keys in client.processing().items() if keys]
            ours = {p.pid: p for p in cluster.workers}
            for addr in busy:
                pid = pids.get(addr)
                if pid in ours:
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"], killed["tasks"] = pid, len(client.processing()[addr])
                    return

    out2 = tmp_path / "dask-killed"
    got = run_tune(str(CI_SMALL), out2, configs=CONFIGS, limits=LIMITS,
                   executor=f"dask://127.0.0.1:{cluster.port}", batch=1,
                   on_batch=kill_a_busy_worker)
    assert killed and killed["tasks"] >= 1, "no worker was busy to kill"
    victim = next(p for p in cluster.workers if p.pid == killed["pid"])
    victim.wait(30)
    assert victim.returncode == -signal.SIGKILL
    assert got.simulated == len(CONFIGS) + 1
    assert _outputs(out2) == serial
    with distributed.Client(cluster.address, timeout="30s") as client:
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(client.scheduler_info()["workers"]) == 1
