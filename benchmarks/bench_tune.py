"""kvpressure tune: a 1,000-configuration grid on the seed case's workload, serially, on 2
local worker processes and on a Dask cluster of 2 workers (a real scheduler and worker
processes on loopback).

    .venv/bin/python benchmarks/bench_tune.py [--sample 40] [--all]

The grid: max_num_seqs (10 values) x max_num_batched_tokens (5) x gpu_memory_utilization (5)
x scheduler_reserve_full_isl (2) x watermark (2) = 1,000 configurations, each simulated at the
seed case's 8 concurrency levels. A seed-case configuration costs seconds, so by default a
fixed spread of ``--sample`` of them (every k-th of the 1,000) is measured and the 1,000 is
extrapolated from the per-configuration cost; ``--all`` runs the whole grid. The three runs
must write the same tables byte for byte. Also measured: the Dask round trip per task (empty
tasks), the size of a configuration's streamed record, and the driver's ranking and writing
time, from which the cost of 100,000 configurations on a cluster is projected. ``uptime`` is
recorded before and after: the machine may be shared. Results: stdout and
``benchmarks/out/bench_tune.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
GRID = {
    "max_num_seqs": [16, 24, 32, 40, 48, 64, 96, 128, 192, 256],
    "max_num_batched_tokens": [256, 512, 1024, 2048, 4096],
    "gpu_memory_utilization": [0.85, 0.88, 0.9, 0.92, 0.95],
    "scheduler_reserve_full_isl": [False, True],
    "watermark": [0.0, 0.05],
}
LIMITS = "ttft_p95=60s,itl_p95=150ms"
TABLES = ("tune.csv", "levels.csv", "invalid.csv", "pareto.csv", "recommendation.json")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _proc_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of live processes (``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _cpu_s(kind: str, cluster_pids: list[int]) -> float:
    """CPU seconds spent so far by whatever runs the configurations: this process (serial),
    its finished children (the process pool is joined when the run ends), or the Dask
    workers."""
    import resource

    if kind == "serial":
        t = os.times()
        return t.user + t.system
    if kind == "processes_2":
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    return _proc_cpu_s(cluster_pids)


def _noop(x: int) -> int:
    return x


def dask_round_trip(executor: str, n: int = 200) -> float:
    """Seconds per empty task through the scheduler, with the window tune keeps."""
    from concurrent.futures import wait

    from kvpressure.tune.executors import open_executor

    with open_executor(executor) as opened:
        wait([opened.executor.submit(_noop, i) for i in range(10)])
        start = time.perf_counter()
        wait([opened.executor.submit(_noop, i) for i in range(n)])
        return (time.perf_counter() - start) / n


def driver_cost(results: Path, copies: int = 20_000) -> float:
    """Seconds the driver spends per configuration reading the stream back and ranking
    (tables and Pareto front), on ``copies`` records made from the measured ones."""
    from kvpressure.tune.ranking import levels_frame, pareto_front, rank
    from kvpressure.tune.results import ResultStore

    lines = results.read_text().splitlines()
    big = results.parent / "big"
    big.mkdir()
    with open(big / results.name, "w") as fh:
        for i in range(copies):
            rec = json.loads(lines[i % len(lines)])
            rec["id"] = f"{rec['id']}#{i}"
            fh.write(json.dumps(rec) + "\n")
    identity = json.loads(lines[0])["identity"]
    start = time.perf_counter()
    records = list(ResultStore(big, identity).load().values())
    names = sorted({k for r in records for k in r["config"]})
    rank(records, names, {"ttft_p95_s": 60.0, "itl_p95_s": 0.15}, {})
    pareto_front(levels_frame(records, "concurrency", {}), "ttft_p95_s")
    return round((time.perf_counter() - start) / copies, 6)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args()
    from kvpressure.tune.api import run_tune
    from kvpressure.tune.grid import expand
    from kvpressure.tune.loopback_cluster import LoopbackCluster
    from kvpressure.tune.targets import load_target

    grid = expand(GRID)
    assert len(grid) == 1000
    step = 1 if args.all else max(1, len(grid) // args.sample)
    configs = grid[::step][: (len(grid) if args.all else args.sample)]
    n = len(configs) + 1  # the baseline runs too
    target = load_target("seed_case")
    report: dict = {"grid_configurations": len(grid), "measured_configurations": n,
                    "levels_per_configuration": len(target.levels),
                    "cpu_count": os.cpu_count(), "uptime_before": _uptime(), "runs": {}}
    print(f"{n} configurations (every {step}th of {len(grid)}, plus the baseline) at "
          f"{len(target.levels)} levels; {report['uptime_before']}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tune_"))
    tables = {}
    try:
        with LoopbackCluster(workers=2, log_dir=tmp / "dask-logs") as cluster:
            report["dask_round_trip_ms"] = round(1000 * dask_round_trip(cluster.executor), 3)
            for name, executor in (("serial", "local"), ("processes_2", "processes:2"),
                                   ("dask_2_workers", cluster.executor)):
                out = tmp / name
                pids = [w.pid for w in cluster.workers]
                cpu0 = _cpu_s(name, pids)
                start = time.perf_counter()
                result = run_tune(target, out, configs=configs, limits=LIMITS,
                                  executor=executor)
                wall = time.perf_counter() - start
                cpu = _cpu_s(name, pids) - cpu0
                tables[name] = {t: (out / t).read_bytes() for t in TABLES}
                report["runs"][name] = {
                    "wall_s": round(wall, 2), "simulate_s": round(result.timings["simulate_s"], 2),
                    "rank_and_write_s": round(result.timings["write_s"], 2),
                    "per_configuration_s": round(result.timings["simulate_s"] / n, 3),
                    # Work done where the simulations ran, and the cores it got on average:
                    # on a shared machine the wall time follows the share, not the code.
                    "cpu_s": round(cpu, 2), "cpu_s_per_configuration": round(cpu / n, 3),
                    "cores_obtained": round(cpu / result.timings["simulate_s"], 2)}
                print(f"{name}: {wall:.1f} s ({result.timings['simulate_s'] / n:.2f} s a "
                      f"configuration; {cpu / n:.2f} CPU s a configuration, "
                      f"{cpu / result.timings['simulate_s']:.2f} cores obtained)", flush=True)
                if name == "serial":
                    report["record_bytes"] = round((out / "results.jsonl").stat().st_size / n)
                    report["recommendation"] = result.recommendation["text"]
                    report["driver_s_per_configuration"] = driver_cost(out / "results.jsonl")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["uptime_after"] = _uptime()
    report["same_bytes_on_every_executor"] = all(t == tables["serial"] for t in tables.values())
    runs = report["runs"]
    serial = runs["serial"]["simulate_s"]
    report["scaling_processes_1_to_2"] = round(serial / runs["processes_2"]["simulate_s"], 2)
    report["scaling_dask_1_to_2"] = round(serial / runs["dask_2_workers"]["simulate_s"], 2)
    per = serial / n
    # What the scaling would be with the cores the runs asked for: CPU time per configuration
    # serially over the wall time per configuration of 2 workers each given a whole core.
    for name in ("processes_2", "dask_2_workers"):
        report[f"cpu_efficiency_{name}"] = round(
            runs["serial"]["cpu_s_per_configuration"] / runs[name]["cpu_s_per_configuration"], 2)
    report["per_configuration_s"] = round(per, 3)
    report["extrapolated_1000_s"] = {
        "serial": round(1000 * per), "processes_2": round(1000 * per /
                                                          report["scaling_processes_1_to_2"]),
        "dask_2_workers": round(1000 * per / report["scaling_dask_1_to_2"])}
    # 100,000 configurations on W worker cores: the simulations divide by W (each is
    # independent); the scheduler adds one round trip per task of 16 configurations; the
    # driver streams every record and ranks them once.
    # Priced in CPU seconds per configuration (what a worker with a whole core spends), not
    # in this shared machine's wall time.
    rt = report["dask_round_trip_ms"] / 1000
    rank_per = report["driver_s_per_configuration"]
    cpu_per = runs["serial"]["cpu_s_per_configuration"]
    proj = {}
    for w in (2, 64, 256):
        proj[f"{w}_worker_cores_h"] = round((100_000 * cpu_per / w + 100_000 / 16 * rt
                                             + 100_000 * rank_per) / 3600, 2)
    proj["core_hours"] = round(100_000 * cpu_per / 3600, 1)
    proj["results_jsonl_mb"] = round(100_000 * report["record_bytes"] / 1e6)
    proj["driver_rank_and_write_s"] = round(100_000 * rank_per)
    report["projected_100000"] = proj
    print(json.dumps(report, indent=2))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_tune.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["same_bytes_on_every_executor"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
