"""kvpressure tune on a real Dask cluster: a ``dask scheduler`` and two ``dask worker``
processes on loopback, started here on their own ports and stopped by process id. The cluster
gives the same bytes as the serial run, and survives a worker killed mid-run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kvpressure.paths import data_dir
from kvpressure.tune.api import run_tune

distributed = pytest.importorskip("distributed")

from kvpressure.tune.loopback_cluster import LoopbackCluster  # noqa: E402

CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"
LIMITS = "ttft_p95=10s,itl_p95=150ms"
CONFIGS = [{"max_num_seqs": n} for n in (4, 8, 12, 16, 20, 24)] + [
    {"tensor_parallel_size": 3}, {"scheduler_reserve_full_isl": True}]
OUTPUTS = ("tune.csv", "levels.csv", "invalid.csv", "pareto.csv", "recommendation.json",
           "tune.md")


@pytest.fixture
def cluster(tmp_path, request):
    c = LoopbackCluster(workers=2, log_dir=tmp_path / "logs")
    request.addfinalizer(c.stop)  # by process id, whatever the test did
    return c.start()


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    run_tune(str(CI_SMALL), out, configs=CONFIGS, limits=LIMITS)
    return _outputs(out)


def _outputs(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in OUTPUTS}


@pytest.mark.slow
def test_dask_cluster_gives_the_serial_bytes_and_survives_a_killed_worker(cluster, serial,
                                                                          tmp_path):
    out = tmp_path / "dask"
    got = run_tune(str(CI_SMALL), out, configs=CONFIGS, limits=LIMITS,
                   executor=cluster.executor, batch=2)
    assert "Dask cluster" in got.executor and got.simulated == len(CONFIGS) + 1
    assert _outputs(out) == serial

    # Again into a new folder, one configuration a task; after the first result, kill a
    # worker that is running a task. Dask reruns its tasks on the other worker.
    killed: dict[str, int] = {}

    def kill_a_busy_worker(done: int) -> None:
        if killed:
            return
        pids = cluster.worker_pids()
        with distributed.Client(cluster.address, timeout="30s") as client:
            for addr, keys in client.processing().items():
                if keys and addr in pids:
                    os.kill(pids[addr], signal.SIGKILL)
                    killed["pid"], killed["tasks"] = pids[addr], len(keys)
                    return

    out2 = tmp_path / "dask-killed"
    got = run_tune(str(CI_SMALL), out2, configs=CONFIGS, limits=LIMITS,
                   executor=cluster.executor, batch=1, on_batch=kill_a_busy_worker)
    assert killed and killed["tasks"] >= 1, "no worker was busy to kill"
    victim = next(p for p in cluster.workers if p.pid == killed["pid"])
    assert victim.wait(30) == -signal.SIGKILL
    assert got.simulated == len(CONFIGS) + 1
    assert _outputs(out2) == serial
    with distributed.Client(cluster.address, timeout="30s") as client:
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(client.scheduler_info()["workers"]) == 1


def test_unreachable_scheduler_is_an_input_error(tmp_path):
    from kvpressure.errors import InputError
    from kvpressure.tune.loopback_cluster import free_port

    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        run_tune(str(CI_SMALL), tmp_path, configs=[{"max_num_seqs": 8}],
                 executor=f"dask://127.0.0.1:{free_port()}", connect_timeout_s=2)
