"""The real server's own steps against the twin: step time and the preemption gap.

    .venv/bin/python benchmarks/bench_step_trace.py --real      # measure (~4 min), then compare
    .venv/bin/python benchmarks/bench_step_trace.py FOLDER       # compare on a measured folder

FOLDER is a ``kvpressure collect`` sweep folder with its ``report/`` ingested (as ``--real`` and
``bench_twin.py --real`` leave them); without the iteration-details log in its ``server.log``
only the preemptions and the level fit are compared.

``--real`` starts vLLM's CPU build (``scripts/vllm-env.sh``) on the mid tiny model of
``bench_twin.py`` (64 KV blocks of 32 tokens, full-ISL admission, ``max_num_seqs`` 64,
``max_num_batched_tokens`` 1024) with ``--enable-logging-iteration-details``, sweeps
``kvpressure collect`` (levels 2, 6, 8, 12, 16, 24; 48 requests each, 256 +- 25% prompt and
128 +- 25% output tokens) and ingests it into ``benchmarks/out/step_trace_real/``, the server's
log copied to ``server.log``. Then, on that folder (or FOLDER):

* **step time**: the coefficients fitted on the server's steps (``twin/step_trace.py``) next to
  the ones fitted on the levels (``twin/fit.py``), and each twin's throughput error per level;
* **preemptions per level**: measured, the twin replaying the requests in the order they
  finished (what the twin did before it read ``start_times``), and in the order they were sent;
* ``--verify-vllm``: each level's closed loop as the twin simulates it (all ``C`` clients at
  step 0, a finished request replaced at the next step) run through vLLM's own scheduler
  (``kvpressure verify-vllm``): a match step for step means the twin's decisions are vLLM's,
  and what remains between the twin and the real server is the timing of the real loop;
* **the step sequences**: per level, the real one (from the log, from the level's first
  prefill) against the twin's simulation of the same requests: the first step where they
  differ, the steps until all ``C`` clients' first requests were scheduled, the mean number of
  requests scheduled per step, prefill and decode tokens in total, the number of steps, and
  the resumptions after a preemption (step and recompute tokens) with how many of them, from
  the first, recompute the same number of tokens (+- 1), and how many steps later the real
  one happened.

Results: stdout and ``benchmarks/out/bench_step_trace.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
LEVELS = "2,6,8,12,16,24"
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 1024, "scheduler_reserve_full_isl": True}


def _bench_twin():
    spec = importlib.util.spec_from_file_location("bench_twin", ROOT / "benchmarks" /
                                                  "bench_twin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(folder: Path, port: int) -> dict:
    bt = _bench_twin()
    venv = bt._vllm_env()
    model = bt._model(venv, "mid", OUT / "twin_real_runs" / "models")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.server.log"
    plain = subprocess.Popen

    def with_details(args, **kw):
        if "vllm.entrypoints.openai.api_server" in args:
            args = [*args, "--enable-logging-iteration-details"]
        return plain(args, **kw)

    subprocess.Popen = with_details  # bench_twin's start, with the one flag added
    try:
        proc = bt._start(venv, model, 64, ENGINE, port, log)
    finally:
        subprocess.Popen = plain
    try:
        startup = bt._wait(port, proc, log)
        t = time.perf_counter()
        subprocess.run([bt.KVP, "collect", f"http://127.0.0.1:{port}", "--levels", LEVELS,
                        "--out", str(folder), "--input-len", "256", "--output-len", "128",
                        "--range-ratio", "0.25", "--prompts-per-level", "48",
                        "--load-engine", "builtin", "--no-report", "--cooldown", "2",
                        "--engine-args", json.dumps({**ENGINE, "enable_chunked_prefill": True})],
                       check=False)
        sweep = time.perf_counter() - t
    finally:
        bt._stop(proc)
    shutil.copy(log, folder / "server.log")
    subprocess.run([bt.KVP, "ingest", str(folder / "bench"), str(folder / "metrics.prom.jsonl"),
                    "--run", "load", "--out", str(folder / "report"),
                    "--scheduler-reserve-full-isl", "true"], check=True, capture_output=True)
    return {"startup_s": round(startup, 1), "sweep_s": round(sweep, 1), "uptime": bt._uptime()}


def _finish_order(folder: Path, c: int, workload):
    """The level's requests in the order the bench result lists them (as they finished)."""
    from kvpressure.twin.workload import LevelWorkload

    res = json.loads((folder / "bench" / f"c{c}.json").read_text())
    ok = [not e for e in res.get("errors", [""] * len(res["input_lens"]))]
    ins = [i for i, k in zip(res["input_lens"], ok, strict=True) if k]
    outs = [o for o, k in zip(res["output_lens"], ok, strict=True) if k]
    return LevelWorkload(c, tuple(ins), tuple(outs), True)


def compare(folder: Path) -> dict:
    from kvpressure.ingestion.iteration_log import in_window, iteration_steps
    from kvpressure.simulation.engine import simulate
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.basis import build_scenario

    log = folder / "server.log"
    steps = iteration_steps(log) if log.is_file() else None
    traced = build_twin(folder)
    levels_only = build_twin(folder)
    levels_only.step_trace = None
    out: dict = {"folder": str(folder), "coefficients": {}, "levels": {},
                 "steps_logged": 0 if steps is None else len(steps)}
    twins = [("level_fit", levels_only)]
    if traced.step_trace is not None:
        twins.insert(0, ("step_trace", traced))
    for name, twin in twins:
        fit = twin.fit(bootstrap=200)
        rep = twin.fit_report()
        out["coefficients"][name] = {p: {"value": d["value"], "p05": d["p05"], "p95": d["p95"],
                                         "source": d["source"]}
                                     for p, d in fit.describe().items()}
        out[f"throughput_error_pct_{name}"] = dict(zip(
            rep.table["concurrency"].astype(int).tolist(),
            rep.table["output_throughput_error_pct"].round(1).tolist(), strict=True))
        print(f"{name}: " + ", ".join(f"{p} {d['value']:.3g} [{d['p05']:.3g}, {d['p95']:.3g}]"
                                      for p, d in fit.describe().items()
                                      if d["value"] or d["source"].startswith(("fitted",
                                                                               "step"))))
        print(f"    throughput error % per level: {out[f'throughput_error_pct_{name}']}")
    lv = traced.measured.levels.set_index("concurrency")
    for c, w in sorted(traced.workloads.items()):
        sim = simulate(build_scenario(traced.settings, w)).steps_frame()
        finish = simulate(build_scenario(traced.settings, _finish_order(folder, c, w)))
        row = {"preemptions_measured": float(lv.loc[c, "preemptions"]),
               "preemptions_twin_finish_order": int(finish.summary["preemptions"]),
               "preemptions_twin_send_order": int(sim["preemptions"].sum())}
        out["levels"][c] = row
        print(f"c={c}: preemptions measured {row['preemptions_measured']:.0f}, twin (finish "
              f"order) {row['preemptions_twin_finish_order']}, twin (send order) "
              f"{row['preemptions_twin_send_order']}", flush=True)
        if not out["steps_logged"]:
            continue  # a sweep without the iteration-details log: preemptions only
        real = in_window(steps, lv.loc[c, "t_start"] - 1, lv.loc[c, "t_end"] + 1)
        real = real.reset_index(drop=True)
        first = real.index[real["context_requests"] > 0][0]
        real = real.loc[first:].reset_index(drop=True)
        rp, rd = real["num_prefill_tokens"].to_numpy(), real["num_decode_tokens"].to_numpy()
        sp, sd = sim["num_prefill_tokens"].to_numpy(), sim["num_decode_tokens"].to_numpy()
        n = min(len(rp), len(sp))
        diff = np.nonzero((rp[:n] != sp[:n]) | (rd[:n] != sd[:n]))[0]
        # Resumptions after a preemption: real (a resumed request's recompute is logged as
        # generation tokens, one of them its decode slot) against the twin's recompute.
        rr = real.index[real["resumed_tokens"] > 0]
        sr = sim.index[sim["recomputed_tokens"] > 0]
        resumes_real = [[int(k), int(real["resumed_tokens"][k]) + 1] for k in rr]
        resumes_twin = [[int(k), int(sim["recomputed_tokens"][k])] for k in sr]
        same, lags = 0, []
        for (ka, na), (kb, nb) in zip(resumes_real, resumes_twin, strict=False):
            if abs(na - nb) > 1:
                break
            same += 1
            lags.append(ka - kb)
        ramp_real = int(np.argmax(np.cumsum(real["context_requests"].to_numpy()) >= c))
        ramp_sim = int(np.argmax(np.cumsum(sim["admitted_new"].to_numpy()) >= c))
        row.update({
            "first_divergent_step": int(diff[0]) if len(diff) else None,
            "steps_until_all_clients_in": {"real": ramp_real, "twin": ramp_sim,
                                           "real_elapsed_ms": round(float(
                                               real["elapsed_s"][:ramp_real].sum()) * 1000)},
            "mean_scheduled_per_step": {
                "real": round(float((real["context_requests"]
                                     + real["generation_requests"]).mean()), 2),
                "twin": round(float(sim["num_scheduled_reqs"].mean()), 2)},
            "prefill_tokens": {"real": int(rp.sum()), "twin": int(sp.sum())},
            "decode_tokens": {"real": int(rd.sum()), "twin": int(sd.sum())},
            "steps": {"real": len(real), "twin": len(sim)},
            "resumes_alike_from_the_start": same,
            "their_step_lag_real_minus_twin": lags,
            "resumes_real": resumes_real[:10], "resumes_twin": resumes_twin[:10],
            "first_steps_real": [[int(a), int(b)] for a, b in zip(rp[:12], rd[:12],
                                                                  strict=True)],
            "first_steps_twin": [[int(a), int(b)] for a, b in zip(sp[:12], sd[:12],
                                                                  strict=True)],
        })
        print(f"    first divergent step "
              f"{row['first_divergent_step']}; all {c} clients in after {ramp_real} real steps "
              f"({row['steps_until_all_clients_in']['real_elapsed_ms']} ms), {ramp_sim} twin "
              f"steps; scheduled/step real {row['mean_scheduled_per_step']['real']} twin "
              f"{row['mean_scheduled_per_step']['twin']}; steps real {len(real)} twin "
              f"{len(sim)}; the first {same} resumptions alike (recompute tokens +- 1; real "
              f"step minus twin step {lags})",
              flush=True)
    return out


def verify_decisions(folder: Path) -> dict:
    """The twin's closed loop of every level run through vLLM's own scheduler
    (``kvpressure verify-vllm``, the CPU build of ``scripts/vllm-env.sh``): whether the
    simulation's decisions are vLLM's on the same input, step for step."""
    import tempfile

    from kvpressure.simulation.scenario import SETTING_NAMES
    from kvpressure.twin.api import build_twin

    twin = build_twin(folder)
    venv = _bench_twin()._vllm_env()
    with tempfile.TemporaryDirectory(prefix="bench_step_trace_") as tmp:
        files = []
        for c, w in sorted(twin.workloads.items()):
            path = Path(tmp) / f"twin_c{c}.json"
            path.write_text(json.dumps({
                "name": f"twin_c{c}", "seed": 0, "mode": {"type": "closed", "concurrency": c},
                "settings": {k: v for k, v in twin.settings.items() if k in SETTING_NAMES},
                "requests": w.requests()}))
            files.append(str(path))
        got = subprocess.run([str(ROOT / ".venv" / "bin" / "kvpressure"), "verify-vllm",
                              "--vllm-python", str(venv / "bin" / "python"), "--json", *files],
                             capture_output=True, text=True)
    rows = [json.loads(line) for line in got.stdout.splitlines() if line.startswith("{")]
    print(f"verify-vllm (rc {got.returncode}): " + "; ".join(
        f"{r['workload']}: " + ("match" if r["matches"] else
                                f"differs from step {r['first_divergence']}")
        + f" ({r['steps_vllm']} steps)" for r in rows),
        flush=True)
    return {"returncode": got.returncode, "workloads": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path, default=OUT / "step_trace_real")
    ap.add_argument("--real", action="store_true", help="measure the folder first")
    ap.add_argument("--port", type=int, default=18479)
    ap.add_argument("--verify-vllm", action="store_true",
                    help="also run each level's closed loop through vLLM's own scheduler")
    args = ap.parse_args()
    doc: dict = {}
    if args.real:
        doc["measured"] = measure(args.folder, args.port)
    if not (args.folder / "runs.csv").is_file() and not (args.folder / "report").is_dir():
        print(f"{args.folder}: no measured sweep; run with --real first", file=sys.stderr)
        return 2
    doc.update(compare(args.folder))
    if args.verify_vllm:
        doc["verify_vllm"] = verify_decisions(args.folder)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "bench_step_trace.json" if args.folder == OUT / "step_trace_real" else (
        f"bench_step_trace.{args.folder.name}.json")
    (OUT / name).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
