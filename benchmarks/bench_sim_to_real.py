"""Sim-to-real: the simulation against real vLLM servers on GPUs, per run and per load stage.

Data: ``benchmarks/data/sim_to_real/*.json``, public measurements cut small with their source
named in the file (real vLLM servers measured by a load generator, each with its engine
arguments, model, TP size and staged open-loop load). Every stage of every run is simulated
from the built-in profiles with no fitting on it: the experiment is built from the run's
configuration alone (hardware and model profiles, engine arguments, the workload's lengths and
shared prefixes, its stages at their rates), then measured and predicted TTFT mean/p90/p99,
ITL mean, E2E mean/p99 and output throughput are compared.

Two settings of the simulation are compared in the same run:

* ``before``: the engine core alone (synchronous loop, no request path): a first token counts
  when its step ends;
* ``after``: vLLM 0.33.0's defaults, async scheduling on, and the request path priced from the
  hardware profile (API server, tokenising, output path).

Split: the runs of the ``CALIBRATION_WORKLOADS`` (one run of every H100 model, at two rates
each) and the ``CALIBRATION_RUNS`` (one A100 run: the data has no codegen run on A100) are the
only ones any profile value or modelling choice may be made on; every other run (other
workloads, other rates, the same servers) is held out, and MAPE is reported on each split apart. Runs whose real
server failed more than 10% of its requests (overload with client time-outs) are shown but
left out of the MAPE: their latencies are the client's time-out, not the server's.

    .venv/bin/python benchmarks/bench_sim_to_real.py [--runs ID ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "lib"))

from kvpressure.simulation.engine import simulate  # noqa: E402
from kvpressure.simulation.experiment import experiment_from_dict  # noqa: E402

DATA = ROOT / "data" / "sim_to_real"
HARDWARE = {"H100 SXM 80GB": "h100-80g", "A100 SXM 80GB": "a100-80g", "L40S 48GB": "l40s"}
CALIBRATION_WORKLOADS = ("codegen",)
# No A100 run is a codegen run: the one A100 run on a model with an H100 codegen run, at TP 1
# (no all-reduce in its steps), fixes the A100 profile's values (data/hardware/a100-80g.yaml).
CALIBRATION_RUNS = ("38-llama-3-1-8b-tp1-general-lite-1-1",)
METRICS = ("ttft_mean", "ttft_p90", "ttft_p99", "itl_mean", "e2e_mean", "e2e_p99",
           "output_tps")
OVERLOAD_FAILURES = 0.10
# vLLM's default when a run does not state it.
GPU_MEMORY_UTILIZATION = 0.9
SETTINGS = {
    "before": {"engine": {"async_scheduling": False},
               "cost_model": {"api_server_s": 0.0, "tokenize_s_per_token": 0.0,
                              "output_s": 0.0}},
    "after": {"engine": {}, "cost_model": {}},
}


def load_runs() -> list[dict]:
    runs = []
    for path in sorted(DATA.glob("*.json")):  # the data files; README.md holds the results
        data = json.loads(path.read_text())
        src = data["source"]
        for run in data["runs"]:
            card = run.get("hardware", src["hardware"]).split(" (")[0]
            runs.append({**run, "hardware": HARDWARE[card],
                         "file": path.name, "repository": src["repository"]})
    return runs


def experiment_for(run: dict, setting: str):
    """The experiment a capacity planner would write for this run: its configuration only."""
    pool = run["workload"]["prompt_pool"]
    stages = run["stages"]
    prompt = int(round(np.mean([s["prompt_len_mean"] for s in stages])))
    output = engine_output_len(run)
    # The load generator draws every request from a fixed pool of prompts: requests of one
    # prompt share all of it but the last token (vLLM recomputes that one in any case).
    prompts = int(pool["num_groups"]) * int(pool["num_prompts_per_group"])
    extra = SETTINGS[setting]
    data = {
        "name": run["id"], "hardware": run["hardware"], "model": run["model"],
        "tensor_parallel_size": run["tensor_parallel_size"],
        "engine": {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION, **run["engine"],
                   **extra["engine"]},
        "workload": {
            "seed": 1,
            "input_len": 1,
            "output_len": output,
            "prefix_groups": {f"prompt{g}": {"share": 1.0 / prompts, "length": prompt - 1}
                              for g in range(prompts)},
            "stages": [{"request_rate": s["rate"], "duration_s": s["duration_s"]}
                       for s in stages],
            # inference-perf's "constant" load sends at fixed intervals.
            "burstiness": math.inf if run["workload"]["arrivals"] == "constant" else 1.0,
        },
        "cost_model": extra["cost_model"],
    }
    return experiment_from_dict(data)


def stage_metrics(result, stages: list[dict]) -> list[dict]:
    reqs = result.requests
    send = np.array([r.submit_time_s for r in reqs])
    ttft = np.array([r.first_token_time_s - r.submit_time_s for r in reqs])
    e2e = np.array([r.finish_time_s - r.submit_time_s for r in reqs])
    out = np.array([r.num_output_tokens for r in reqs])
    rows = []
    start = 0.0
    for st in stages:
        end = start + st["duration_s"]
        m = (send >= start) & (send < end)
        tt, ee, oo = ttft[m], e2e[m], out[m]
        rows.append({
            "ttft_mean": float(tt.mean()), "ttft_p90": float(np.percentile(tt, 90)),
            "ttft_p99": float(np.percentile(tt, 99)),
            "itl_mean": float((ee.mean() - tt.mean()) / max(oo.mean() - 1, 1)),
            "e2e_mean": float(ee.mean()), "e2e_p99": float(np.percentile(ee, 99)),
            "output_tps": float(oo.sum() / st["duration_s"]),
        })
        start = end
    return rows


def split_of(run: dict) -> str:
    """``calibration`` for the runs profile values were fitted on, else ``held-out``."""
    calibration = workload_name(run) in CALIBRATION_WORKLOADS or run["id"] in CALIBRATION_RUNS
    return "calibration" if calibration else "held-out"


def workload_name(run: dict) -> str:
    """The load generator's workload of the run (its id ends with it where not given)."""
    return run["workload"].get("name") or run["id"].rsplit("-", 1)[-1]


def engine_output_len(run: dict) -> int:
    """Tokens the engine generates for every request of the run: the load generator sends
    the workload's ``output_len`` as ``max_tokens`` with ``ignore_eos``, so vLLM stops at
    exactly that many. The summaries' ``output_len`` is the client's count, made by
    tokenising the streamed text again: random-token prompts make the model emit runs of
    whitespace that re-tokenise into fewer tokens (Llama-2-7B: 194 counted of 247 generated,
    while its E2E minimum of 1.54 s is 210 steps of its 7.3 ms)."""
    return int(run["workload"]["shared_prefix"]["output_len"])


def measured(stage: dict, output_len: int) -> dict:
    """The stage's figures per engine token (``output_len``: ``engine_output_len``)."""
    t, e = stage["ttft_s"], stage["e2e_s"]
    return {"ttft_mean": t["mean"], "ttft_p90": t["p90"], "ttft_p99": t["p99"],
            "itl_mean": (e["mean"] - t["mean"]) / max(output_len - 1, 1),
            "e2e_mean": e["mean"], "e2e_p99": e["p99"],
            # Not every source gives the served rate: no throughput to compare then.
            "output_tps": (None if stage.get("requests_per_s") is None
                           else stage["requests_per_s"] * output_len)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", help="run ids (default: all)")
    ap.add_argument("--json", help="write every row to this file")
    ap.add_argument("--split", choices=("calibration", "held-out"),
                    help="only the runs of one split")
    ap.add_argument("--fidelity", metavar="PATH",
                    help="write each card's held-out errors (the reports' latency fidelity: "
                         "data/fidelity/sim_to_real.json)")
    args = ap.parse_args(argv)
    runs = [r for r in load_runs() if not args.runs or r["id"] in args.runs]
    rows = []
    t_wall = time.perf_counter()
    for run in runs:
        split = split_of(run)
        if args.split and split != args.split:
            continue
        predicted = {}
        overloaded = [st["failures"] > OVERLOAD_FAILURES * (st["failures"] + (st["successes"] or 0))
                      for st in run["stages"]]
        if all(overloaded):
            # The real server timed its clients out: nothing to compare (and the simulated
            # queue would only grow).
            print(f"{run['id']}: overloaded ({run['stages'][0]['failures']} failed requests), "
                  "not simulated")
            continue
        for setting in SETTINGS:
            exp = experiment_for(run, setting)
            point = exp.point(with_recorder=False)
            predicted[setting] = stage_metrics(
                simulate(point.scenario, point.cost_model), run["stages"])
        for k, (st, overload) in enumerate(zip(run["stages"], overloaded, strict=True)):
            rows.append({"run": run["id"], "stage": k, "rate": st["rate"], "split": split,
                         "model": run["model"], "tp": run["tensor_parallel_size"],
                         "hardware": run["hardware"], "overload": overload,
                         "measured": measured(st, engine_output_len(run)),
                         **{s: predicted[s][k] for s in SETTINGS}})
    wall = time.perf_counter() - t_wall
    print_report(rows, wall)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    if args.fidelity:
        if args.runs or args.split:
            raise SystemExit("--fidelity takes every run (no --runs, no --split)")
        from kvpressure.profiles.fidelity import summarise

        doc = {"source": "benchmarks/bench_sim_to_real.py on benchmarks/data/sim_to_real/ "
                         "(real vLLM servers, public measurements; held-out: every workload "
                         "but codegen, and every run but "
                         + ", ".join(CALIBRATION_RUNS) + ")",
               "cards": summarise(rows)}
        Path(args.fidelity).parent.mkdir(parents=True, exist_ok=True)
        Path(args.fidelity).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


def ape(pred: float, real: float) -> float:
    return abs(pred - real) / abs(real) * 100


def mape(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """MAPE of ``before`` and ``after`` per metric over the rows that measured it."""
    out = {}
    for m in METRICS:
        have = [r for r in rows if r["measured"][m] is not None]
        if have:
            out[m] = tuple(float(np.mean([ape(r[s][m], r["measured"][m]) for r in have]))
                           for s in ("before", "after"))
    return out


def print_report(rows: list[dict], wall: float) -> None:
    ms = {"ttft_mean", "ttft_p90", "ttft_p99", "itl_mean", "e2e_mean", "e2e_p99"}
    print("| run | hardware | stage rate | split | metric | measured | before | after |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        tag = " (overload, not scored)" if r["overload"] else ""
        for m in METRICS:
            scale, unit = (1e3, " ms") if m in ms else (1.0, " tok/s")
            real = r["measured"][m]
            shown = "-" if real is None else f"{real * scale:.1f}{unit}"
            print(f"| {r['run']}{tag} | {r['hardware']} | {r['rate']:g} req/s | {r['split']} | "
                  f"{m} | {shown} | {r['before'][m] * scale:.1f} | {r['after'][m] * scale:.1f} |")
    print()
    for split in ("calibration", "held-out"):
        scored = [r for r in rows if r["split"] == split and not r["overload"]]
        if not scored:
            continue
        print(f"MAPE, {split} ({len(scored)} stages of "
              f"{len({r['run'] for r in scored})} runs):")
        for m, (b, a) in mape(scored).items():
            print(f"  {m:10s} before {b:6.1f}%   after {a:6.1f}%")
        for s in SETTINGS:
            queued = [f"{r['run']}@{r['rate']:g}" for r in scored
                      if r[s]["ttft_p99"] > 3 * r["measured"]["ttft_p99"]]
            print(f"  {s}: stages where the simulation queues (TTFT p99 > 3x real): "
                  f"{len(queued)} {' '.join(queued)}")
    print(f"\n{len(rows)} stages simulated twice in {wall:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
