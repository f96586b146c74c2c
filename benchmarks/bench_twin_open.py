"""A real open-loop sweep on the CPU vLLM server: requests sent at a rate, not by clients.

    .venv/bin/python benchmarks/bench_twin_open.py                # the kept sweep, checked
    .venv/bin/python benchmarks/bench_twin_open.py --real         # the sweep, ~5 min
    .venv/bin/python benchmarks/bench_twin_open.py --real --rates 1,2,3,4,6,8,12,16
    .venv/bin/python benchmarks/bench_twin_open.py --ab max_num_seqs_pool --rounds 3
    .venv/bin/python benchmarks/bench_twin_open.py --test-data tests/data/twin_real_open

**The sweep.** One server of a ``bench_twin.REAL_SETUPS`` setup (default
``mid_pool64_chunk128_nocache``: 64 KV blocks of 32 tokens, prompts prefilled in 128-token
chunks, admission by the first chunk, no prefix cache), started once with its iteration-details
log on. ``kvpressure scrape`` records its ``/metrics`` every second for the whole sweep while
``vllm bench serve`` runs once per rate, in increasing order, with the closed sweeps' dataset
(random, 256 +- 25% prompt and 128 +- 25% output tokens, ``--ignore-eos``, 48 prompts, seed 0)
as an open loop: ``--request-rate R --burstiness 1`` (Poisson arrivals) and no
``--max-concurrency``. Each result is saved ``--save-detailed`` (the per-request
``start_times`` the twin replays) and stamped with the level's unix window, from launching the
child to its exit, the way ``kvpressure collect`` stamps it, so ingestion cuts the scrape log at
each level, and with ``kvpressure_clock`` (``unix`` and ``perf_counter`` read together at the
launch: ``start_times`` are the client's ``time.perf_counter()``, so ``start_time + unix -
perf_counter`` is a request's unix send time). The server idles 3 s between rates. Then
``kvpressure ingest`` of the results and the scrape log into ``report/``, checked: one row per
rate, its ``request_rate`` set, the concurrency empty, the preemptions of each row, summed,
equal to the counter's increase over the scrape log.

**The remedy, paired** (``--ab``): the baseline and each remedy (``bench_twin`` names:
``max_num_seqs_pool``, ``pool_doubled``, ``full_isl_admission``) on servers of their own,
started once, each scraped the whole time; every round runs each rate of ``--ab-rates`` on
each server back to back, the order rotated from one rate and round to the next. A remedy's
change of output throughput is read per (rate, round) against the baseline of the same pair,
and summarised per rate by ``twin.validation.paired_change`` (mean and 95% interval). Below
saturation an open loop's throughput is the offered load whatever the server does: a rate
there (1 or 2 req/s on the default setup) is a control; the default ``--ab-rates`` 3 and 6 are
at and past the knee (the baseline preempts at both).

Without ``--real``, ``--ab`` or ``--test-data`` nothing is measured: the sweep kept in
``tests/data/twin_real_open/`` is ingested, checked and printed, then the twin is checked
(``--twin`` alone skips the first part).

**The twin against them** (``--twin``): the open-loop twin (``kvpressure.twin``, fitted on the
server's steps) of the kept sweep and of the measured one: throughput and preemptions per
rate, the knee, the time to build, fit, check and predict the remedies, and fitted on every
other rate with the rest predicted. For each paired measurement recorded in the results file,
the twin of each round's baseline (its rates' steps in the baseline server's log, the machine
as it was in that round) predicts the remedy, against the change measured in the same round.

``--test-data DEST`` cuts the measured sweep small for the tests (bench results without the
per-token lists, the scrape log's ``vllm:`` families over the sweep, the server log's steps
over the sweep).

Results: stdout and ``benchmarks/out/bench_twin_open.json`` (``sweep``, ``ab``, ``twin``); the
measured folders under ``benchmarks/out/twin_open/`` (``<setup>/`` for the sweep, ``ab/<arm>/``
with one ``round<k>/`` of bench results per round for the pairs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from bench_twin import (
    INPUT_LEN,
    KVP,
    OUT,
    OUTPUT_LEN,
    RANGE_RATIO,
    REAL_SETUPS,
    ROOT,
    _model,
    _remedy_overrides,
    _rounded,
    _start,
    _stop,
    _uptime,
    _vllm_env,
    _wait,
)

WORK = OUT / "twin_open"
MODELS = OUT / "twin_real_runs" / "models"  # where bench_twin.py --real keeps the models
RESULT = OUT / "bench_twin_open.json"
KEPT = ROOT / "tests" / "data" / "twin_real_open"
RATES = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)
AB_RATES = (3.0, 6.0)
NUM_PROMPTS = 48
COOLDOWN_S = 3.0
RATE_TIMEOUT_S = 900.0
PREEMPTIONS = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})? (\S+)$", re.M)


def _rate_name(rate: float) -> str:
    return f"rate-{rate:g}"


class Scraper:
    """``kvpressure scrape`` of a server's ``/metrics`` every second, in the background from
    before the first level to after the last, so every level's window has a scrape on each
    side."""

    def __init__(self, port: int, log: Path) -> None:
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._err = (log.parent / f"{log.name}.scrape.err").open("w")
        self.proc = subprocess.Popen(
            [KVP, "scrape", f"http://127.0.0.1:{port}/metrics", "--out", str(log),
             "--interval", "1"], stdout=self._err, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_first(self, timeout: float = 60.0) -> None:
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpressure scrape exited ({self.proc.returncode}); see "
                                   f"{self._err.name}")
            if self.log.is_file() and self.log.read_bytes().count(b"\n") >= 2:
                return
            time.sleep(0.5)
        raise RuntimeError(f"kvpressure scrape wrote nothing within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Ctrl-C is its way to stop with every scrape taken kept.
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def run_rate(vllm: Path, port: int, model: Path, rate: float, out_dir: Path, logs: Path
             ) -> tuple[dict | None, str | None]:
    """One rate as an open loop with ``vllm bench serve``; the result file stamped with the
    level's window. Returns the result, or None and why (vLLM's own result has a ``failed``
    count, so the reason travels apart)."""
    name = _rate_name(rate)
    out_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [str(vllm), "bench", "serve", "--backend", "vllm",
           "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
           "--model", "tiny", "--tokenizer", str(model),
           "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
           "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", str(RANGE_RATIO),
           "--ignore-eos", "--temperature", "0", "--num-prompts", str(NUM_PROMPTS),
           "--request-rate", f"{rate:g}", "--burstiness", "1", "--seed", "0",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
           "--num-warmups", "0", "--ready-check-timeout-sec", "0",
           "--save-result", "--save-detailed", "--result-dir", str(out_dir),
           "--result-filename", f"{name}.json", "--disable-tqdm"]
    launched = time.time()
    # vLLM stamps each request's start_times with the client's time.perf_counter(), the
    # machine-wide monotonic clock on Linux: both read here, together, turn them into unix
    # send times (start_time + unix - perf_counter), placed against the server's steps.
    clock = {"unix": launched, "perf_counter": time.perf_counter()}
    with (logs / f"{name}.log").open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=RATE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return None, f"timeout ({RATE_TIMEOUT_S:g} s)"
        except BaseException:
            _stop(proc)
            raise
    exited = time.time()
    path = out_dir / f"{name}.json"
    if code != 0 or not path.is_file():
        tail = (logs / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:]
        return None, f"vllm bench serve exited with {code}: {(tail or ['-'])[0][:200]}"
    result = json.loads(path.read_text())
    # The same two fields kvpressure collect adds (live/results.py): the window places the
    # level in the scrape log finer than vLLM's whole-second 'date'.
    result["kvpressure_window"] = {"start": launched, "end": exited}
    result["kvpressure_level"] = {"complete": True, "reason": None}
    result["kvpressure_clock"] = clock
    path.write_text(json.dumps(result) + "\n")
    return result, None


def scrape_preemptions(log: Path) -> tuple[float, float, float]:
    """The first and last scrape times and the preemption counter's increase between them,
    read straight from the scrape log's text (no restart within one server's log)."""
    first = last = None
    values = []
    opener = gzip.open if log.suffix == ".gz" else open
    with opener(log, "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            if "text" not in rec:
                continue
            got = PREEMPTIONS.findall(rec["text"])
            if not got:
                continue
            first = rec["t"] if first is None else first
            last = rec["t"]
            values.append(sum(float(v) for v in got))
    if not values:
        raise RuntimeError(f"{log}: no vllm:num_preemptions_total")
    return first, last, values[-1] - values[0]


def ingest(bench: Path, metrics: Path, out: Path, engine: dict) -> pd.DataFrame:
    isl = "true" if engine["scheduler_reserve_full_isl"] else "false"
    done = subprocess.run([KVP, "ingest", str(bench), str(metrics), "--run", "load", "--out",
                           str(out), "--scheduler-reserve-full-isl", isl, "--force"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kvpressure ingest {bench} {metrics} exited {done.returncode}: "
                           f"{done.stderr.strip()[-500:]}")
    return pd.read_csv(out / "runs.csv")


def _setup(name: str) -> dict:
    setup = next((s for s in REAL_SETUPS if s["name"] == name), None)
    if setup is None:
        raise SystemExit(f"--setup {name}: not one of {', '.join(s['name'] for s in REAL_SETUPS)}")
    return setup


# --- the sweep --------------------------------------------------------------------------------
def sweep(setup: dict, rates: list[float], work: Path, port: int, models: Path) -> dict:
    venv = _vllm_env()
    model = _model(venv, setup["model"], models)
    folder = work / setup["name"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log = work / f"{setup['name']}.server.log"
    metrics = folder / "metrics.prom.jsonl"
    levels: list[dict] = []
    print(f"sweep {setup['name']}: rates {', '.join(f'{r:g}' for r in rates)} "
          f"({_uptime()})", flush=True)
    proc = _start(venv, model, setup["blocks"], setup["engine"], port, log)
    scraper = None
    try:
        startup = _wait(port, proc, log)
        scraper = Scraper(port, metrics)
        scraper.wait_first()
        time.sleep(COOLDOWN_S)
        t = time.perf_counter()
        for rate in rates:
            got, why = run_rate(venv / "bin" / "vllm", port, model, rate, folder / "bench",
                                folder / "bench_logs")
            if got is None:
                levels.append({"rate": rate, "incomplete": why})
                print(f"  rate {rate:g}: {why}; the sweep stops here", flush=True)
                time.sleep(COOLDOWN_S)  # a scrape after the cut level's end, as after each
                break
            levels.append({"rate": rate, "window": got["kvpressure_window"]})
            print(f"  rate {rate:g}: {got['completed']} done in {got['duration']:.1f} s, "
                  f"{got['output_throughput']:.0f} output tok/s, "
                  f"{got['request_throughput']:.2f} req/s", flush=True)
            time.sleep(COOLDOWN_S)
        sweep_s = time.perf_counter() - t
    finally:
        if scraper is not None:
            scraper.stop()
        _stop(proc)
    shutil.copy(log, folder / "server.log")
    runs = ingest(folder / "bench", metrics, folder / "report", setup["engine"])
    return {"setup": setup["name"], "model": setup["model"], "blocks": setup["blocks"],
            "engine": setup["engine"], "num_prompts": NUM_PROMPTS, "startup_s": round(startup, 1),
            "sweep_s": round(sweep_s, 1), "levels": levels, "uptime": _uptime(),
            **summarise(metrics, runs)}


def summarise(metrics: Path, runs: pd.DataFrame) -> dict:
    """Per rate: the measured figures and what ingestion made of the level; the checks the
    twin relies on."""
    first, last, increase = scrape_preemptions(metrics)
    rows = []
    problems = []
    for _, row in runs.sort_values("request_rate").iterrows():
        source = str(row["source"]).split(" + ")[0]
        res = json.loads(Path(source).read_text())
        rows.append({
            "rate": row["request_rate"], "completed": res["completed"],
            "failed": res.get("failed"), "duration_s": res["duration"],
            "output_throughput": res["output_throughput"],
            "request_throughput": res["request_throughput"],
            "max_concurrent_requests": res.get("max_concurrent_requests"),
            "preemptions": row["preemptions"],
            "recompute_ratio": row.get("recompute_ratio"),
            "ttft_p50_ms": res["p50_ttft_ms"], "ttft_p95_ms": res["p95_ttft_ms"],
            "itl_p50_ms": res["p50_itl_ms"], "itl_p95_ms": res["p95_itl_ms"],
            "window": [row["t_start"], row["t_end"]]})
        if not pd.isna(row["concurrency"]):
            problems.append(f"{source}: concurrency {row['concurrency']} (an open loop has none)")
        if pd.isna(row["preemptions"]):
            problems.append(f"{source}: no preemptions")
        if not first <= row["t_start"] < row["t_end"] <= last:
            problems.append(f"{source}: window outside the scrape log's span")
    total = float(runs["preemptions"].sum())
    if total != increase:
        problems.append(f"preemptions summed over the rates {total:g} != the counter's increase "
                        f"over the scrape log {increase:g}")
    return {"rates": rows, "scrape_span": [first, last],
            "preemptions_counter_increase": increase, "preemptions_summed": total,
            "ingestion_problems": problems}


def _print_sweep(result: dict) -> None:
    print(f"\n{'rate':>5} {'done':>4} {'req/s':>6} {'out tok/s':>9} {'peak conc':>9} "
          f"{'preempt':>7} {'TTFT p50/p95 ms':>16} {'ITL p50/p95 ms':>15}")
    for r in result["rates"]:
        print(f"{r['rate']:>5g} {r['completed']:>4} {r['request_throughput']:>6.2f} "
              f"{r['output_throughput']:>9.0f} {r['max_concurrent_requests'] or 0:>9} "
              f"{r['preemptions']:>7.0f} {r['ttft_p50_ms']:>7.0f}/{r['ttft_p95_ms']:<8.0f} "
              f"{r['itl_p50_ms']:>6.1f}/{r['itl_p95_ms']:<8.1f}")
    print(f"preemptions: {result['preemptions_summed']:g} over the rates, the counter rose "
          f"{result['preemptions_counter_increase']:g} over the scrape log")
    for p in result["ingestion_problems"]:
        print(f"  ingestion: {p}")


# --- the remedy, paired -----------------------------------------------------------------------
def ab(setup: dict, remedies: list[str], rounds: int, rates: list[float], work: Path,
       port: int, models: Path) -> dict:
    """Baseline and remedies on servers started once; per round every rate on every server
    back to back, the order rotated (a drift within a round then cancels over the rounds)."""
    from kvpressure.twin.validation import paired_change

    venv = _vllm_env()
    model = _model(venv, setup["model"], models)
    arms = {"baseline": {}, **{name: _remedy_overrides(setup, name) for name in remedies}}
    names = list(arms)
    ports = {arm: port + k for k, arm in enumerate(names)}
    engines = {arm: {**setup["engine"], **{k: v for k, v in ov.items() if k != "num_gpu_blocks"}}
               for arm, ov in arms.items()}
    base = work / "ab"
    shutil.rmtree(base, ignore_errors=True)
    for arm in names:
        (base / arm).mkdir(parents=True)
    procs: dict[str, subprocess.Popen] = {}
    scrapers: dict[str, Scraper] = {}
    runs: list[dict] = []
    logs = {arm: work / f"ab_{arm}.server.log" for arm in names}
    try:
        for arm, ov in arms.items():
            procs[arm] = _start(venv, model, ov.get("num_gpu_blocks", setup["blocks"]),
                                engines[arm], ports[arm], logs[arm])
        for arm in names:
            _wait(ports[arm], procs[arm], logs[arm])
            scrapers[arm] = Scraper(ports[arm], base / arm / "metrics.prom.jsonl")
        for arm in names:
            scrapers[arm].wait_first()
        time.sleep(COOLDOWN_S)
        for r in range(rounds):
            print(f"(ab) {setup['name']} round {r} ({_uptime()})", flush=True)
            for k, rate in enumerate(rates):
                shift = (r + k) % len(names)
                for arm in names[shift:] + names[:shift]:
                    got, why = run_rate(venv / "bin" / "vllm", ports[arm], model, rate,
                                        base / arm / f"round{r}", base / arm / f"logs_round{r}")
                    if got is None:
                        raise RuntimeError(f"{arm} round {r} rate {rate:g}: {why}")
                    runs.append({"round": r, "rate": rate, "arm": arm,
                                 "output_throughput": got["output_throughput"],
                                 "request_throughput": got["request_throughput"],
                                 "completed": got["completed"]})
                    print(f"    rate {rate:g} {arm}: {got['output_throughput']:.0f} tok/s",
                          flush=True)
                    time.sleep(COOLDOWN_S)
    finally:
        for s in scrapers.values():
            s.stop()
        for proc in procs.values():
            _stop(proc)
    for arm in names:
        shutil.copy(logs[arm], base / arm / "server.log")
    # Preemptions from each arm's scrape log, cut at each run's window, once nothing measures.
    for r in range(rounds):
        for arm in names:
            table = ingest(base / arm / f"round{r}", base / arm / "metrics.prom.jsonl",
                           base / arm / f"report_round{r}", engines[arm])
            by_rate = dict(zip(table["request_rate"], table["preemptions"], strict=True))
            for run in runs:
                if run["round"] == r and run["arm"] == arm:
                    run["preemptions"] = by_rate.get(run["rate"])
    frame = pd.DataFrame(runs)
    frame.to_csv(base / "runs.csv", index=False)

    def values(arm: str, rate: float, col: str = "output_throughput") -> list:
        sel = frame[(frame["arm"] == arm) & (frame["rate"] == rate)].sort_values("round")
        return sel[col].tolist()

    out = {"setup": setup["name"], "rounds": rounds, "rates": rates,
           "folder": str(base), "remedies": {}}
    for name in remedies:
        rows = []
        print(f"    {name} {arms[name]}:", flush=True)
        for rate in rates:
            change = paired_change(values("baseline", rate), values(name, rate))
            rows.append({"rate": rate, "change": change,
                         "baseline_output_throughput": values("baseline", rate),
                         "remedy_output_throughput": values(name, rate),
                         "preemptions_baseline": values("baseline", rate, "preemptions"),
                         "preemptions_remedy": values(name, rate, "preemptions")})
            lo, hi = change["interval_pct"]
            print(f"      rate {rate:g}: {change['mean_pct']:+.1f}% (95% {lo:+.1f} to {hi:+.1f};"
                  f" rounds {', '.join(f'{x:+.1f}' for x in change['per_pair_pct'])}); "
                  f"preemptions {values('baseline', rate, 'preemptions')} -> "
                  f"{values(name, rate, 'preemptions')}", flush=True)
        out["remedies"][name] = {"overrides": arms[name], "rates": rows}
    out["runs"] = runs
    out["uptime_after"] = _uptime()
    return out


# --- the twin against them -------------------------------------------------------------------
def twin_on_sweep(report: Path, server_log: Path) -> dict:
    """The open-loop twin of an ingested sweep (fitted on the server's steps inside the rates'
    windows): measured against twin per rate, the knee, the time to build, fit, check and
    predict the remedies; then fitted on every other rate's steps and the others predicted."""
    from kvpressure.twin.api import build_twin
    from kvpressure.twin.fit_report import growth_stops

    t = time.perf_counter()
    twin = build_twin(report, server_log=server_log)
    twin.fit()
    table = twin.fit_report().table
    advice = twin.predict_remedies()
    elapsed = time.perf_counter() - t
    rates = [float(x) for x in table["request_rate"]]
    rows = [{"rate": x, "throughput_measured": r["output_throughput_measured"],
             "throughput_twin": r["output_throughput_twin"],
             "throughput_error_pct": r["output_throughput_error_pct"],
             "preemptions_measured": r["preemptions_measured"],
             "preemptions_twin": r["preemptions_twin"],
             "ttft_p95_error_pct": r["ttft_p95_s_error_pct"],
             "itl_p95_error_pct": r["itl_p95_s_error_pct"]}
            for x, (_, r) in zip(rates, table.iterrows(), strict=True)]
    held = rates[1::2]
    twin.fit(levels=rates[0::2])
    out_table = twin.fit_report(levels=held).table
    return {
        "fit": {k: v["value"] for k, v in twin.fitted.describe().items()},
        "rates": rows,
        "knee": {"measured": growth_stops(rates, table["output_throughput_measured"].tolist()),
                 "twin": growth_stops(rates, table["output_throughput_twin"].tolist())},
        "build_fit_report_remedies_s": elapsed,
        "recommendation": advice["recommendation"]["text"],
        "leave_rates_out": {"fitted_on": rates[0::2], "predicted": [
            {"rate": float(x), "throughput_error_pct": e, "preemptions_measured": pm,
             "preemptions_twin": pt}
            for x, e, pm, pt in zip(out_table["request_rate"],
                                    out_table["output_throughput_error_pct"],
                                    out_table["preemptions_measured"],
                                    out_table["preemptions_twin"], strict=True)]},
    }


def twin_on_pairs(result: dict) -> dict:
    """Each round of a paired remedy measurement: the twin fitted on that round's baseline
    (its rates' steps in the baseline server's log: the machine as it was then), the remedy
    predicted on it, against the change measured in the same round."""
    from kvpressure.twin.api import build_twin

    folder = ROOT / result["folder"]  # an absolute folder stays itself
    out = {}
    for name, rem in result["remedies"].items():
        per_rate = []
        for entry in rem["rates"]:
            per_rate.append({"rate": entry["rate"], "measured": entry["change"],
                             "predicted_per_round_pct": []})
        for r in range(result["rounds"]):
            twin = build_twin(folder / "baseline" / f"report_round{r}",
                              server_log=folder / "baseline" / "server.log")
            twin.fit(bootstrap=0)
            for row in per_rate:
                base = twin.predict_level(row["rate"])
                new = twin.predict_level(row["rate"], rem["overrides"])
                row["predicted_per_round_pct"].append(
                    100.0 * (new["output_throughput"] / base["output_throughput"] - 1.0))
        for row in per_rate:
            pred = row["predicted_per_round_pct"]
            row["predicted_mean_pct"] = sum(pred) / len(pred)
            row["error_pp"] = row["predicted_mean_pct"] - row["measured"]["mean_pct"]
            lo, hi = row["measured"]["interval_pct"]
            row["prediction_inside_interval"] = lo <= row["predicted_mean_pct"] <= hi
        out[name] = {"overrides": rem["overrides"], "rates": per_rate}
    return out


def twin_checks(setup: dict, work: Path) -> dict:
    """The twin on the kept sweep, on the measured one when there is one, and on every paired
    measurement recorded in the results file."""
    import tempfile

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report"
        subprocess.run([KVP, "ingest", str(KEPT / "bench"), str(KEPT / "metrics.prom.jsonl.gz"),
                        "--run", "load", "--out", str(report), "--scheduler-reserve-full-isl",
                        "false"], check=True, capture_output=True)
        out["kept_sweep"] = twin_on_sweep(report, KEPT / "server.log.gz")
    measured = work / setup["name"]
    if (measured / "report" / "runs.csv").is_file():
        out["measured_sweep"] = twin_on_sweep(measured / "report", measured / "server.log")
    recorded = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    for key, got in recorded.items():
        if (key.startswith("ab") and isinstance(got, dict) and "remedies" in got
                and (ROOT / got["folder"]).is_dir()):
            out[f"pairs_{key}"] = twin_on_pairs(got)
    return out


def _print_twin(got: dict) -> None:
    for key, sw in got.items():
        if not key.endswith("sweep"):
            continue
        print(f"\ntwin of the {key.replace('_', ' ')} ({sw['build_fit_report_remedies_s']:.1f} s "
              f"to build, fit, check and predict the remedies); knee measured "
              f"{sw['knee']['measured']:g}, twin {sw['knee']['twin']:g}")
        for r in sw["rates"]:
            print(f"  rate {r['rate']:g}: throughput {r['throughput_measured']:.0f} measured, "
                  f"{r['throughput_twin']:.0f} twin ({r['throughput_error_pct']:+.1f}%); "
                  f"preemptions {r['preemptions_measured']:.0f} / {r['preemptions_twin']:.0f}")
        for r in sw["leave_rates_out"]["predicted"]:
            print(f"  held out, rate {r['rate']:g}: throughput {r['throughput_error_pct']:+.1f}%;"
                  f" preemptions {r['preemptions_measured']:.0f} / {r['preemptions_twin']:.0f}")
        print(f"  recommendation: {sw['recommendation']}")
    for key, pairs in got.items():
        if not key.startswith("pairs_"):
            continue
        for name, rem in pairs.items():
            for r in rem["rates"]:
                lo, hi = r["measured"]["interval_pct"]
                print(f"{key} {name} rate {r['rate']:g}: measured {r['measured']['mean_pct']:+.1f}%"
                      f" ({lo:+.1f} to {hi:+.1f}), twin {r['predicted_mean_pct']:+.1f}% "
                      f"(per round {', '.join(f'{x:+.1f}' for x in r['predicted_per_round_pct'])})")


# --- test data --------------------------------------------------------------------------------
# The scrape log's families the ingestion and the twin read; the rest (HTTP, process, Python,
# vLLM's families no analysis reads) is most of each scrape's text.
_DROP = re.compile(r"^(?!vllm:)|^vllm:(estimated_|mm_cache|external_prefix|admission_|"
                   r"engine_sleep|request_params_|request_max_num_|request_inference_|"
                   r"request_prefill_kv_|prompt_tokens_cached_by_source)")
_ACCESS = re.compile(r'"(GET /metrics|POST /v1/)')
_LOG_TIME = re.compile(r"^\(\w+ pid=\d+\) \w+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
_STEP = "Iteration("


def cut_scrape_log(src_path: Path, dest_gz: Path, start: float, end: float) -> int:
    """The scrapes of ``src_path`` within [start, end], with only the kept families, gzipped
    to ``dest_gz`` (no timestamp in the gzip header: the same cut gives the same bytes);
    returns how many were kept."""
    kept = 0
    with src_path.open() as src, gzip.GzipFile(dest_gz, "wb", mtime=0) as gz:
        for line in src:
            rec = json.loads(line)
            if not start <= rec["t"] <= end:
                continue
            if "text" in rec:
                rec["text"] = _keep_families(rec["text"])
            gz.write((json.dumps(rec) + "\n").encode())
            kept += 1
    return kept


def _keep_families(text: str) -> str:
    out, keep = [], True
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keep = not _DROP.match(line.split(" ", 3)[2])
        elif not line.startswith("#"):
            keep = not _DROP.match(line.split("{", 1)[0].split(" ", 1)[0])
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def cut_test_data(folder: Path, dest: Path, margin_s: float = 2.0) -> dict:
    """The measured sweep in ``folder`` cut small into ``dest``: every rate's result without
    its per-token lists and generated texts, the scrape log within the sweep's span (the
    first window's start to the last window's end, +- 3 s) with the families kept, and the
    server's log with the steps within the sweep's span (+- ``margin_s``) and every other
    line but the access log."""
    import datetime as dt

    shutil.rmtree(dest, ignore_errors=True)
    (dest / "bench").mkdir(parents=True)
    windows = []
    for path in sorted((folder / "bench").glob("rate-*.json")):
        res = json.loads(path.read_text())
        for key in ("itls", "generated_texts"):
            res.pop(key, None)
        res["tokenizer_id"] = "tiny"
        windows.append((res["kvpressure_window"]["start"], res["kvpressure_window"]["end"]))
        (dest / "bench" / path.name).write_text(json.dumps(res, indent=1) + "\n")
    start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    kept = cut_scrape_log(folder / "metrics.prom.jsonl", dest / "metrics.prom.jsonl.gz",
                          start - 3.0, end + 3.0)
    year = dt.datetime.fromtimestamp(start).year
    lines_kept = 0
    with (folder / "server.log").open(errors="replace") as src, \
            gzip.GzipFile(dest / "server.log.gz", "wb", mtime=0) as gz:
        for line in src:
            if _ACCESS.search(line):
                continue
            if _STEP in line:
                m = _LOG_TIME.match(line)
                if m is None:
                    continue
                mo, d, h, mi, s = map(int, m.groups())
                # vLLM writes the machine's local time, whole seconds, without the year
                t = dt.datetime(year, mo, d, h, mi, s).timestamp()
                if not start - margin_s <= t <= end + margin_s:
                    continue
            # the model's and the venv's paths as this checkout and machine had them
            gz.write(line.replace(f"{ROOT}/", "").encode())
            lines_kept += 1
    sizes = {p.relative_to(dest).as_posix(): p.stat().st_size
             for p in sorted(dest.rglob("*")) if p.is_file()}
    return {"span": [start, end], "scrapes": kept, "log_lines": lines_kept, "bytes": sizes,
            "total_bytes": sum(sizes.values())}


def kept() -> int:
    """The sweep kept in the tests' data, ingested and checked as a measured one is (nothing
    measured: a run of every benchmark stays off the real server)."""
    from kvpressure.ingestion.api import ingest as ingest_api
    from kvpressure.ingestion.engine_facts import EngineFacts

    runs = ingest_api([KEPT / "bench", KEPT / "metrics.prom.jsonl.gz"], run="load",
                      engine=EngineFacts(scheduler_reserve_full_isl=False)).runs
    print(f"the sweep kept in {KEPT.relative_to(ROOT)} (--real measures one):")
    out = summarise(KEPT / "metrics.prom.jsonl.gz", runs)
    _print_sweep(out)
    return 1 if out["ingestion_problems"] else 0


def _write(key: str, value: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    got = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    got[key] = _rounded(value)
    RESULT.write_text(json.dumps(got, indent=2, default=str) + "\n")
    print(f"written: {RESULT} ({key})")


def _rates(text: str, option: str) -> list[float]:
    try:
        rates = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"{option} {text!r}: comma-separated numbers of requests/s") from None
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise SystemExit(f"{option} {text!r}: each rate a finite number above 0")
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", action="store_true",
                    help="measure the sweep on a real server (default: print the kept one)")
    ap.add_argument("--setup", default="mid_pool64_chunk128_nocache",
                    help="one of bench_twin.REAL_SETUPS")
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES),
                    help="requests/s of the sweep, comma-separated")
    ap.add_argument("--work", type=Path, default=WORK, help="where the measured folders go")
    ap.add_argument("--models", type=Path, default=MODELS, help="where the models are built")
    ap.add_argument("--port", type=int, default=18481)
    ap.add_argument("--ab", metavar="REMEDIES", help="measure the baseline against these "
                    "remedies (comma-separated: max_num_seqs_pool, pool_doubled, "
                    "full_isl_admission) on live servers, one each, instead of the sweep")
    ap.add_argument("--ab-rates", default=",".join(f"{r:g}" for r in AB_RATES))
    ap.add_argument("--rounds", type=int, default=3, help="rounds for --ab")
    ap.add_argument("--twin", action="store_true",
                    help="fit the open-loop twin on the kept sweep, the measured one and each "
                    "paired measurement recorded, and compare (measures nothing)")
    ap.add_argument("--test-data", type=Path, metavar="DEST",
                    help="cut the measured sweep of --setup into DEST (measures nothing)")
    args = ap.parse_args()
    setup = _setup(args.setup)
    if args.test_data:
        got = cut_test_data(args.work / setup["name"], args.test_data)
        print(json.dumps(got, indent=1))
        return 0
    if args.ab:
        out = ab(setup, args.ab.split(","), args.rounds, _rates(args.ab_rates, "--ab-rates"),
                 args.work, args.port, args.models)
        _write("ab", out)
        return 0
    if args.twin or not args.real:
        code = 0 if args.twin else kept()
        got = twin_checks(setup, args.work)
        _print_twin(got)
        _write("twin", got)
        return code
    out = sweep(setup, _rates(args.rates, "--rates"), args.work, args.port, args.models)
    _print_sweep(out)
    _write("sweep", out)
    return 1 if out["ingestion_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
