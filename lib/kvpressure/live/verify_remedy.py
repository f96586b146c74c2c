"""``kvpressure verify-remedy``: the twin's predicted change measured on the user's own server.

The baseline server runs the user's command line, the remedy server the same command with the
settings changed (``serve.py``). Both serve the measured run's load (its lengths, seed and
requests per level, the kit's closed-loop client: ``runner.run_collect`` of one level per run)
in paired rounds with the order rotating (``paired.py``); the change in output throughput per
level is read from the pairs, next to the fitted twin's prediction for the same change.

``--mode ports`` starts both servers at once, on ``--port`` and the next port, and loads one at
a time (the idle one waits on its queue); ``--mode restart`` starts one at a time, per round
(for a GPU that holds one server). The output folder:

```
verify.json, verify.md    the settings, every finished run, per level the measured change with
                          its interval, the prediction, preemptions and latencies of both arms,
                          whether the prediction held (rewritten after every run)
rounds/r<R>/c<C>-<arm>/   one ``kvpressure collect`` folder a run (bench result, levels.json,
                          the scrape log of that server over the run)
servers/<arm>.log         each server's output
measured/                 the run folder ingested, when it had no runs table yet
```

A rerun into the folder keeps every finished run and runs the rest (more ``--rounds`` adds
rounds); it must have the same settings (command, remedy, levels, load), else it is refused
naming the difference.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kvpressure.errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, InputError
from kvpressure.folders.layout import SCRAPE_FILES
from kvpressure.folders.run_folder import RunFolder
from kvpressure.live import paired
from kvpressure.live.serve import (
    Server,
    ServerFailed,
    flag_for,
    parse_serve_cmd,
    settings_in,
    typed_value,
    with_port,
    with_setting,
)

VERIFY_JSON = "verify.json"
VERIFY_MD = "verify.md"
ARMS = ("baseline", "remedy")
# What a rerun must share with the folder's first run: the servers and what they are given.
SAME = ("run_dir", "serve_cmd", "set", "levels", "mode", "load")


@dataclass
class VerifyOptions:
    run_dir: Path
    serve_cmd: str
    sets: Mapping[str, str]
    out: Path
    levels: list[int] | None = None
    rounds: int = 3
    mode: str = "ports"
    port: int = 8100
    until_known: bool = False
    width_pct: float | None = None
    max_rounds: int | None = None
    prompts_per_level: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    warmup: int = 4
    cooldown_s: float = 2.0
    ready_timeout_s: float = 900.0
    level_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    bootstrap: int = 100
    env: Mapping[str, str] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # typed from ``sets``

    def check(self) -> None:
        if self.mode not in ("ports", "restart"):
            raise InputError(f"--mode {self.mode!r}: ports or restart")
        if not self.sets:
            raise InputError("--set: give the remedy, e.g. --set max_num_seqs=24")
        self.overrides = {k: typed_value(k, v) for k, v in self.sets.items()}
        if self.rounds < 2:
            raise InputError(f"--rounds {self.rounds}: at least 2 (an interval needs two pairs)")
        if self.until_known:
            if self.max_rounds is None:
                raise InputError("--until-known needs --max-rounds N (the cap)")
            if self.max_rounds < self.rounds:
                raise InputError(f"--max-rounds {self.max_rounds}: at least --rounds "
                                 f"({self.rounds})")
        if self.width_pct is not None and not (math.isfinite(self.width_pct)
                                               and self.width_pct > 0):
            raise InputError(f"--width {self.width_pct}: a width in points > 0")
        if not 1 <= self.port <= 65534:
            raise InputError(f"--port {self.port}: 1 to 65534")
        if self.levels is not None and (not self.levels or min(self.levels) < 1
                                        or len(set(self.levels)) != len(self.levels)):
            raise InputError(f"--levels {self.levels}: distinct concurrencies >= 1")


def commands(serve_cmd: str, overrides: Mapping[str, Any]) -> dict[str, list[str]]:
    """The baseline's and the remedy's command lines (InputError for a setting with no flag,
    or a remedy the command already has)."""
    base = parse_serve_cmd(serve_cmd)
    given = settings_in(base)
    for key in overrides:
        flag_for(key)
    if all(given.get(k) == v for k, v in overrides.items()):
        raise InputError("--set " + ", ".join(f"{k}={v}" for k, v in overrides.items())
                         + ": the --serve-cmd already runs with that; nothing to verify")
    remedy = list(base)
    for key, value in overrides.items():
        remedy = with_setting(remedy, key, value)
    return {"baseline": base, "remedy": remedy}


def measured_load(run_dir: Path, opts: VerifyOptions) -> dict[str, Any]:
    """The load the run was measured with (``levels.json`` of a collect folder), so each
    round replays the requests the twin was fitted on."""
    path = run_dir / "levels.json"
    if path.is_file():
        o = json.loads(path.read_text(encoding="utf-8")).get("options") or {}
        load = {k: o.get(k) for k in ("input_len", "output_len", "range_ratio",
                                       "prompts_per_level", "seed", "token_ids")}
    elif opts.input_len and opts.output_len:
        load = {"input_len": opts.input_len, "output_len": opts.output_len, "range_ratio": 0.0,
                "prompts_per_level": None, "seed": 0, "token_ids": [10, 1000]}
    else:
        raise InputError(f"{run_dir}: no levels.json (a `kvpressure collect` folder) to take the "
                         "load from; give --input-len and --output-len")
    if opts.input_len:
        load["input_len"] = opts.input_len
    if opts.output_len:
        load["output_len"] = opts.output_len
    if opts.prompts_per_level:
        load["prompts_per_level"] = opts.prompts_per_level
    load["token_ids"] = list(load.get("token_ids") or [10, 1000])
    return load


def _tables_dir(run_dir: Path, out: Path) -> Path:
    """Where the twin reads the run: the run folder, or, for a collect folder collected with
    ``--no-report``, its bench results and scrape log ingested into ``out/measured``."""
    if RunFolder(run_dir).has_runs() or RunFolder(run_dir / "report").has_runs():
        return run_dir
    bench = run_dir / "bench"
    log = next((p for p in (run_dir / n for n in SCRAPE_FILES) if p.is_file()),
               run_dir / SCRAPE_FILES[0])
    if not (bench.is_dir() and log.is_file()):
        raise InputError(f"{run_dir}: no runs.csv (nor report/runs.csv), and no bench/ with a "
                         "metrics.prom.jsonl to ingest: give a folder of `kvpressure collect`, "
                         "`ingest` or `report --source`")
    target = out / "measured"
    if not RunFolder(target).has_runs():
        from kvpressure.ingestion.api import ingest
        from kvpressure.ingestion.engine_facts import EngineFacts

        engine = {}
        if (run_dir / "engine.json").is_file():
            engine = json.loads((run_dir / "engine.json").read_text(encoding="utf-8"))
        isl = (engine.get("engine_args") or {}).get("scheduler_reserve_full_isl")
        res = ingest([bench, log], run="load", engine=EngineFacts(
            scheduler_reserve_full_isl=None if isl is None else bool(isl)))
        res.write(target)
        if (run_dir / "engine.json").is_file():
            shutil.copy(run_dir / "engine.json", target / "engine.json")
        if (run_dir / "server.log").is_file():
            shutil.copy(run_dir / "server.log", target / "server.log")
    return target


def predictions(run_dir: Path, out: Path, cmd_settings: Mapping[str, Any],
                overrides: Mapping[str, Any], levels: list[int] | None, bootstrap: int
                ) -> tuple[list[int], dict[int, dict[str, Any]], dict[str, Any]]:
    """The twin (fitted as ``kvpressure twin`` fits it, told the command's explicit settings)
    and its predicted change per level: ``(levels, per level, about the twin)``."""
    from kvpressure.twin.api import build_twin

    twin = build_twin(_tables_dir(run_dir, out), overrides=dict(cmd_settings) or None)
    twin.fit(bootstrap=bootstrap)
    report = twin.fit_report()
    if twin.open_loop:
        raise InputError(f"{run_dir}: an open loop (request rates); verify-remedy replays "
                         "closed loops at concurrency levels")
    from kvpressure.analysis.focus import focus_level

    focus, rule = focus_level(twin.measured.levels)
    chosen = list(levels) if levels else [int(focus)]
    missing = [c for c in chosen if c not in twin.workloads]
    if missing:
        raise InputError(f"--levels {missing[0]}: not a measured level of {run_dir} "
                         f"({', '.join(str(c) for c in sorted(twin.workloads))}); the twin "
                         "predicts at the measured levels")
    out_levels: dict[int, dict[str, Any]] = {}
    got: dict[str, Any] = {}
    for c in chosen:
        got = twin.predict_remedies(focus=c, candidates={"remedy": dict(overrides)})
        row = next((r for r in got["candidates"] if r["setting"] == "remedy"), None)
        base = twin.predict_level(c, {})
        rem = twin.predict_level(c, overrides)
        if row is None:  # the twin's settings already have it: no change
            # ... but measured on two server runs: their noise is the band
            h = float(got["noise"]["change_halfwidth_pct"])
            out_levels[c] = {"change_pct": 0.0, "interval_pct": [-h, h],
                             "effect": paired.NO_EFFECT,
                             "effect_text": "no change: the twin's settings already have it "
                                            f"(two runs of them move by ±{h:.1f}%)"}
        else:
            out_levels[c] = {"change_pct": row["throughput_change_pct"],
                             "interval_pct": row["throughput_change_pct_with_noise"],
                             "effect": row["effect"], "effect_text": row["effect_text"]}
        out_levels[c].update(
            output_throughput_baseline=base["output_throughput"],
            output_throughput_remedy=rem["output_throughput"],
            preemptions_baseline=base["preemptions"], preemptions_remedy=rem["preemptions"],
            ttft_p95_s_baseline=base["ttft_p95_s"], ttft_p95_s_remedy=rem["ttft_p95_s"],
            itl_p95_s_baseline=base["itl_p95_s"], itl_p95_s_remedy=rem["itl_p95_s"])
    about = {"fit": report.verdict.text, "fits": bool(report.verdict.fits),
             "focus": {"concurrency": focus, "rule": rule}, "noise": got["noise"],
             "settings_given": dict(cmd_settings)}
    return chosen, out_levels, about


# --- one run -------------------------------------------------------------------------------
def run_folder(out: Path, r: int, c: int, arm: str) -> Path:
    return out / "rounds" / f"r{r}" / f"c{c}-{arm}"


def _window_increase(log: Path, start: float, end: float, name: str) -> float | None:
    """A counter's increase between the last scrape at or before ``start`` and the first at or
    after ``end`` (the runner scrapes right before and right after a level)."""
    from kvpressure.live.server import metric_total

    before = after = None
    with open(log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if "text" not in doc:
                continue
            t = float(doc["t"])
            if t <= start:
                before = metric_total(doc["text"], name)
            elif t >= end and after is None:
                after = metric_total(doc["text"], name)
    if before is None or after is None:
        return None
    return after - before


def read_run(folder: Path, r: int, c: int, arm: str) -> dict[str, Any] | None:
    """A finished run's figures; None when the folder holds no complete run."""
    from kvpressure.ingestion.names import GENERATION_TOKENS, PREEMPTIONS

    try:
        doc = json.loads((folder / "levels.json").read_text(encoding="utf-8"))
        level = next(lv for lv in doc["levels"] if lv["concurrency"] == c)
        bench = json.loads((folder / "bench" / f"c{c}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, KeyError):
        return None
    if doc.get("state") != "complete" or level.get("status") != "complete":
        return None
    start, end = float(level["start"]), float(level["end"])
    log = folder / "metrics.prom.jsonl"
    tokens = _window_increase(log, start, end, GENERATION_TOKENS)
    return {
        "round": r, "concurrency": c, "arm": arm, "folder": str(folder.relative_to(
            folder.parents[2])),
        "output_throughput": bench["output_throughput"], "completed": bench["completed"],
        "duration_s": bench["duration"], "start": start, "end": end,
        "preemptions": _window_increase(log, start, end, PREEMPTIONS),
        "server_output_throughput": None if tokens is None else tokens / max(end - start, 1e-9),
        "ttft_p50_s": bench["median_ttft_ms"] / 1000.0, "ttft_p95_s": bench["p95_ttft_ms"] / 1000.0,
        "itl_p50_s": bench["median_itl_ms"] / 1000.0, "itl_p95_s": bench["p95_itl_ms"] / 1000.0,
    }


class RunIncomplete(RuntimeError):
    """A run that did not complete (the server stopped answering, requests failed)."""


class Interrupted(Exception):
    """Ctrl-C during a run (the runner keeps what finished)."""


def one_run(server: Server, folder: Path, r: int, c: int, arm: str, load: Mapping[str, Any],
            opts: VerifyOptions, engine_args: Mapping[str, Any], warm: bool,
            stream: TextIO) -> dict[str, Any]:
    """One level on one server into ``folder`` (a collect folder), its figures."""
    from kvpressure.live.runner import CollectOptions, run_collect
    from kvpressure.simulation.experiment import ALIASES, ENGINE_ARGS

    if server.proc is None or server.proc.poll() is not None:
        raise ServerFailed(f"the {arm} server is not running; its log ({server.log}) ends:\n"
                           f"{server.tail()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"round {r + 1}, concurrency {c}, {arm} ({server.url})", file=stream, flush=True)
    co = CollectOptions(
        url=server.url, out=folder, levels=[c], input_len=int(load["input_len"]),
        output_len=int(load["output_len"]), range_ratio=float(load["range_ratio"] or 0.0),
        prompts_per_level=load["prompts_per_level"], warmup=opts.warmup if warm else 0,
        cooldown_s=opts.cooldown_s, level_timeout_s=opts.level_timeout_s,
        request_timeout_s=opts.request_timeout_s, max_ttft_s=None, seed=int(load["seed"] or 0),
        token_ids=tuple(load["token_ids"]), load_engine="builtin",
        engine_args={k: v for k, v in engine_args.items() if k in ENGINE_ARGS or k in ALIASES})
    # The runner's event loop takes SIGINT and SIGTERM for the run and leaves the defaults
    # behind: put back this process's own, so a later SIGTERM still stops the servers.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcome = run_collect(co, stream=stream)
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    if outcome.interrupted:
        raise Interrupted
    got = read_run(folder, r, c, arm)
    if got is None:
        why = outcome.stopped or "the run did not complete"
        raise RunIncomplete(f"round {r + 1}, concurrency {c}, {arm}: {why}; the {arm} server's "
                            f"log: {server.log}")
    return got


# --- the whole verification ----------------------------------------------------------------
def _settings_doc(opts: VerifyOptions, cmds: Mapping[str, list[str]], levels: list[int],
                  load: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_dir": str(Path(opts.run_dir).resolve()), "serve_cmd": cmds["baseline"],
            "set": {k: opts.overrides[k] for k in sorted(opts.overrides)},
            "remedy_cmd": cmds["remedy"], "levels": levels, "mode": opts.mode,
            "load": dict(load)}


def check_same(previous: Mapping[str, Any], now: Mapping[str, Any], where: Path) -> None:
    """InputError naming the first setting a rerun changed (its runs would not pair)."""
    for key in SAME:
        if previous.get(key) != now.get(key):
            raise InputError(
                f"--out {where}: holds a verification with other settings ({key}: "
                f"{json.dumps(previous.get(key))} there, {json.dumps(now.get(key))} now); "
                "rerun with the same ones to continue it, or give a new --out")


def _finished(out: Path, levels: list[int], upto: int) -> list[dict[str, Any]]:
    runs = []
    for r in range(upto):
        for c in levels:
            for arm in ARMS:
                got = read_run(run_folder(out, r, c, arm), r, c, arm)
                if got is not None:
                    runs.append(got)
    return runs


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(vals)) if vals else None


def summarise(runs: list[dict[str, Any]], levels: list[int],
              predicted: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per level: the measured change with its interval, the prediction, both arms' figures,
    and whether the prediction held."""
    out = []
    for c in levels:
        change = paired.measured_change(runs, c)
        pred = predicted.get(c) or {}
        held, why = (paired.prediction_held(change, float(pred["change_pct"]),
                                            pred.get("interval_pct"))
                     if pred else (None, "no prediction"))
        arms = {}
        for arm in ARMS:
            mine = sorted((x for x in runs if x["concurrency"] == c and x["arm"] == arm),
                          key=lambda x: x["round"])
            arms[arm] = {
                "rounds": [x["round"] for x in mine],
                "output_throughput": [x["output_throughput"] for x in mine],
                "output_throughput_mean": _mean([x["output_throughput"] for x in mine]),
                "preemptions": [x["preemptions"] for x in mine],
                "preemptions_mean": _mean([x["preemptions"] for x in mine]),
                "server_output_throughput_mean": _mean(
                    [x["server_output_throughput"] for x in mine]),
                **{f"{k}_mean": _mean([x[k] for x in mine])
                   for k in ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s")},
            }
        out.append({"concurrency": c, "measured": change, "predicted": dict(pred),
                    "held": held, "why": why, **arms})
    return out


def _pct_text(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1f}%"


def level_sentence(row: Mapping[str, Any]) -> str:
    """One level's outcome in words (verify.md and the terminal)."""
    m, p = row["measured"], row["predicted"]
    lo, hi = m["interval_pct"]
    if m["pairs"] < 2:
        got = f"{_pct_text(m['mean_pct'])} measured over {m['pairs']} round (no interval yet)"
    elif m["sign"] is None:
        got = (f"{paired.NO_EFFECT} measured ({_pct_text(m['mean_pct'])}, 95% interval "
               f"{lo:+.1f} to {hi:+.1f}, {m['pairs']} rounds)")
    else:
        got = (f"{_pct_text(m['mean_pct'])} measured (95% interval {lo:+.1f} to {hi:+.1f}, "
               f"{m['pairs']} rounds)")
    pred = (f"{_pct_text(p.get('change_pct'))} predicted (90% interval "
            f"{p['interval_pct'][0]:+.1f} to {p['interval_pct'][1]:+.1f})" if p else "no prediction")
    verdict = ("held" if row["held"] else "did not hold" if row["held"] is False
               else "not known yet")
    return f"concurrency {row['concurrency']}: {got} vs {pred}: {verdict} ({row['why']})"


def write_outputs(out: Path, doc: dict[str, Any]) -> None:
    """verify.json and verify.md, each replaced whole."""
    from kvpressure.jsonable import to_jsonable

    for name, text in ((VERIFY_JSON, json.dumps(to_jsonable(doc), indent=2, sort_keys=True)
                        + "\n"), (VERIFY_MD, markdown(doc))):
        tmp = out / (name + ".partial")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)


def _num(v: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if v is None or not math.isfinite(v) else format(v * scale, fmt)


def markdown(doc: Mapping[str, Any]) -> str:
    s = doc["settings"]
    change = ", ".join(f"{k}={v}" for k, v in s["set"].items())
    lines = [f"# Verification of {change}", "",
             f"Run: `{s['run_dir']}`; the twin: {doc['twin']['fit']}.", "",
             f"Baseline: `{' '.join(s['serve_cmd'])}`", "",
             f"Remedy: `{' '.join(s['remedy_cmd'])}`", "",
             f"Mode `{s['mode']}`; {doc['rounds_done']} round(s) done of {doc['rounds_planned']}"
             f"; state: {doc['state']}.", ""]
    for row in doc["levels"]:
        lines += [f"- {level_sentence(row)}"]
    lines += ["", "| concurrency | arm | output tok/s (mean) | preemptions (per round) | "
              "TTFT p95 s | ITL p95 ms |", "|---|---|---|---|---|---|"]
    for row in doc["levels"]:
        p = row["predicted"]
        for arm in ARMS:
            a = row[arm]
            twin = p.get(f"preemptions_{arm}")
            preempt = ", ".join("-" if v is None else f"{v:.0f}" for v in a["preemptions"])
            lines.append(f"| {row['concurrency']} | {arm} | {_num(a['output_throughput_mean'], '.1f')}"
                         f" | {preempt}" + ("" if twin is None else f" (twin {twin:.0f})")
                         + f" | {_num(a['ttft_p95_s_mean'], '.3g')}"
                         f" | {_num(a['itl_p95_s_mean'], '.3g', 1000.0)} |")
    lines += ["", "The change per round is the remedy's output throughput over the baseline's "
              "in that round (the arms back to back, their order rotating); the interval is "
              "Student-t over the rounds. A prediction held when the measured interval covers "
              "it, when the measured change lies inside the prediction's own interval with its "
              f"sign, or both agree within {paired.HELD_TOLERANCE_PP:g} points with the same sign; "
              f"an interval that holds 0 is {paired.NO_EFFECT}."
              + (" Both servers ran throughout (`--mode ports`): a steady difference between "
                 "the two server processes themselves (a few percent, as a restart of one "
                 "server can show) is in every round alike and so not in the interval; "
                 "`--mode restart` starts them again each round and puts it there."
                 if s["mode"] == "ports" else ""), ""]
    return "\n".join(lines)


def _estimate_round_s(run_dir: Path, levels: list[int], cooldown_s: float) -> float | None:
    """A round's time from the measured run's own levels (both arms), before any round ran."""
    path = run_dir / "levels.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    spans = {lv["concurrency"]: lv["end"] - lv["start"] for lv in doc.get("levels", [])
             if lv.get("start") and lv.get("end")}
    if not all(c in spans for c in levels):
        return None
    return sum(len(ARMS) * (spans[c] + cooldown_s + 2.0) for c in levels)


def verify(opts: VerifyOptions, stream: TextIO | None = None) -> tuple[dict[str, Any], int]:
    """The verification; returns ``(verify.json's content, exit code)``: 0 done,
    ``EXIT_INCOMPLETE`` a run did not complete, ``EXIT_INTERRUPTED`` (finished runs kept)."""
    stream = stream or sys.stderr
    opts.check()
    run_dir = Path(opts.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"RUN_DIR {run_dir}: not a folder")
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; give a folder")
    previous = None
    if (out / VERIFY_JSON).is_file():
        previous = json.loads((out / VERIFY_JSON).read_text(encoding="utf-8")).get("settings")
    elif out.is_dir() and any(p.name not in ("measured",) for p in out.iterdir()):
        raise InputError(f"--out {out}: holds files that are not a verification; give a new "
                         "folder")
    out.mkdir(parents=True, exist_ok=True)
    cmds = commands(opts.serve_cmd, opts.overrides)
    load = measured_load(run_dir, opts)
    cmd_settings = settings_in(cmds["baseline"])
    print(f"fitting the twin of {run_dir} ...", file=stream, flush=True)
    levels, predicted, about = predictions(run_dir, out, cmd_settings, opts.overrides,
                                           opts.levels, opts.bootstrap)
    settings = _settings_doc(opts, cmds, levels, load)
    if previous is not None:
        check_same(previous, settings, out)
    planned = (opts.max_rounds or opts.rounds) if opts.until_known else opts.rounds
    runs = _finished(out, levels, max(planned, opts.rounds))
    doc: dict[str, Any] = {"settings": settings, "twin": about, "state": "running",
                           "rounds_planned": planned}

    def save(state: str) -> None:
        done = {r for r in range(max(planned, opts.rounds) + 1)
                if all(any(x["round"] == r and x["concurrency"] == c and x["arm"] == a
                           for x in runs) for c in levels for a in ARMS)}
        doc.update(state=state, runs=sorted(runs, key=lambda x: (x["round"], x["start"])),
                   rounds_done=len(done), levels=summarise(runs, levels, predicted))
        write_outputs(out, doc)

    for c in levels:
        p = predicted[c]
        print(f"predicted at concurrency {c}: {p['change_pct']:+.1f}% ({p['effect_text']})",
              file=stream, flush=True)
    est = _estimate_round_s(run_dir, levels, opts.cooldown_s)
    if est is not None:
        print(f"a round should take about {est:.0f} s (the measured levels, both arms); "
              f"{planned} rounds: about {planned * est / 60:.1f} min" + (" at most"
                                                                         if opts.until_known
                                                                         else "")
              + (" plus the server starts of every round" if opts.mode == "restart" else
                 " plus the servers' start"), file=stream, flush=True)
    ports = {"baseline": opts.port, "remedy": opts.port + (1 if opts.mode == "ports" else 0)}
    servers = {arm: Server(with_port(cmds[arm], ports[arm]), ports[arm],
                           out / "servers" / f"{arm}.log", opts.env) for arm in ARMS}
    engine = {"baseline": cmd_settings, "remedy": {**cmd_settings, **opts.overrides}}
    code = 0
    state = "stopped"  # until the rounds end: an error not caught below leaves it so
    save("running")
    try:
        target = opts.rounds
        while True:
            _rounds(opts, servers, levels, runs, target, load, engine, save, stream)
            if not opts.until_known:
                break
            changes = [paired.measured_change(runs, c) for c in levels]
            if all(paired.known(ch, opts.width_pct) for ch in changes):
                print(f"known after {target} rounds", file=stream, flush=True)
                break
            if target >= (opts.max_rounds or target):
                print(f"not known after {target} rounds (the cap, --max-rounds)", file=stream,
                      flush=True)
                break
            target += 1
        doc["rounds_planned"] = target
        state = "complete"
    except (Interrupted, KeyboardInterrupt):
        state, code = "interrupted", EXIT_INTERRUPTED
        print("\ninterrupted: the finished rounds are kept in " + str(out) + "; the same "
              "command continues them", file=stream, flush=True)
    except (RunIncomplete, ServerFailed) as exc:
        state, code = "stopped", EXIT_INCOMPLETE
        doc["stopped"] = str(exc)
        print(f"stopped: {exc}", file=stream, flush=True)
    finally:
        for s in servers.values():
            s.stop()
        save(state)
    for row in doc["levels"]:
        print(level_sentence(row), file=stream, flush=True)
    return doc, code


def _rounds(opts: VerifyOptions, servers: Mapping[str, Server], levels: list[int],
            runs: list[dict[str, Any]], upto: int, load: Mapping[str, Any],
            engine: Mapping[str, Mapping[str, Any]], save: Any, stream: TextIO) -> None:
    """Rounds up to ``upto`` (those finished skipped), the servers up while needed."""
    def finished(r: int, c: int, arm: str) -> bool:
        return any(x["round"] == r and x["concurrency"] == c and x["arm"] == arm for x in runs)

    todo = [(r, c, arm) for r, c, arm in paired.plan(levels, upto, ARMS)
            if not finished(r, c, arm)]
    if not todo:
        return
    def run(r: int, c: int, arm: str) -> None:
        # The first run after a server's start warms it up (not measured).
        got = one_run(servers[arm], run_folder(opts.out, r, c, arm), r, c, arm, load, opts,
                      engine[arm], servers[arm].runs == 0, stream)
        servers[arm].runs += 1
        runs.append(got)
        save("running")

    first_round_t: float | None = None
    if opts.mode == "ports":
        new = [arm for arm in ARMS if servers[arm].proc is None]
        from kvpressure.live.serve import host_in, port_free

        for arm in new:  # both ports checked before either server starts
            s = servers[arm]
            if not port_free(host_in(s.argv), s.port):
                raise InputError(f"port {s.port} (the {arm} server's) is in use: give --port "
                                 "with two free ports from it")
        for arm in new:
            servers[arm].start()
        for arm in new:
            t = servers[arm].wait_ready(opts.ready_timeout_s)
            print(f"{arm} server ready on port {servers[arm].port} in {t:.0f} s",
                  file=stream, flush=True)
        current = None
        for r, c, arm in todo:
            if r != current:
                if current is not None and first_round_t is not None:
                    _say_estimate(time.monotonic() - first_round_t, r, opts, upto, stream)
                    first_round_t = None
                current = r
                if r == todo[0][0]:
                    first_round_t = time.monotonic()
            run(r, c, arm)
        return
    # restart: one server at a time, its levels of the round, then the other
    for r in sorted({r for r, _, _ in todo}):
        t0 = time.monotonic()
        for arm in paired.arm_order(ARMS, r):
            mine = [c for rr, c, a in todo if rr == r and a == arm]
            if not mine:
                continue
            server = servers[arm]
            server.start()
            try:
                t = server.wait_ready(opts.ready_timeout_s)
                print(f"{arm} server ready on port {server.port} in {t:.0f} s", file=stream,
                      flush=True)
                for c in mine:
                    run(r, c, arm)
            finally:
                server.stop()
        if r == todo[0][0]:
            _say_estimate(time.monotonic() - t0, r + 1, opts, upto, stream)


def _say_estimate(round_s: float, done: int, opts: VerifyOptions, upto: int,
                  stream: TextIO) -> None:
    cap = opts.max_rounds if opts.until_known and opts.max_rounds else upto
    est = paired.time_estimate(round_s, done, cap)
    print(f"a round takes {round_s:.0f} s; {est['rounds_left_at_most']} more at most: "
          f"{est['worst_case_s'] / 60:.1f} min", file=stream, flush=True)
