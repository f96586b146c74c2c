"""The clients' return lag (docs/scheduler.md#loop-closed-return) against real vLLM runs.

    .venv/bin/python benchmarks/bench_return_lag.py [FOLDER ...]

Per measured sweep folder (default: the ``twin_real_runs/*`` and ``step_trace_real*`` folders
under ``benchmarks/out/``, as ``bench_twin.py --real`` and ``bench_step_trace.py --real`` leave
them): the twin's preemptions per level with the clients back at the next step (R = 0, the
simulation's default), R = 1 and R = 2, R = 1 with the first request alone, and the lag the twin
estimates (``twin/return_lag.py``: from the step trace when the server logged iteration details,
else from the client turnaround over the fitted step time), each against the measured
preemptions; and the mean number of requests scheduled per step at the lowest level, against
the server's own where its step trace has it. Decisions do not depend on the step time, so
every variant is a step-mode simulation of the level's measured requests.

Results: stdout and ``benchmarks/out/bench_return_lag.json``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
VARIANTS = {"R0": (0, False), "R1": (1, False), "R2": (2, False), "R1_first_alone": (1, True)}


def _folders() -> list[Path]:
    runs = sorted(p for p in (OUT / "twin_real_runs").glob("*/") if (p / "report").is_dir())
    return runs + sorted(p for p in OUT.glob("step_trace_real*/") if (p / "report").is_dir())


def _run(settings, w) -> tuple[int, float]:
    from kvpressure.simulation.engine import simulate
    from kvpressure.twin.basis import build_scenario

    res = simulate(build_scenario(settings, w))
    return int(res.summary["preemptions"]), float(np.mean(res.steps.columns[
        "num_scheduled_reqs"]))


def compare(folder: Path) -> dict:
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.return_lag import level_steps

    t = time.perf_counter()
    twin = build_twin(folder)
    if twin.return_lag is None:
        twin.fit(bootstrap=50)  # the seconds route needs the fitted step time
    lag = twin.return_lag
    lv = twin.measured.levels.set_index("concurrency")
    levels = sorted(twin.workloads)
    out: dict = {"folder": str(folder.relative_to(ROOT)), "levels": levels,
                 "estimated": {"return_steps": lag.return_steps, "first_alone": lag.first_alone,
                               "source": lag.source},
                 "preemptions": {"measured": [float(lv.loc[c, "preemptions"]) for c in levels]},
                 "mean_scheduled_lowest_level": {}}
    variants = {name: {c: (k, fa) for c in levels} for name, (k, fa) in VARIANTS.items()}
    variants["estimated"] = {c: (lag.return_steps[c], lag.first_alone) for c in levels}
    for name, per in variants.items():
        got = [_run(twin.settings, dataclasses.replace(twin.workloads[c], return_steps=per[c][0],
                                                       first_alone=per[c][1])) for c in levels]
        out["preemptions"][name] = [p for p, _ in got]
        out["mean_scheduled_lowest_level"][name] = round(got[0][1], 3)
    if twin.step_trace is not None:
        real = level_steps(twin.step_trace, float(lv.loc[levels[0], "t_start"]),
                           float(lv.loc[levels[0], "t_end"]))
        out["mean_scheduled_lowest_level"]["measured"] = round(float(
            (real["context_requests"] + real["generation_requests"]).mean()), 3)
    meas = np.array(out["preemptions"]["measured"])
    out["preemptions_abs_error_sum"] = {
        name: float(np.nansum(np.abs(np.array(v) - meas)))
        for name, v in out["preemptions"].items() if name != "measured"}
    out["wall_s"] = round(time.perf_counter() - t, 1)
    return out


def main() -> int:
    folders = [Path(a).resolve() for a in sys.argv[1:]] or _folders()
    results = []
    for folder in folders:
        r = compare(folder)
        results.append(r)
        print(f"{r['folder']} (levels {r['levels']}; estimated R "
              f"{r['estimated']['return_steps']}, first alone {r['estimated']['first_alone']}; "
              f"{r['wall_s']} s)")
        for name, v in r["preemptions"].items():
            err = r["preemptions_abs_error_sum"].get(name)
            print(f"    preemptions {name:>15}: {v}" + (f"  (sum |error| {err:g})"
                                                          if err is not None else ""))
        print(f"    mean scheduled per step at c={r['levels'][0]}: "
              f"{r['mean_scheduled_lowest_level']}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_return_lag.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
