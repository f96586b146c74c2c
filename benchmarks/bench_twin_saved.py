"""Real sweeps shaped as most users hold them: ``vllm bench serve --save-result`` (no per-request
arrays) and a scrape log, no step log; the twin built on them, a single-variable pair measured.

    .venv/bin/python benchmarks/bench_twin_saved.py --real     # measure (server, client, scraper)
    .venv/bin/python benchmarks/bench_twin_saved.py            # the twin on the kept sweeps

For each setup: the CPU vLLM server (``scripts/vllm-env.sh``, the mid model of
``bench_twin.py``), ``kvpressure scrape`` in the background, ``vllm bench serve --dataset-name
random --ignore-eos --save-result`` per level with the dataset arguments recorded through
``--metadata``, then ``kvpressure ingest bench/ metrics.prom.jsonl`` (no ``--run``: the levels
are matched to the log by their windows) and the twin, told the engine arguments the user
started the server with. Twice per folder: with the dataset arguments, and with them removed
from the results (the lengths then come from the scrape log's histograms). Per level: the
measured and twin throughput and preemptions; per pair, the measured change at each level
against the twin's prediction for the other arm's setting.

Results: stdout and ``benchmarks/out/bench_twin_saved.json``; sweeps under
``benchmarks/out/twin_saved/<setup>/``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_twin as bt  # noqa: E402

OUT = bt.OUT / "twin_saved"
LEVELS = (2, 4, 6, 8, 12, 16)
PROMPTS = 32
# Prompts prefilled in 128-token chunks, so admission by the first chunk and by the whole
# prompt differ; no prefix cache, so a preemption recomputes its whole context.
_ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 128, "enable_prefix_caching": False}
SETUPS = [
    {"name": "pool64_fullisl", "blocks": 64,
     "engine": {**_ENGINE, "scheduler_reserve_full_isl": True}},
    {"name": "pool64_firstchunk", "blocks": 64,
     "engine": {**_ENGINE, "scheduler_reserve_full_isl": False}},
    {"name": "pool96_firstchunk", "blocks": 96,
     "engine": {**_ENGINE, "scheduler_reserve_full_isl": False}},
    {"name": "pool64_firstchunk_seqs5", "blocks": 64,
     "engine": {**_ENGINE, "max_num_seqs": 5, "scheduler_reserve_full_isl": False}},
    # The same server as pool64_firstchunk, restarted: the run-to-run noise of a level.
    {"name": "pool64_firstchunk_again", "blocks": 64,
     "engine": {**_ENGINE, "scheduler_reserve_full_isl": False}},
]
# Single-variable pairs: the admission rule; the pool; max_num_seqs.
PAIRS = [("pool64_fullisl", "pool64_firstchunk"), ("pool64_firstchunk", "pool96_firstchunk"),
         ("pool64_firstchunk", "pool64_firstchunk_seqs5"),
         # the control: nothing changed but the restart
         ("pool64_firstchunk", "pool64_firstchunk_again")]


def measure(setup: dict, port: int) -> None:
    venv = bt._vllm_env()
    model = bt._model(venv, "mid", OUT / "models")
    folder = OUT / setup["name"]
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "bench").mkdir(parents=True)
    log = folder / "server.log"
    proc = bt._start(venv, model, setup["blocks"], setup["engine"], port, log)
    scraper = None
    try:
        bt._wait(port, proc, log)
        scraper = subprocess.Popen([bt.KVP, "scrape", f"http://127.0.0.1:{port}/metrics",
                                    "--out", str(folder / "metrics.prom.jsonl"),
                                    "--interval", "1"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        for c in LEVELS:
            subprocess.run(
                [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm",
                 "--base-url", f"http://127.0.0.1:{port}", "--model", "tiny",
                 "--tokenizer", str(model), "--dataset-name", "random",
                 "--random-input-len", str(bt.INPUT_LEN), "--random-output-len",
                 str(bt.OUTPUT_LEN), "--random-range-ratio", str(bt.RANGE_RATIO),
                 "--ignore-eos", "--num-prompts", str(PROMPTS), "--max-concurrency", str(c),
                 "--request-rate", "inf", "--seed", "0", "--save-result", "--result-dir",
                 str(folder / "bench"), "--result-filename", f"c{c}.json", "--metadata",
                 "dataset_name=random", f"random_input_len={bt.INPUT_LEN}",
                 f"random_output_len={bt.OUTPUT_LEN}", f"random_range_ratio={bt.RANGE_RATIO}",
                 "seed=0"], check=True, capture_output=True)
            time.sleep(2)
    finally:
        if scraper is not None:
            scraper.terminate()
            scraper.wait(timeout=30)
        bt._stop(proc)
    (folder / "setup.json").write_text(json.dumps(setup, indent=1) + "\n")


def without_dataset_args(folder: Path, out: Path) -> Path:
    """A copy of the sweep whose results do not record the dataset arguments."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "bench").mkdir(parents=True)
    for f in sorted((folder / "bench").glob("c*.json")):
        res = json.loads(f.read_text())
        for k in ("dataset_name", "random_input_len", "random_output_len",
                  "random_range_ratio", "seed"):
            res.pop(k, None)
        (out / "bench" / f.name).write_text(json.dumps(res))
    shutil.copy(folder / "metrics.prom.jsonl", out / "metrics.prom.jsonl")
    return out


def _engine(setup: dict) -> dict:
    return {**setup["engine"], "num_gpu_blocks": setup["blocks"]}


def twin_of(folder: Path, engine: dict, candidates: dict) -> dict:
    """Ingest the sweep (no --run), build the twin told ``engine``, fit, check, predict the
    ``candidates`` (the other arm of each pair) at every level."""
    from kvpressure.ingestion.api import ingest
    from kvpressure.twin.api import build_twin

    # Outside the sweep folder: a server.log beside it would give the twin the step log that
    # users of --save-result do not have.
    run = Path(tempfile.mkdtemp(prefix="twin_saved_run_")) / "report"
    t = time.perf_counter()
    ingest([folder / "bench", folder / "metrics.prom.jsonl"]).write(run)
    ingest_s = time.perf_counter() - t
    t = time.perf_counter()
    twin = build_twin(run, overrides=engine)
    twin.fit()
    rep = twin.fit_report()
    fit_s = time.perf_counter() - t
    rem = twin.predict_remedies(candidates=candidates, latency_tolerance_pct=None)
    fit_check_predict_s = time.perf_counter() - t
    levels = [{k: r[k] for k in ("concurrency", "output_throughput_measured",
                                 "output_throughput_twin", "output_throughput_error_pct",
                                 "preemptions_measured", "preemptions_twin")}
              for r in rep.table.to_dict("records")]
    arms = {name: {c: {k: twin.predict_level(c, ov)[k] for k in ("output_throughput",
                                                                 "preemptions")}
                   for c in sorted(twin.workloads)} for name, ov in candidates.items()}
    # each level's predicted change with its 90% interval, as the report gives it at a focus
    for c in sorted(twin.workloads):
        at = twin.predict_remedies(focus=c, candidates=candidates, latency_tolerance_pct=None)
        for row in at["candidates"]:
            if row["setting"] in arms:
                arms[row["setting"]][c].update(
                    change_pct=row["throughput_change_pct"],
                    interval_pct=row["throughput_change_pct_with_noise"])
    return {"ingest_s": round(ingest_s, 2), "fit_and_check_s": round(fit_s, 2),
            "fit_check_predict_s": round(fit_check_predict_s, 2),
            "lengths": twin.lengths_sources(), "verdict": rep.verdict.text,
            "knee": rep.verdict.knee, "levels": levels, "other_arms_twin": arms,
            "focus": rem["focus"], "noise": rem["noise"],
            "recommendation": rem["recommendation"]["text"],
            "candidates": [{k: r.get(k) for k in ("setting", "throughput_change_pct",
                                                  "throughput_change_pct_with_noise",
                                                  "effect", "preemptions")}
                           for r in rem["candidates"]]}


KEPT = bt.ROOT / "tests" / "data" / "twin_saved"


def cut_test_data(folder: Path, dest: Path) -> dict:
    """The sweep in ``folder`` cut small into ``dest``: the results as saved (the tokenizer's
    path replaced), the scrape log within the sweep's span (+- 5 s) with the families the kit
    reads."""
    import datetime as dt

    from bench_twin_open import cut_scrape_log

    shutil.rmtree(dest, ignore_errors=True)
    (dest / "bench").mkdir(parents=True)
    spans = []
    for path in sorted((folder / "bench").glob("c*.json")):
        res = json.loads(path.read_text())
        res["tokenizer_id"] = "tiny"
        # vllm bench serve stamps 'date' (local time, whole seconds) when the run ends
        end = dt.datetime.strptime(res["date"], "%Y%m%d-%H%M%S").timestamp() + 1.0
        spans.append((end - float(res["duration"]) - 1.0, end))
        (dest / "bench" / path.name).write_text(json.dumps(res, indent=1) + "\n")
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    kept = cut_scrape_log(folder / "metrics.prom.jsonl", dest / "metrics.prom.jsonl.gz",
                          start - 5.0, end + 5.0)
    return {"scrapes": kept, "bytes": sum(p.stat().st_size for p in dest.rglob("*")
                                          if p.is_file())}


def targets(out: dict) -> dict:
    """The issue's targets per sweep and route, past the knee (the levels that preempt or
    follow the measured knee): the worst throughput error, preemptions per level and summed,
    the knee; per pair, the change at each level within 10 points and its sign."""
    got: dict = {"sweeps": [], "pairs": []}
    for name, routes in out["setups"].items():
        for route, r in routes.items():
            knee = r["knee"]["measured"]
            past = [lv for lv in r["levels"] if knee is None or lv["concurrency"] > knee
                    or lv["preemptions_measured"]]
            pre = [(lv["preemptions_measured"], lv["preemptions_twin"]) for lv in past]
            within = [abs(t - m) <= max(0.10 * m, 2.0) for m, t in pre]
            sm, st = sum(m for m, _ in pre), sum(t for _, t in pre)
            got["sweeps"].append({
                "sweep": name, "route": route,
                "throughput_max_error_pct": max(abs(lv["output_throughput_error_pct"])
                                                for lv in r["levels"]),
                "preemption_levels_within_10pct_or_2": f"{sum(within)}/{len(within)}",
                "preemptions_summed_error_pct": bt._pct(st, sm) if sm else None,
                "knee_levels_apart": r["knee"]["levels_apart"],
                "fit_check_predict_s": r["fit_check_predict_s"],
                "verdict": r["verdict"]})
    for p in out["pairs"]:
        if p["concurrency"] < 6:
            continue
        m, t = p["measured_change_pct"], p["twin_change_pct"]
        lo, hi = p["twin_interval_pct"] or (float("nan"), float("nan"))
        got["pairs"].append({**{k: p[k] for k in ("pair", "route", "concurrency")},
                             "points_apart": round(abs(t - m), 1),
                             "sign_right": abs(m) <= 10 or (m > 0) == (t > 0),
                             "interval_covers": bool(lo <= m <= hi)})
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--port", type=int, default=8321)
    ap.add_argument("--cut", action="store_true",
                    help="cut the measured sweeps into tests/data/twin_saved/")
    ap.add_argument("--kept-dir", type=Path, default=KEPT,
                    help="where --cut writes and --kept reads (default tests/data/twin_saved)")
    ap.add_argument("--kept", action="store_true",
                    help="the twin on the sweeps kept in tests/data/twin_saved/")
    args = ap.parse_args()
    global OUT
    if args.cut:
        for s in SETUPS:
            if (OUT / s["name"] / "metrics.prom.jsonl").is_file():
                print(s["name"], cut_test_data(OUT / s["name"], args.kept_dir / s["name"]))
        return 0
    if args.kept:
        OUT = Path(tempfile.mkdtemp(prefix="twin_saved_"))
        for s in SETUPS:
            if (args.kept_dir / s["name"]).is_dir():
                shutil.copytree(args.kept_dir / s["name"], OUT / s["name"])
                src = OUT / s["name"] / "metrics.prom.jsonl.gz"
                with gzip.open(src, "rb") as fh:
                    (OUT / s["name"] / "metrics.prom.jsonl").write_bytes(fh.read())
                src.unlink()
    if args.real:
        for s in SETUPS:
            print(f"measuring {s['name']}", flush=True)
            measure(s, args.port)
    by = {s["name"]: s for s in SETUPS}
    out: dict = {"setups": {}, "pairs": []}
    for s in SETUPS:
        folder = OUT / s["name"]
        if not (folder / "metrics.prom.jsonl").is_file():
            continue
        others = [b if a == s["name"] else a for a, b in PAIRS if s["name"] in (a, b)]
        cands = {o: {k: v for k, v in _engine(by[o]).items() if _engine(s).get(k) != v}
                 for o in others}
        out["setups"][s["name"]] = {
            "with_dataset_args": twin_of(folder, s["engine"], cands),
            "histograms_only": twin_of(without_dataset_args(folder, OUT / (s["name"] + "_hist")),
                                       s["engine"], cands)}
    for a, b in PAIRS:
        if a not in out["setups"] or b not in out["setups"]:
            continue
        ma = {r["concurrency"]: r for r in out["setups"][a]["with_dataset_args"]["levels"]}
        mb = {r["concurrency"]: r for r in out["setups"][b]["with_dataset_args"]["levels"]}
        for route in ("with_dataset_args", "histograms_only"):
            got = out["setups"][a][route]
            twin_a = {r["concurrency"]: r for r in got["levels"]}
            pred = got["other_arms_twin"][b]
            for c in sorted(ma):
                out["pairs"].append({
                    "pair": f"{a} -> {b}", "route": route, "concurrency": c,
                    "measured_change_pct": bt._pct(mb[c]["output_throughput_measured"],
                                                   ma[c]["output_throughput_measured"]),
                    "twin_change_pct": bt._pct(pred[c]["output_throughput"],
                                               twin_a[c]["output_throughput_twin"]),
                    "preemptions_measured": [ma[c]["preemptions_measured"],
                                             mb[c]["preemptions_measured"]],
                    "preemptions_twin": [twin_a[c]["preemptions_twin"],
                                         pred[c]["preemptions"]],
                    "twin_interval_pct": pred[c].get("interval_pct")})
    out["targets"] = targets(out)
    text = json.dumps(bt._rounded(out), indent=1, default=str)
    bt.OUT.mkdir(parents=True, exist_ok=True)
    (bt.OUT / "bench_twin_saved.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
