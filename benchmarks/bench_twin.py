"""How far the twin of a measured server can be trusted: recovery, leave-levels-out, real vLLM.

    .venv/bin/python benchmarks/bench_twin.py                 # (a) and (b), simulated, ~1 min
    .venv/bin/python benchmarks/bench_twin.py --real          # plus (c), real vLLM, ~30 min
    .venv/bin/python benchmarks/bench_twin.py --real --no-sim --reuse   # refit on kept sweeps
    .venv/bin/python benchmarks/bench_twin.py --ab max_num_seqs_pool,pool_doubled --rounds 4 \
        --ab-setup mid_pool64_chunk128_nocache      # remedies against the baseline in turn

(a) **The simulation itself.** Sweeps simulated with known step-time coefficients (two sets:
    per-step dominated, as a CPU server, and per-token dominated), times multiplied by seeded
    log-normal noise of 0%, 1% and 3%; the twin is fitted on each and the fitted coefficients
    compared with the truth (relative error, truth inside the bootstrap 90% interval), with the
    throughput error per level. Also the time to build, fit and predict a sweep of 8 levels,
    against one plain simulation of the same 8 levels measured in the same run (the ratio is
    what the fit costs over simulating once).
(b) **Leave-levels-out.** The same data fitted on every other level, the held-out levels
    predicted: throughput error per held-out level.
(c) **Real vLLM** (``--real``): the CPU build (``scripts/vllm-env.sh``) serving small random-weight
    Llama models (``scripts/build-tiny-model.py``; the wide one is the same script with a wider
    shape) on loopback, KV pool set with ``--num-gpu-blocks-override``. For each setup: start the
    server, ``kvpressure collect`` a sweep of 8 levels past the knee (builtin closed-loop
    client, ``--no-report``), ``kvpressure ingest`` its bench results and scrape log into the
    folder's ``report/``, build and fit the twin, compare per level (preemptions also summed
    over the levels at and past the measured knee), fit on half the levels and predict the
    rest. On the first setup and on the one whose curve falls, the remedies (``max_num_seqs``
    lowered to what the pool holds; the pool doubled, more KV memory, an effect well above a
    level's noise; ``max_num_batched_tokens`` 128, so prompts are prefilled in chunks, where
    they were not; admission by the full prompt, where it was by the first chunk) are
    predicted on the twin, then measured on a restarted server and compared: errors per level
    for throughput and preemptions, and the change in throughput predicted vs measured both at
    the focus level and as the change of the mean over the levels at and past the knee (with
    the spread of the per-level changes). The baseline is measured a second time on a restarted
    server: the run-to-run spread per level the twin's errors are read against. The client
    turnaround (a slot's empty time between a finish and the next request reaching the
    engine) is recorded per setup. ``uptime`` is recorded before and after: absolute
    throughput on 2 shared cores moves with the machine's load.
(d) **Remedies in turn** (``--ab``): a setup's baseline and remedies on servers of their own,
    started once, each level run on each back to back over several rounds; a remedy's change
    is read from the pairs of a round, so the machine's drift between runs cancels (``ab``).

Results: stdout and ``benchmarks/out/bench_twin.json``; each real twin's folder (``twin.json``,
``fit_table.csv``, ``twin.png``, ``twin.md``) under ``benchmarks/out/twin_real/<setup>/``.
Targets (issue 17): preemptions within 10% per level, throughput within 15%, knee within one
level, remedy change within 10 percentage points with the right sign, fit + predict of 8 levels
under 10 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
KVP = str(ROOT / ".venv" / "bin" / "kvpressure")
LEVELS = (1, 2, 4, 6, 8, 12, 16, 24)

SIM_SETTINGS = dict(num_gpu_blocks=64, block_size=32, max_num_seqs=64,
                    max_num_batched_tokens=1024, max_model_len=2048,
                    enable_prefix_caching=False, scheduler_reserve_full_isl=True)
SIM_TRUTHS = {
    # per-step cost dominates (a small model on a CPU)
    "per_step": dict(t0=4e-3, t_prefill_token=3e-5, t_decode_seq=2e-4, t_decode_ctx=0.0,
                     t_prefill_attn=0.0),
    # per-token prefill and per-sequence costs dominate (a wider model)
    "per_token": dict(t0=1e-3, t_prefill_token=2e-4, t_decode_seq=1.5e-3, t_decode_ctx=0.0,
                      t_prefill_attn=0.0),
}
TTFT_OFFSET = 0.01


def _pct(a: float, b: float) -> float | None:
    return None if not b or not math.isfinite(a) else round(100.0 * (a - b) / b, 2)


def _rounded(obj):
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_rounded(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return None if not math.isfinite(obj) else float(f"{obj:.4g}")
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# --- (a) and (b): simulated sweeps with known coefficients -------------------------------------
def simulated(noises=(0.0, 0.01, 0.03)) -> dict:
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.simulate import simulate_level
    from kvpressure.twin.synthetic import synthetic_workloads, write_synthetic_run

    workloads = synthetic_workloads(LEVELS, input_len=(192, 320), output_len=(96, 160), seed=5)
    out: dict = {"levels": list(LEVELS), "settings": SIM_SETTINGS, "cases": []}
    for name, truth in SIM_TRUTHS.items():
        for noise in noises:
            folder = Path(tempfile.mkdtemp(prefix="bench_twin_"))
            try:
                write_synthetic_run(folder, SIM_SETTINGS, workloads, truth,
                                    ttft_offset=TTFT_OFFSET, noise=noise, seed=11)
                # baseline: one plain simulation of the 8 levels with the true coefficients
                t = time.perf_counter()
                for w in workloads.values():
                    simulate_level(SIM_SETTINGS, w, truth, TTFT_OFFSET)
                one_sweep = time.perf_counter() - t
                t = time.perf_counter()
                twin = build_twin(folder)
                fit = twin.fit(bootstrap=200)
                report = twin.fit_report()
                fit_predict = time.perf_counter() - t
                full = {**truth, "ttft_offset": TTFT_OFFSET}
                coefs = {}
                for p, d in fit.describe().items():
                    coefs[p] = {"true": full[p], "fitted": d["value"],
                                "error_pct": _pct(d["value"], full[p]) if full[p] else None,
                                "interval": [d["p05"], d["p95"]],
                                "truth_in_interval": bool(
                                    d["p05"] * (1 - 1e-6) <= full[p] <= d["p95"] * (1 + 1e-6)),
                                "source": d["source"].split(" (")[0]}
                # (b) leave-levels-out: fit on every other level, predict the rest
                twin_lo = build_twin(folder)
                twin_lo.fit(levels=list(LEVELS[::2]), bootstrap=100)
                held = [c for c in LEVELS if c not in LEVELS[::2]]
                lo = twin_lo.fit_report(levels=held).table
                case = {
                    "truth": name, "noise": noise, "coefficients": coefs,
                    "throughput_error_pct": dict(zip(report.table["concurrency"].tolist(),
                                                     report.table["output_throughput_error_pct"]
                                                     .round(2).tolist(), strict=True)),
                    "preemptions_equal": bool((report.table["preemptions_twin"]
                                               == report.table["preemptions_measured"]).all()),
                    "verdict": report.verdict.text,
                    "leave_levels_out": {
                        "fitted_on": list(LEVELS[::2]),
                        "throughput_error_pct": dict(zip(
                            held, lo["output_throughput_error_pct"].round(2).tolist(),
                            strict=True))},
                    "fit_predict_8_levels_s": round(fit_predict, 3),
                    "one_simulation_of_8_levels_s": round(one_sweep, 3),
                    "ratio": round(fit_predict / one_sweep, 1),
                }
                out["cases"].append(case)
                print(f"(a) {name:9s} noise {noise:4.0%}: " + ", ".join(
                    f"{p} {c['fitted']:.3g} (true {c['true']:.3g}"
                    f"{', in 90%' if c['truth_in_interval'] else ', OUT'}; {c['source']})"
                    for p, c in coefs.items() if c["true"] or c["source"] == "fitted"),
                    flush=True)
                worst = report.table["output_throughput_error_pct"].abs().max()
                print(f"    throughput max |error| {worst:.2f}%; leave-levels-out max |error| "
                      f"{lo['output_throughput_error_pct'].abs().max():.2f}%; fit+predict "
                      f"{fit_predict:.2f} s = {fit_predict / one_sweep:.0f}x one simulation of "
                      f"the 8 levels ({one_sweep:.3f} s)", flush=True)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    return out


# --- (c): real vLLM ---------------------------------------------------------------------------
REAL_SETUPS = [
    # name, model shape, num_gpu_blocks, engine args; the first one (and any with "remedies")
    # gets its remedies measured
    {"name": "mid_pool64_fullisl", "model": "mid", "blocks": 64,
     "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 1024,
                "scheduler_reserve_full_isl": True}},
    {"name": "mid_pool96_firstchunk", "model": "mid", "blocks": 96,
     "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 1024,
                "scheduler_reserve_full_isl": False}},
    {"name": "wide_pool64_fullisl", "model": "wide", "blocks": 64,
     "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 1024,
                "scheduler_reserve_full_isl": True}},
    # A curve that falls: admission by first chunk with prompts prefilled in 128-token chunks
    # lets more requests in than the pool holds, and with no prefix cache every preemption
    # recomputes its whole context. Its remedies are measured too: their effect is well
    # above the machine's drift between runs, so the sign of the change can be read.
    {"name": "mid_pool64_chunk128_nocache", "model": "mid", "blocks": 64, "remedies": True,
     "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 128,
                "scheduler_reserve_full_isl": False, "enable_prefix_caching": False}},
]
MODEL_SHAPES = {
    "mid": None,  # scripts/build-tiny-model.py as it is: hidden 512, 8 layers
    "wide": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 16},
}
BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 256, 128, 0.25
# The same number of requests at every level keeps a sweep of 8 levels to a few minutes; the
# twin replays exactly that closed loop, so a short level is compared like a long one.
PROMPTS_PER_LEVEL = 48
REAL_LEVELS = (2, 3, 4, 6, 8, 12, 16, 24)
REUSE = False  # --reuse
ONLY_REMEDIES: set[str] | None = None  # --remedies


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _vllm_env() -> Path:
    got = subprocess.run(["bash", str(ROOT / "scripts" / "vllm-env.sh")], capture_output=True,
                         text=True, check=True)
    return Path(got.stdout.strip().splitlines()[-1])


def _model(venv: Path, kind: str, models: Path) -> Path:
    out = models / kind
    if (out / "config.json").is_file():
        return out
    script = ROOT / "scripts" / "build-tiny-model.py"
    shape = MODEL_SHAPES[kind]
    code = ("import importlib.util, sys, json\n"
            f"spec = importlib.util.spec_from_file_location('tiny', {str(script)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            + (f"m.SHAPE = json.loads({json.dumps(json.dumps(shape))})\n" if shape else "")
            + f"m.build(__import__('pathlib').Path({str(out)!r}))\n")
    subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True)
    return out


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _start(venv: Path, model: Path, blocks: int, engine: dict, port: int, log: Path
           ) -> subprocess.Popen:
    if not _port_free(port):
        # Another server there would answer the readiness check in this one's place.
        raise RuntimeError(f"port {port} is in use; pass --port")
    args = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "bfloat16", "--block-size", str(BLOCK_SIZE),
            "--num-gpu-blocks-override", str(blocks), "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(engine["max_num_seqs"]),
            "--max-num-batched-tokens", str(engine["max_num_batched_tokens"]),
            "--scheduler-reserve-full-isl" if engine["scheduler_reserve_full_isl"]
            else "--no-scheduler-reserve-full-isl",
            "--enable-prefix-caching" if engine.get("enable_prefix_caching", True)
            else "--no-enable-prefix-caching",
            # One log line per engine step: the twin fits its step time and the clients'
            # return lag on the server's own steps (twin/step_trace.py, twin/return_lag.py).
            "--enable-logging-iteration-details"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    fh = log.open("w")
    # A session of its own: stopping it ends the API server and its engine-core child together.
    return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _wait(port: int, proc: subprocess.Popen, log: Path, timeout: float = 600.0) -> float:
    import httpx

    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return time.perf_counter() - t
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"vLLM did not answer within {timeout:.0f} s; see {log}")


def _stop(proc: subprocess.Popen) -> None:
    from kvpressure.live.serve import stop_group

    stop_group(proc, grace_s=60)


def _measure(venv: Path, model: Path, blocks: int, engine: dict, folder: Path, port: int,
             levels: tuple[int, ...]) -> dict:
    """Start a server, collect a sweep, ingest it; returns timings. With ``--reuse``, a folder
    already measured and ingested is kept (the twin is refitted on it, nothing is measured)."""
    stamp = folder / "timing.json"
    if REUSE and stamp.is_file() and (folder / "report" / "runs.csv").is_file():
        print(f"    reusing the sweep in {folder}", flush=True)
        return json.loads(stamp.read_text())
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    log = folder.parent / f"{folder.name}.server.log"
    proc = _start(venv, model, blocks, engine, port, log)
    try:
        startup = _wait(port, proc, log)
        t = time.perf_counter()
        _collect(port, folder, levels, engine)
        sweep = time.perf_counter() - t
    finally:
        _stop(proc)
    shutil.copy(log, folder / "server.log")
    isl = "true" if engine["scheduler_reserve_full_isl"] else "false"
    subprocess.run([KVP, "ingest", str(folder / "bench"), str(folder / "metrics.prom.jsonl"),
                    "--run", "load", "--out", str(folder / "report"),
                    "--scheduler-reserve-full-isl", isl], check=True, capture_output=True)
    timing = {"startup_s": round(startup, 1), "sweep_s": round(sweep, 1), "uptime": _uptime()}
    stamp.write_text(json.dumps(timing) + "\n")
    return timing


def _collect(port: int, folder: Path, levels: tuple[int, ...], engine: dict) -> None:
    """``kvpressure collect`` of ``levels`` against the server on ``port`` (builtin closed-loop
    client, the same seeded prompts at every call)."""
    subprocess.run([KVP, "collect", f"http://127.0.0.1:{port}", "--levels",
                    ",".join(map(str, levels)), "--out", str(folder), "--input-len",
                    str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--range-ratio",
                    str(RANGE_RATIO), "--prompts-per-level", str(PROMPTS_PER_LEVEL),
                    "--load-engine", "builtin", "--no-report", "--cooldown", "2",
                    "--engine-args", json.dumps({**engine, "enable_chunked_prefill": True})],
                   check=False)


def _curve(runs_dir: Path) -> pd.DataFrame:
    runs = pd.read_csv(runs_dir / "report" / "runs.csv")
    runs["concurrency"] = pd.to_numeric(runs["concurrency"], errors="coerce")
    return runs.dropna(subset=["concurrency"]).groupby("concurrency").mean(numeric_only=True)


def _twin_on(folder: Path, out: Path, focus: int, candidates: dict | None = None) -> tuple:
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.output import write_twin

    t = time.perf_counter()
    twin = build_twin(folder)
    twin.fit(bootstrap=200)
    report = twin.fit_report()
    fit_predict = time.perf_counter() - t
    remedies = twin.predict_remedies(focus=focus, limits={}, candidates=candidates)
    write_twin(twin, remedies, out)
    lo_levels = sorted(twin.workloads)[::2]
    held = sorted(twin.workloads)[1::2]
    if len(lo_levels) >= 3:
        lo_twin = build_twin(folder)
        lo_twin.fit(levels=lo_levels, bootstrap=100)
        lo = lo_twin.fit_report(levels=held).table
    else:
        lo = pd.DataFrame({"output_throughput_error_pct": [math.nan] * len(held),
                           "preemptions_measured": [math.nan] * len(held),
                           "preemptions_twin": [math.nan] * len(held)})
    table = report.table
    summary = {
        "verdict": report.verdict.text,
        "fits": report.verdict.fits,
        "knee": report.verdict.knee,
        "coefficients": {p: {"value": d["value"], "p05": d["p05"], "p95": d["p95"],
                             "source": d["source"]}
                         for p, d in twin.fitted.describe().items()},
        "settings": {k: [v, twin.settings_source[k]] for k, v in twin.settings.items()},
        "per_level": table[["concurrency", "output_throughput_measured",
                            "output_throughput_twin", "output_throughput_error_pct",
                            "preemptions_measured", "preemptions_twin",
                            "ttft_p95_s_error_pct", "itl_p95_s_error_pct",
                            "recompute_ratio_measured_low", "recompute_ratio_measured_high",
                            "recompute_ratio_twin"]].to_dict(orient="records"),
        "leave_levels_out": {"fitted_on": sorted(twin.workloads)[::2],
                             "throughput_error_pct": dict(zip(
                                 held, lo["output_throughput_error_pct"].round(2).tolist(),
                                 strict=True)),
                             "preemptions": dict(zip(held, zip(
                                 lo["preemptions_measured"].tolist(),
                                 lo["preemptions_twin"].tolist(), strict=True), strict=True))},
        "fit_predict_s": round(fit_predict, 2),
        "recommendation": remedies["recommendation"]["text"],
    }
    return twin, remedies, summary


def real(levels: tuple[int, ...], work: Path, port: int) -> dict:
    venv = _vllm_env()
    models = work / "models"
    out: dict = {"uptime_before": _uptime(), "setups": [], "levels": list(levels),
                 "load": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN,
                          "range_ratio": RANGE_RATIO, "block_size": BLOCK_SIZE,
                          "max_model_len": MAX_MODEL_LEN}}
    for k, setup in enumerate(REAL_SETUPS):
        try:
            out["setups"].append(_real_setup(k, setup, venv, models, work, port, levels))
        except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as exc:
            # One setup that fails (a server that does not start) leaves the others standing.
            print(f"(c) {setup['name']}: failed: {exc}", flush=True)
            out["setups"].append({"name": setup["name"], "failed": str(exc)})
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "bench_twin_real.partial.json").write_text(
            json.dumps(_rounded(out), indent=2, default=str) + "\n")
    out["uptime_after"] = _uptime()
    return out


def _real_setup(k: int, setup: dict, venv: Path, models: Path, work: Path, port: int,
                levels: tuple[int, ...]) -> dict:
    from kvpressure.twin.validation import preemption_errors

    focus = max(levels)
    model = _model(venv, setup["model"], models)
    folder = work / setup["name"]
    print(f"(c) {setup['name']}: measuring ({_uptime()})", flush=True)
    timing = _measure(venv, model, setup["blocks"], setup["engine"], folder, port, levels)
    remedies_to_measure = {}
    with_remedies = setup.get("remedies", k == 0)
    if with_remedies:
        # the pool doubled (more KV memory): an effect well above the noise of a level here
        remedies_to_measure = {name: _remedy_overrides(setup, name)
                               for name in ("max_num_seqs_pool", "pool_doubled")}
        if not setup["engine"]["scheduler_reserve_full_isl"]:
            # admission by the full prompt, vLLM 0.33's rule, instead of by the first chunk
            remedies_to_measure["full_isl_admission"] = _remedy_overrides(
                setup, "full_isl_admission")
        if setup["engine"]["max_num_batched_tokens"] > 128:
            # chunked prefill in pieces smaller than a prompt: more steps, each cheaper
            remedies_to_measure["max_num_batched_tokens_128"] = {"max_num_batched_tokens": 128}
    if ONLY_REMEDIES is not None:
        remedies_to_measure = {name: ov for name, ov in remedies_to_measure.items()
                               if name in ONLY_REMEDIES}
    twin, remedies, summary = _twin_on(folder, OUT / "twin_real" / setup["name"], focus,
                                       remedies_to_measure)
    summary.update(name=setup["name"], model=setup["model"], blocks=setup["blocks"],
                   engine=setup["engine"], timing=timing, uptime=_uptime())
    print(f"    {summary['verdict']}; fit+predict {summary['fit_predict_s']} s", flush=True)
    knee = summary["knee"]["measured"]
    base = _curve(folder)
    twin_base = {c: twin.report.twin_levels[c] for c in twin.report.twin_levels}
    summary["preemptions"] = preemption_errors(
        {c: base.loc[c, "preemptions"] for c in levels if c in base.index},
        {c: t["preemptions"] for c, t in twin_base.items()}, knee)
    summary["client_turnaround"] = twin.turnaround()
    if with_remedies:
        summary["noise"] = _noise(venv, model, setup, folder, work, port, levels)
    summary["remedies_measured"] = []
    for rname, ov in remedies_to_measure.items():
        rfolder = work / f"{setup['name']}__{rname}"
        print(f"(c) {setup['name']} remedy {rname} {ov}: measuring ({_uptime()})",
              flush=True)
        engine = {**setup["engine"], **{k: v for k, v in ov.items() if k != "num_gpu_blocks"}}
        rt = _measure(venv, model, ov.get("num_gpu_blocks", setup["blocks"]), engine, rfolder,
                      port, levels)
        summary["remedies_measured"].append(
            _remedy_entry(twin, remedies, rname, ov, _curve(rfolder), base, twin_base, levels,
                          focus, knee, rt))
    return summary


def _remedy_entry(twin, remedies: dict, rname: str, ov: dict, measured: pd.DataFrame,
                  base: pd.DataFrame, twin_base: dict, levels: tuple[int, ...], focus: int,
                  knee: int | None, timing: dict) -> dict:
    """One measured remedy against the twin's prediction: per level, at the focus level, and
    over the levels at and past the baseline's measured knee."""
    from kvpressure.twin.validation import past_knee_change, preemption_errors

    rows, predicted = [], {}
    for c in levels:
        if c not in measured.index or c not in twin.workloads:
            continue
        pred = predicted[c] = twin.predict_level(c, ov)
        m = measured.loc[c]
        rows.append({"concurrency": c, "throughput_measured": m["output_throughput"],
                     "throughput_twin": pred["output_throughput"],
                     "throughput_error_pct": _pct(pred["output_throughput"],
                                                  m["output_throughput"]),
                     "preemptions_measured": m.get("preemptions"),
                     "preemptions_twin": pred["preemptions"]})
    cand = next(c for c in remedies["candidates"] if c["setting"] == rname)
    measured_change = _pct(measured.loc[focus, "output_throughput"],
                           base.loc[focus, "output_throughput"])
    thr = "output_throughput"
    tail_measured = past_knee_change({c: base.loc[c, thr] for c in base.index},
                                     {c: measured.loc[c, thr] for c in measured.index}, knee)
    tail_twin = past_knee_change({c: t[thr] for c, t in twin_base.items()},
                                 {c: p[thr] for c, p in predicted.items()}, knee)
    entry = {"remedy": rname, "overrides": ov, "timing": timing, "per_level": rows,
             "change_at_focus_predicted_pct": round(cand["throughput_change_pct"], 2),
             "change_at_focus_predicted_interval_pct":
                 cand["throughput_change_pct_p05_p50_p95"],
             "change_at_focus_measured_pct": measured_change,
             "past_knee": {"levels": tail_measured["levels"], "measured": tail_measured,
                           "predicted": tail_twin,
                           "error_pp": tail_twin["change_of_mean_pct"]
                           - tail_measured["change_of_mean_pct"]},
             "preemptions": preemption_errors(
                 {c: measured.loc[c, "preemptions"] for c in measured.index},
                 {c: p["preemptions"] for c, p in predicted.items()}, knee),
             "uptime": _uptime()}
    entry["change_error_pp"] = (round(entry["change_at_focus_predicted_pct"] - measured_change, 2)
                                if measured_change is not None else None)
    sp = tail_measured["spread_pct"]
    print(f"    {rname}: at c={focus} predicted {entry['change_at_focus_predicted_pct']:+.1f}%, "
          f"measured {measured_change:+.1f}%; past the knee (c>={knee}) predicted "
          f"{tail_twin['change_of_mean_pct']:+.1f}%, measured "
          f"{tail_measured['change_of_mean_pct']:+.1f}% (levels {sp['min']:+.0f}% to "
          f"{sp['max']:+.0f}%)", flush=True)
    return entry


AB_LEVELS = (4, 8, 24)


def _remedy_overrides(setup: dict, remedy: str) -> dict:
    from kvpressure.twin.remedies import pool_holds
    from kvpressure.twin.workload import LevelWorkload

    first = LevelWorkload(0, (INPUT_LEN,), (OUTPUT_LEN,), True)
    holds = pool_holds({"block_size": BLOCK_SIZE, "num_gpu_blocks": setup["blocks"]}, first)
    return {"max_num_seqs_pool": {"max_num_seqs": holds},
            "pool_doubled": {"num_gpu_blocks": 2 * setup["blocks"]},
            "full_isl_admission": {"scheduler_reserve_full_isl": True}}[remedy]


def _bench_result(folder: Path, concurrency: int) -> dict:
    return json.loads((folder / "bench" / f"c{concurrency}.json").read_text())


def ab(remedies: list[str], rounds: int, work: Path, port: int,
       setup_name: str | None = None) -> dict:
    """A setup's baseline and some remedies on servers started once and kept up (one each),
    measured in turn: each round runs every level on every server back to back, the order
    rotated from one level and round to the next (a drift within a round then cancels over
    the rounds). The machine's speed drifts between runs by as much as a small remedy changes
    throughput, and a drift slower than a round cancels in each pair's own change (the remedy
    against the baseline of the same round and level): the change per level is the mean over
    the rounds with its 95% interval (``live.paired``, as ``kvpressure verify-remedy`` reads
    it). c=4 is the control
    for a remedy on ``max_num_seqs`` (at or above what the pool holds) or on the pool (nothing
    preempted there). The idle servers wait on their request queues.

    The twin is fitted on the setup's sweep measured by ``--real`` (8 levels on a restarted
    server) and predicts each remedy against the baseline at each level."""
    from kvpressure.live.paired import arm_order, measured_change
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.validation import paired_change

    setup = (next((s for s in REAL_SETUPS if s["name"] == setup_name), None) if setup_name
             else REAL_SETUPS[0])
    if setup is None:
        raise SystemExit(f"--ab-setup {setup_name}: not one of "
                         f"{', '.join(s['name'] for s in REAL_SETUPS)}")
    fitted_on = work / setup["name"]
    if not (fitted_on / "report" / "runs.csv").is_file():
        raise SystemExit(f"--ab: no measured sweep in {fitted_on} to fit the twin on; run "
                         f"--real --no-sim --setups {setup['name']} --work {work} first")
    venv = _vllm_env()
    model = _model(venv, setup["model"], work / "models")
    arms = {"baseline": {}, **{name: _remedy_overrides(setup, name) for name in remedies}}
    names = list(arms)
    ports = {arm: port + k for k, arm in enumerate(names)}
    engines = {arm: {**setup["engine"], **{k: v for k, v in ov.items() if k != "num_gpu_blocks"}}
               for arm, ov in arms.items()}
    base = work / f"ab_{setup['name']}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    procs: dict[str, subprocess.Popen] = {}
    runs: list[dict] = []
    try:
        for arm, ov in arms.items():
            procs[arm] = _start(venv, model, ov.get("num_gpu_blocks", setup["blocks"]),
                                engines[arm], ports[arm], base / f"{arm}.server.log")
        for arm in arms:
            _wait(ports[arm], procs[arm], base / f"{arm}.server.log")
        for r in range(rounds):
            print(f"(ab) {setup['name']} round {r} ({_uptime()})", flush=True)
            for k, c in enumerate(AB_LEVELS):
                for arm in arm_order(names, r, k):
                    folder = base / f"r{r}_c{c}_{arm}"
                    _collect(ports[arm], folder, (c,), engines[arm])
                    got = _bench_result(folder, c)
                    runs.append({"round": r, "concurrency": c, "arm": arm,
                                 "output_throughput": got["output_throughput"],
                                 "completed": got["completed"], "folder": folder.name})
    finally:
        for proc in procs.values():
            _stop(proc)
    # Preemptions from each run's own scrape log, read once nothing is measuring.
    for run in runs:
        run["preemptions"] = _ingested_preemptions(base / run["folder"], engines[run["arm"]],
                                                   run["concurrency"])
    frame = pd.DataFrame(runs)
    frame.to_csv(base / "runs.csv", index=False)
    twin = build_twin(fitted_on)
    twin.fit(bootstrap=100)
    knee = twin.fit_report().verdict.knee["measured"]
    tail = [c for c in AB_LEVELS if knee is None or c >= knee]
    thr = "output_throughput"
    baseline_twin = {c: twin.predict_level(c, {})[thr] for c in AB_LEVELS}

    def arm_values(arm: str, c: int, col: str = thr) -> list[float]:
        sel = frame[(frame["arm"] == arm) & (frame["concurrency"] == c)].sort_values("round")
        return sel[col].tolist()

    def tail_means(arm: str) -> list[float]:
        return [float(np.mean([arm_values(arm, c)[r] for c in tail])) for r in range(rounds)]

    out = {"setup": setup["name"], "rounds": rounds, "levels": list(AB_LEVELS),
           "fitted_on": str(fitted_on), "knee_measured": knee, "remedies": {}}
    for name in remedies:
        ov = arms[name]
        predicted = {c: twin.predict_level(c, ov)[thr] for c in AB_LEVELS}
        rows = []
        print(f"    {name} {ov}:", flush=True)
        for c in AB_LEVELS:
            change = measured_change(runs, c, "baseline", name)
            pred = _pct(predicted[c], baseline_twin[c])
            rows.append({"concurrency": c, "measured": change, "predicted_change_pct": pred,
                         "preemptions_baseline": arm_values("baseline", c, "preemptions"),
                         "preemptions_remedy": arm_values(name, c, "preemptions"),
                         "preemptions_twin": twin.predict_level(c, ov)["preemptions"]})
            lo, hi = change["interval_pct"]
            print(f"      c={c}: measured {change['mean_pct']:+.1f}% (95% {lo:+.1f} to "
                  f"{hi:+.1f}; rounds {', '.join(f'{x:+.1f}' for x in change['per_pair_pct'])})"
                  f", predicted {pred:+.1f}%", flush=True)
        # Past the knee: per round, the mean over those levels, paired the same way.
        tail_change = paired_change(tail_means("baseline"), tail_means(name))
        tail_pred = _pct(np.mean([predicted[c] for c in tail]),
                         np.mean([baseline_twin[c] for c in tail]))
        lo, hi = tail_change["interval_pct"]
        print(f"      past the knee (c>={knee}): measured {tail_change['mean_pct']:+.1f}% "
              f"(95% {lo:+.1f} to {hi:+.1f}), predicted {tail_pred:+.1f}%", flush=True)
        out["remedies"][name] = {
            "overrides": ov, "levels": rows,
            "past_knee": {"levels": tail, "measured": tail_change,
                          "predicted_change_pct": tail_pred,
                          "error_pp": tail_pred - tail_change["mean_pct"]}}
    out["runs"] = runs
    out["uptime_after"] = _uptime()
    return out


def _ingested_preemptions(folder: Path, engine: dict, concurrency: int) -> float | None:
    isl = "true" if engine["scheduler_reserve_full_isl"] else "false"
    done = subprocess.run([KVP, "ingest", str(folder / "bench"), str(folder / "metrics.prom.jsonl"),
                           "--run", "load", "--out", str(folder / "report"),
                           "--scheduler-reserve-full-isl", isl], capture_output=True)
    if done.returncode != 0:
        return None
    cur = _curve(folder)
    return float(cur.loc[concurrency, "preemptions"]) if concurrency in cur.index else None


def _noise(venv: Path, model: Path, setup: dict, folder: Path, work: Path, port: int,
           levels: tuple[int, ...]) -> dict:
    """The same setup measured a second time on a restarted server: the run-to-run spread
    per level that the twin's errors are read against."""
    from kvpressure.twin.validation import run_to_run

    again = work / f"{setup['name']}__repeat"
    print(f"(c) {setup['name']}: measured again for the noise ({_uptime()})", flush=True)
    timing = _measure(venv, model, setup["blocks"], setup["engine"], again, port, levels)

    def table(f: Path) -> dict:
        cur = _curve(f)
        return {int(c): {"output_throughput": cur.loc[c, "output_throughput"],
                         "preemptions": cur.loc[c, "preemptions"]} for c in cur.index}

    out = run_to_run(table(folder), table(again))
    out["timing"] = timing
    print(f"    run to run: throughput mean |diff| {out['throughput_mean_abs_diff_pct']:.1f}%, "
          f"max {out['throughput_max_abs_diff_pct']:.1f}%; preemptions max |diff| "
          f"{out['preemptions_max_abs_diff']:.0f}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", action="store_true", help="also (c): real vLLM (CPU build)")
    ap.add_argument("--no-sim", action="store_true", help="skip (a) and (b)")
    ap.add_argument("--levels", default=",".join(map(str, REAL_LEVELS)),
                    help="levels of the real sweeps")
    ap.add_argument("--work", type=Path, default=OUT / "twin_real_runs",
                    help="where the real sweeps and models go")
    ap.add_argument("--port", type=int, default=18471)
    ap.add_argument("--setups", help="comma-separated names of the real setups to run")
    ap.add_argument("--remedies", help="comma-separated names of the remedies to measure "
                    "(default: all)")
    ap.add_argument("--ab", metavar="REMEDIES", help="measure a setup's baseline and these "
                    "remedies (comma-separated: max_num_seqs_pool, pool_doubled, "
                    "full_isl_admission) in turn on live servers, one each")
    ap.add_argument("--ab-setup", help="the setup for --ab (default: the first)")
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds for --ab")
    ap.add_argument("--reuse", action="store_true",
                    help="keep sweeps already measured in --work; refit the twins on them")
    args = ap.parse_args()
    global REUSE, ONLY_REMEDIES
    REUSE = args.reuse
    if args.remedies:
        ONLY_REMEDIES = set(args.remedies.split(","))
    if args.ab:
        out = ab(args.ab.split(","), args.rounds, args.work, args.port, args.ab_setup)
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"bench_twin_ab_{out['setup']}.json"
        path.write_text(json.dumps(_rounded(out), indent=2, default=str) + "\n")
        print(f"written: {path}")
        return 0
    result: dict = {"uptime": _uptime()}
    if not args.no_sim:
        result["simulated"] = simulated()
    if args.real:
        if args.setups:
            keep = set(args.setups.split(","))
            REAL_SETUPS[:] = [s for s in REAL_SETUPS if s["name"] in keep]
        levels = tuple(int(x) for x in args.levels.split(","))
        result["real"] = real(levels, args.work, args.port)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "bench_twin.json" if not args.no_sim else "bench_twin_real.json"
    (OUT / name).write_text(json.dumps(_rounded(result), indent=2, default=str) + "\n")
    print(f"written: {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
