"""Wall time of the built-in experiments' sweeps (every variant and level).

    .venv/bin/python benchmarks/bench_sweep.py [--repeat 2] [--experiments seed_case ci_small]

For each experiment, runs ``run_sweep`` with 1 and with 2 worker processes into a temporary
folder and reports the best wall time of ``--repeat`` runs, the points, the simulated steps,
the time spent per point, and the bytes written (point folders and ``runs.csv``). Also times
the Prometheus recorder's share: the same points simulated without a recorder. The target:
the default sweep (``seed_case``) in a few seconds on 2 cores, so that ``make report`` stays
under about a minute. Results go to stdout and ``benchmarks/out/bench_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def bench(name: str, repeat: int) -> dict:
    from kvpressure.simulation.engine import simulate
    from kvpressure.simulation.experiment import load_experiment
    from kvpressure.sweeps.sweep import run_sweep

    exp = load_experiment(name)
    result: dict = {"experiment": name, "variants": list(exp.variants()), "levels": exp.levels}
    for jobs in (1, 2):
        best = float("inf")
        for _ in range(repeat):
            folder = Path(tempfile.mkdtemp(prefix=f"bench_sweep_{name}_"))
            try:
                start = time.perf_counter()
                runs = run_sweep(exp, folder, jobs=jobs)
                best = min(best, time.perf_counter() - start)
                size = _size(folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        result[f"wall_s_jobs{jobs}"] = round(best, 3)
        result["points"] = len(runs)
        result["steps"] = int(runs["steps"].sum())
        result["bytes_written"] = size
    # the recorder's share: simulate every point in this process with and without it
    for with_recorder in (True, False):
        start = time.perf_counter()
        for overrides in exp.variants().values():
            for level in exp.levels:
                point = exp.point(concurrency=int(level), overrides=overrides)
                simulate(point.scenario, cost_model=point.cost_model,
                         recorder=point.recorder if with_recorder else None)
        key = "simulate_s_with_recorder" if with_recorder else "simulate_s_without_recorder"
        result[key] = round(time.perf_counter() - start, 3)
    result["steps_per_second_jobs1"] = round(result["steps"] / result["wall_s_jobs1"])
    result["speedup_2_workers"] = round(result["wall_s_jobs1"] / result["wall_s_jobs2"], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--experiments", nargs="+", default=["seed_case", "ci_small"])
    args = parser.parse_args()
    results = [bench(name, args.repeat) for name in args.experiments]
    for r in results:
        print(f"{r['experiment']}: {r['points']} points, {r['steps']} steps; "
              f"1 worker {r['wall_s_jobs1']:.2f} s, 2 workers {r['wall_s_jobs2']:.2f} s "
              f"(x{r['speedup_2_workers']}); recorder share "
              f"{r['simulate_s_with_recorder'] - r['simulate_s_without_recorder']:.2f} s of "
              f"{r['simulate_s_with_recorder']:.2f} s; {r['bytes_written'] / 1e6:.1f} MB written")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_sweep.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
