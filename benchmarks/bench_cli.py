"""What a user feels from the command line: whole processes, and whether ``summary.json``'s
``timing`` tells the truth about the loop.

Processes (wall time, median of ``--repeat`` runs, interleaved): ``python -c pass`` (the
interpreter's own start, the baseline), ``kvpressure --help``, and ``kvpressure simulate`` on
each reference run, with and without the Prometheus view (``--no-metrics``). Each is given in
seconds and as a multiple of the baseline measured in the same run.

Honest timing: for each reference run, the ``timing`` a fresh ``kvpressure simulate`` process
writes into ``summary.json`` (``setup_s``, ``loop_wall_s``, ``finish_s``: the set-up, the loop
alone and what follows it) against a ``simulate()`` call timed from outside in a fresh process
after its imports (the same recorder): the three parts must add up to the call (ratio near 1;
one that held imports shows well above 1, one that left out work well below), and the loop's
share of the call is shown beside them. The warm column is the same call repeated in that
process: a first loop in a process runs slower than later ones (cold caches), which the
command line, running one, always pays.

    .venv/bin/python benchmarks/bench_cli.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

REFERENCE = ROOT / "tests" / "data" / "vllm-0.33-scheduler"
RUNS = ("light_open_prefix_groups", "heavy_closed_c64_fcfs")
KVPRESSURE = Path(sys.executable).parent / "kvpressure"


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


_TIMED_CALL = """
import json, sys, time
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.prom_view import PromRecorder
from kvpressure.simulation.scenario import load_scenario
scenario = load_scenario(sys.argv[1])
recorder = PromRecorder.for_step_clock(scenario) if sys.argv[2] == "1" else None
t = time.perf_counter()
simulate(scenario, recorder=recorder)
first = time.perf_counter() - t
warm = []
for _ in range(3):
    recorder = PromRecorder.for_step_clock(scenario) if sys.argv[2] == "1" else None
    t = time.perf_counter()
    simulate(scenario, recorder=recorder)
    warm.append(time.perf_counter() - t)
print(json.dumps([first, sorted(warm)[1]]))
"""


def _timed_call(name: str, metrics: bool, repeat: int) -> tuple[float, float]:
    """``simulate()`` timed from outside in a fresh process (set-up and the result's
    summary included, imports not): its first call, as the command line makes it, and a
    warm call (the median of three after it). Medians over ``repeat`` processes."""
    firsts, warms = [], []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", _TIMED_CALL,
                              str(REFERENCE / f"{name}.scenario.json"), "1" if metrics else "0"],
                             check=True, capture_output=True, text=True)
        first, warm = json.loads(out.stdout)
        firsts.append(first)
        warms.append(warm)
    return statistics.median(firsts), statistics.median(warms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        commands: dict[str, list[str]] = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "kvpressure --help": [str(KVPRESSURE), "--help"],
        }
        for name in RUNS:
            for metrics in (True, False):
                label = f"simulate {name}" + ("" if metrics else " --no-metrics")
                commands[label] = [str(KVPRESSURE), "simulate",
                                   str(REFERENCE / f"{name}.scenario.json"),
                                   "--out", f"{tmp}/{label.replace(' ', '_')}", "--force",
                                   *([] if metrics else ["--no-metrics"])]
        walls: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(args.repeat):
            for label, cmd in commands.items():
                walls[label].append(_wall(cmd))
        base = statistics.median(walls["python -c pass (baseline)"])
        print(f"{'process':<52} {'median s':>9} {'x baseline':>11}")
        for label, values in walls.items():
            m = statistics.median(values)
            print(f"{label:<52} {m:9.3f} {m / base:11.1f}")

        print()
        print(f"{'summary.json timing vs simulate() timed outside':<52} {'loop':>9} "
              f"{'parts':>9} {'call':>9} {'parts/call':>10} {'loop/call':>9} {'warm':>9}")
        for name in RUNS:
            for metrics in (True, False):
                label = f"simulate {name}" + ("" if metrics else " --no-metrics")
                loops, parts = [], []
                for _ in range(args.repeat):
                    subprocess.run(commands[label], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                    out = Path(commands[label][4]) / "summary.json"
                    timing = json.loads(out.read_text())["timing"]
                    loops.append(timing["loop_wall_s"])
                    parts.append(timing["setup_s"] + timing["loop_wall_s"] + timing["finish_s"])
                loop, whole = statistics.median(loops), statistics.median(parts)
                first, warm = _timed_call(name, metrics, args.repeat)
                print(f"{label:<52} {loop:9.4f} {whole:9.4f} {first:9.4f} {whole / first:10.2f} "
                      f"{loop / first:9.2f} {warm:9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
