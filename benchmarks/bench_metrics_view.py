"""What the Prometheus view (``metrics.prom.jsonl``) costs on top of the simulation.

Busy runs: the heavy reference workload, the large closed loop of ``bench_simulation.py`` and a
few kinds of ``bench_kinds.py``, each simulated with ``--no-metrics`` (no recorder) and with the
view (recorder, then ``metrics.prom.jsonl`` written), interleaved and repeated; the ratio of
their median CPU times is the view's cost (target: at most 2, the view costing no more than the
simulation), and the same for whole ``kvpressure simulate`` processes. A third column runs a
recorder whose hooks do nothing but keep the view's scrape clock: what the engine spends on
having a recorder at all (the hooks it calls, the bulk lists it builds, leaps ended at
scrapes), apart from the view's own accounting and rendering. Idle runs: one request, an idle gap of G steps, one request, scraped every 50
steps (G = 10^4, 10^5, 10^6) and every 10^6 steps (G = 10^9): wall time, peak memory
(tracemalloc) and file size, which grow with the number of scrapes only.

    .venv/bin/python benchmarks/bench_metrics_view.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(1, str(ROOT / "benchmarks"))

from bench_kinds import scenario_dict  # noqa: E402
from bench_simulation import HEAVY, large_closed_scenario  # noqa: E402

from kvpressure.simulation.engine import simulate  # noqa: E402
from kvpressure.simulation.prom_view import PromRecorder  # noqa: E402
from kvpressure.simulation.scenario import load_scenario  # noqa: E402


def busy_cases() -> list[tuple[str, object]]:
    cases = [("heavy_closed_c64_fcfs", load_scenario(HEAVY)),
             ("large_closed_c256", load_scenario(large_closed_scenario()))]
    for kind in ("open_fcfs_heavy", "prefix_pressure", "first_chunk_admission",
                 "prefix_groups_open"):
        cases.append((kind, load_scenario(scenario_dict(kind, 1000))))
    return cases


class NullRecorder:
    """Every hook of the recorder contract, doing nothing, with the view's scrape clock."""

    def __init__(self, interval: float, origin: float = 1.0) -> None:
        self.interval, self.origin, self.k = interval, origin, 1

    @property
    def next_scrape_time(self) -> float:
        return self.origin + self.k * self.interval

    def on_arrival(self, req, t): pass
    def on_scheduled(self, req, t): pass
    def on_preempted(self, req, t): pass
    def on_output(self, req, t, new_tokens=1, finished=False): pass
    def on_decode_tokens(self, reqs, t): pass
    def on_decode_leap(self, reqs, times): pass
    def on_step_end(self, t, *rest): pass
    def on_steps_end(self, times, *rest): pass
    def finish(self, t=None): pass

    def maybe_scrape(self, t):
        while self.next_scrape_time <= t:
            self.k += 1


def with_view(sc, out: Path) -> None:
    rec = PromRecorder.for_step_clock(sc)
    simulate(sc, recorder=rec)
    rec.write(out)


def scenario_json(sc) -> dict:
    """The scenario as a file ``kvpressure simulate`` reads (settings resolved)."""
    from dataclasses import asdict

    reqs = []
    for r in sc.requests:
        d = {k: v for k, v in asdict(r).items() if v is not None}
        if not d.get("prefix_group"):
            d.pop("prefix_group", None)
            d.pop("prefix_len", None)
        reqs.append(d)
    out = {"name": sc.name, "seed": sc.seed,
           "mode": {"type": sc.mode, **({"concurrency": sc.concurrency}
                                        if sc.mode == "closed" else {})},
           "settings": sc.settings.to_dict(), "requests": reqs}
    if sc.prefix_groups:
        out["prefix_groups"] = sc.prefix_groups
    return out


def process_cpu(path: Path, tmp: Path, *flags: str) -> float:
    """CPU time of one ``kvpressure simulate`` process (interpreter start-up included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "kvpressure.cli", "simulate", str(path), "--out",
                    str(tmp / "out"), "--force", *flags], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, PYTHONPATH=str(ROOT / "lib")))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def gap_scenario(gap: int):
    return load_scenario({
        "name": "gap", "mode": {"type": "open"},
        "settings": {"num_gpu_blocks": 64, "block_size": 16, "enable_prefix_caching": True},
        "requests": [{"id": "a", "prompt_len": 40, "output_len": 5},
                     {"id": "b", "prompt_len": 40, "output_len": 5, "arrival_step": gap}]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-gap", type=int, default=10**9,
                    help="largest idle gap tried (an older kit takes minutes per 10^6 steps)")
    args = ap.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cases = busy_cases()
    plain: dict[str, list[float]] = {n: [] for n, _ in cases}
    null: dict[str, list[float]] = {n: [] for n, _ in cases}
    view: dict[str, list[float]] = {n: [] for n, _ in cases}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metrics.prom.jsonl"
        for _ in range(args.repeat):
            for name, sc in cases:
                c = time.process_time()
                simulate(sc)
                plain[name].append(time.process_time() - c)
                c = time.process_time()
                simulate(sc, recorder=NullRecorder(PromRecorder.for_step_clock(sc)
                                                   .scrape_interval_s))
                null[name].append(time.process_time() - c)
                c = time.process_time()
                with_view(sc, out)
                view[name].append(time.process_time() - c)
        print("busy runs: CPU time of simulate (median), without a recorder, with one that does "
              "nothing, with the view written; ratios to --no-metrics")
        print(f"{'workload':24s} {'steps':>7s} {'--no-metrics':>12s} {'null rec.':>10s} "
              f"{'with view':>10s} {'null':>5s} {'view':>5s}")
        worst = 0.0
        for name, sc in cases:
            a, z, b = (statistics.median(x[name]) for x in (plain, null, view))
            worst = max(worst, b / a)
            steps = len(simulate(sc).steps)
            print(f"{name:24s} {steps:7d} {a * 1000:10.1f}ms {z * 1000:8.1f}ms "
                  f"{b * 1000:8.1f}ms {z / a:5.2f} {b / a:5.2f}")
        print(f"largest ratio: {worst:.2f} (in-process simulate, view written)")
        print("whole `kvpressure simulate` processes (CPU time, median; steps.csv and "
              "requests.csv written by both)")
        worst = 0.0
        for name, sc in cases[:3]:
            src = Path(tmp) / f"{name}.scenario.json"
            src.write_text(json.dumps(scenario_json(sc)))
            a = statistics.median(process_cpu(src, Path(tmp), "--no-metrics")
                                  for _ in range(args.repeat))
            b = statistics.median(process_cpu(src, Path(tmp)) for _ in range(args.repeat))
            worst = max(worst, b / a)
            print(f"{name:24s} {'':7s} {a * 1000:10.1f}ms {b * 1000:8.1f}ms {b / a:6.2f}")
        print(f"largest ratio: {worst:.2f} (target <= 2)")
        print("idle gaps: one request, G idle steps, one request")
        for gap, every in ((10**4, 50), (10**5, 50), (10**6, 50), (10**9, 10**6)):
            if gap > args.max_gap:
                continue
            sc = gap_scenario(gap)
            rec = PromRecorder.for_step_clock(sc, scrape_every_steps=every)
            tracemalloc.start()
            t = time.perf_counter()
            simulate(sc, recorder=rec)
            rec.write(out)
            wall = time.perf_counter() - t
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            size = out.stat().st_size
            print(f"  G={gap:>13,d} every {every:>9,d} steps: {len(rec.scrapes):>7,d} scrapes "
                  f"{wall:7.2f} s  peak {peak / 2**20:7.1f} MiB  file {size / 1e6:8.1f} MB")
        if args.max_gap < 10**9:
            return
        sc = gap_scenario(10**9)
        t = time.perf_counter()
        try:
            simulate(sc, recorder=PromRecorder.for_step_clock(sc))
            print("  G=10^9 every 50 steps: ran (unexpected)")
        except Exception as exc:  # the refusal is the expected outcome
            print(f"  G=10^9 every 50 steps: refused in {time.perf_counter() - t:.3f} s: "
                  f"{json.dumps(str(exc))[:160]}")


if __name__ == "__main__":
    main()
