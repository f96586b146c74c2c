"""Stage 06: the symptom checklist, the status and the remedies, from the earlier stages' files.

Remedies are simulated on the same request sets when the investigation is a simulation (each
remedy is one more sweep of the baseline's levels with the experiment's workload seeds, compared
level by level with the baseline's means over the same seeds; no point folders are written); on
ingested data the workflow's table of remedies and costs is given without numbers, and the
recommendation is the what-if of the measured server's fitted twin, built here into the run
folder's ``twin/`` (``twin/in_report.py``; a refused twin leaves the symptoms' advice).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.investigation.collect import Tables
from kvpressure.investigation.stages import StageOutput
from kvpressure.report.sentences import (
    knee_sentence,
    record_axis,
    runs_label,
    symptom_sentence,
    to_plain,
)
from kvpressure.stages.files import as_result, read_stage
from kvpressure.stages.results import (
    ComparisonResult,
    InterferenceResult,
    VerdictResult,
)

# The workflow's remedy table (effect, cost), for data the kit cannot re-run.
STATIC_REMEDIES: dict[str, tuple[str, str, str, str]] = {
    "lower_max_num_seqs": ("max_num_seqs", "lower", "fewer resident sequences, less KV pressure "
                           "and preemption", "lower peak concurrency"),
    "lower_max_model_len": ("max_model_len", "lower", "smaller per-sequence footprint, less "
                            "pool pressure", "smaller context window"),
    "raise_gpu_memory_utilization": ("gpu_memory_utilization", "raise", "larger KV pool, more "
                                     "sequences fit, less preemption", "squeezes activations "
                                     "and workspace; can still fail when the prefill peak rises"),
    "lower_max_num_batched_tokens": ("max_num_batched_tokens", "lower", "flattens the prefill "
                                     "peak, leaves budget for KV", "lower per-batch throughput"),
}


# The smallest max_num_seqs vLLM 0.33.0's API server defaults to on any GPU (256; 1024 on GPUs
# of 70 GiB or more other than the A100, and on those of 160 GiB or more): a batch that never
# reached it ran below the setting whichever default the server had.
DEFAULT_MAX_NUM_SEQS_FLOOR = 256


def assumed_max_num_seqs(checklist: Any, settings: Mapping[str, Any],
                         max_running: float | None) -> int | None:
    """The max_num_seqs to judge the silent symptom against when the data does not carry it:
    vLLM's smallest default, when fewer sequences than that ever ran (else None: no default
    would tell the symptom apart)."""
    if settings.get("max_num_seqs") is not None:
        return None
    silent = next((sym for sym in checklist.symptoms if sym.id == "running_below_max_num_seqs"),
                  None)
    if silent is None or silent.verdict != "no data":
        return None
    missing = str(silent.evidence.get("missing", ""))
    if missing.replace(" ", "") != "max_num_seqs":
        return None  # something else is missing too: a default would not be enough
    return (DEFAULT_MAX_NUM_SEQS_FLOOR if max_running is not None
            and max_running < DEFAULT_MAX_NUM_SEQS_FLOOR else None)


def assumption_finding(assumed: int) -> str:
    """The status's line saying which max_num_seqs was assumed and how to give the real one."""
    return (f"assumed: max_num_seqs is not in the data, so the symptoms are judged against "
            f"{assumed}, vLLM 0.33.0's smallest API-server default (1024 on GPUs of 70 GiB or "
            "more other than the A100); fewer sequences than that ever ran, so the status holds "
            "for either; give the real value with --param 'engine_args={max_num_seqs: N}'")


def symptoms_frame(checklist: Any, max_num_seqs: Any = None,
                   max_num_seqs_assumed: bool = False, axis: str = "concurrency"
                   ) -> pd.DataFrame:
    """The checklist as a reader's table: the symptom, whether it holds, what was seen."""
    rows = [{"symptom": s["name"], "holds": {"present": "yes", "absent": "no"}.get(
                s["verdict"], s["verdict"]),
             "what was seen": symptom_sentence(s, max_num_seqs, max_num_seqs_assumed, axis)}
            for s in checklist.to_dict()["symptoms"]]
    return pd.DataFrame(rows)


def _simulate_levels(experiment_path: str, levels: list[float], jobs: int = 2,
                     kept: dict[str, pd.DataFrame] | None = None,
                     progress: Callable[[int, int], None] | None = None):
    """``[overrides, ...] -> [runs, ...]`` over the baseline's levels, for the remedies'
    what-if, as one sweep (one pool busy to its last point); each remedy's runs are also kept
    in ``kept`` (by its overrides) for the seed-by-seed range. ``progress(done, total)``
    after each point."""
    import tempfile

    from kvpressure.simulation.experiment import load_experiment
    from kvpressure.sweeps.sweep import run_sweep

    exp = load_experiment(experiment_path)

    def run(all_overrides: list[dict]) -> list[pd.DataFrame]:
        # A variant per remedy, named by its change (a folder-safe name: no '/').
        names = [", ".join(f"{k}={v}" for k, v in ov.items()).replace("/", "-")
                 for ov in all_overrides]
        variants = dict(zip(names, all_overrides, strict=True))
        total = len(variants) * len(levels) * len(exp.seeds)
        done = 0

        def on_point(_line: str) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, total)

        with tempfile.TemporaryDirectory(prefix="kvpressure-remedy-") as tmp:
            runs = run_sweep(exp, tmp, variants=variants, concurrencies=levels, jobs=jobs,
                             write_points=False, progress=on_point)
        out = []
        for name, ov in variants.items():
            part = runs[runs["variant"] == name].reset_index(drop=True)
            if kept is not None:
                kept[repr(sorted(ov.items()))] = part
            out.append(part)
        return out

    return run


def seed_gains(baseline: pd.DataFrame, kept: dict[str, pd.DataFrame], report: dict[str, Any],
               y: str = "output_throughput", level: float | None = None,
               x: str = "concurrency") -> dict[str, list[float]]:
    """Per remedy, its throughput change (%) at ``level`` (default: the target concurrency)
    seed by seed against the baseline's same seed (the same request set): the spread the mean
    hides, which is the run-to-run noise of a simulation."""
    target = report["target_concurrency"] if level is None else level
    out: dict[str, list[float]] = {}
    if target is None or "seed" not in baseline:
        return out

    def at_target(runs: pd.DataFrame) -> pd.Series:
        levels = pd.to_numeric(runs[x])
        nearest = levels.iloc[(levels - target).abs().argsort().iloc[0]]
        part = runs[levels == nearest]
        return part.groupby("seed")[y].mean()

    base = at_target(baseline)
    for o in report["outcomes"]:
        runs = kept.get(repr(sorted(o["overrides"].items())))
        if not o["applicable"] or runs is None or "seed" not in runs:
            continue
        new = at_target(runs)
        common = [s for s in new.index if s in base.index and base[s]]
        out[o["remedy"]] = [float(100.0 * (new[s] - base[s]) / base[s]) for s in common]
    return out


def _twin_recommendation(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The twin's recommendation when ``kvpressure twin`` wrote a folder into the run folder."""
    import json

    path = Path(run_dir) / "twin" / "twin.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    rec = (doc.get("remedies") or {}).get("recommendation") or {}
    if not rec.get("text"):
        return None
    checked = _verification(run_dir, rec.get("overrides") or {},
                            ((doc.get("remedies") or {}).get("focus") or {}).get("concurrency"))
    # The fit travels with the prediction, so the page states it first.
    return {"source": "twin", "simulated": True, "remedy": rec.get("setting"),
            "text": ("Do this (the fitted twin's what-if): " if rec.get("trusted") else
                     "Twin's what-if, not trusted: ") + rec["text"] + "."
            + (" " + checked if checked else ""),
            "twin_fit": (doc.get("fit") or {}).get("verdict"), "trusted": bool(rec.get("trusted"))}


def _verification(run_dir: str | os.PathLike[str], overrides: dict[str, Any],
                  focus: Any) -> str | None:
    """What ``kvpressure verify-remedy`` measured of this recommendation, when its folder is
    ``verify/`` in the run folder or beside it (a collect folder's ``report/``): the level at
    the twin's focus, else the first verified."""
    import json

    from kvpressure.report.sentences import verification_sentence

    for folder in (Path(run_dir), Path(run_dir).parent):
        path = folder / "verify" / "verify.json"
        if not overrides or not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if (doc.get("settings") or {}).get("set") != overrides or not doc.get("levels"):
            continue
        level = next((lv for lv in doc["levels"] if lv.get("concurrency") == focus),
                     doc["levels"][0])
        return verification_sentence(level, ", ".join(f"{k}={v}" for k, v in overrides.items()))
    return None


def _twin_refusal(run_dir: str | os.PathLike[str]) -> str | None:
    """Why the run folder's twin was refused, when it was."""
    from kvpressure.twin.in_report import read_report_twin

    twin = read_report_twin(run_dir)
    return twin.refused if twin is not None else None


def _experiment_remedies(path: Path) -> dict[str, dict] | None:
    """The remedy values the experiment lists, in place of the defaults for their settings
    (None when it lists none)."""
    from kvpressure.analysis.remedies import given_remedies
    from kvpressure.simulation.experiment import load_experiment

    changes = load_experiment(str(path)).remedies()
    return given_remedies(changes) if changes else None


def _remedy_rows(report: dict[str, Any], settings: dict[str, Any],
                 repeats: int = 1, axis: str = "concurrency") -> list[dict[str, str]]:
    from kvpressure.report.sentences import level_words

    words = level_words(axis)
    rows = []
    for o in report["outcomes"]:
        if not o["applicable"]:
            continue
        param, new = next(iter(o["overrides"].items()))
        g, c = o["gain"], o["cost"]
        effect = []
        if g.get("throughput_at_target_pct") is not None:
            effect.append(f"throughput at {words.at(report['target_concurrency'])} "
                          f"{g['throughput_at_target_pct']:+.0f}%")
        if g.get("recompute_ratio_at_target") is not None:
            effect.append(f"recompute ratio {g['recompute_ratio_before']:.1%} -> "
                          f"{g['recompute_ratio_at_target']:.1%} ({runs_label(repeats)})")
        if g.get("peak_pct") is not None:
            effect.append(f"peak {g['peak_pct']:+.0f}%")
        cost = []
        if c.get("peak_concurrency_lost"):
            cost.append(f"{c['peak_concurrency_lost']:.0f} fewer sequences at once")
        if c.get("context_window_lost_tokens"):
            cost.append(f"context window {c['context_window_lost_tokens']:,} tokens shorter")
        for key, label in (("ttft_p95_change_pct", "TTFT p95"), ("itl_p95_change_pct", "ITL p95")):
            if c.get(key) is not None and not math.isnan(c[key]):
                cost.append(f"{label} {c[key]:+.0f}%")
        if c.get("precondition"):
            cost.append(c["precondition"])
        rows.append({
            "parameter": param,
            "change": f"{settings.get(param)} -> {new}",
            "effect": "; ".join(effect) or "simulated: no change at the target",
            "cost": "; ".join(cost) or "none measured",
            "remedy": o["remedy"],
        })
    return rows


def record_stage(tables: Tables, run_dir: str | os.PathLike[str],
                 simulate_remedies: bool = True, limits: Mapping[str, float] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> StageOutput:
    """Symptoms, status and remedies; ``result`` is what ``analysis/record.json`` holds."""
    from kvpressure.analysis.limits import require_priced
    from kvpressure.analysis.recommendation import (
        PRICED_LATENCIES,
        recommend,
        recommend_from_symptoms,
    )
    from kvpressure.analysis.remedies import evaluate_remedies
    from kvpressure.analysis.status import KV_BOUND, NOT_ESTABLISHED, SEQ_BOUND, decide_status
    from kvpressure.analysis.symptoms import check_symptoms
    from kvpressure.investigation.stages import focus_recompute_estimate

    info = tables.info
    settings = info.settings
    x = tables.x
    t0, t1 = tables.gauge_window
    base = tables.baseline_runs  # every repeat: the symptoms' curve and the remedies average them
    series = tables.series if len(tables.series) else None  # missing, never read as zero
    def checklist_for(max_num_seqs: int | None) -> Any:
        return check_symptoms(
            series, runs=base, steps=tables.steps, t0=t0, t1=t1, run=info.focus.run,
            max_num_seqs=max_num_seqs, x=x,
            recompute=None if series is None else focus_recompute_estimate(tables),
            counters=tables.window, counter_origin=info.focus.counter_origin,
        )

    checklist = checklist_for(settings.get("max_num_seqs"))
    assumed = None
    if series is not None and settings.get("max_num_seqs") is None:
        from kvpressure.analysis.waiting import waiting_from_series

        top = waiting_from_series(series, t0, t1, run=info.focus.run).max_running
        assumed = assumed_max_num_seqs(checklist, settings, top)
    if assumed is not None:
        checklist = checklist_for(assumed)
    compared = read_stage(run_dir, ComparisonResult)
    comparison = compared if compared.available else None
    interference = read_stage(run_dir, InterferenceResult)
    max_seq = None
    if tables.requests is not None:
        max_seq = int((tables.requests["prompt_len"] + tables.requests["output_len"]).max())
    pool = None
    if settings.get("num_gpu_blocks") and settings.get("block_size"):
        pool = int(settings["num_gpu_blocks"]) * int(settings["block_size"])
    status = decide_status(checklist, comparison=comparison, interference=interference,
                           max_sequence_tokens=max_seq, pool_tokens=pool,
                           max_model_len=settings.get("max_model_len"),
                           idle=info.load.idle)
    focus_c = info.focus.level
    if not info.simulated and simulate_remedies:
        # Measured data: its fitted twin predicts the remedies (twin/in_report.py).
        from kvpressure.twin.in_report import build_report_twin

        build_report_twin(run_dir, focus_c, list(info.levels), limits, axis=x, read=tables.folder)
    remedies: dict[str, Any]
    if info.simulated and simulate_remedies and status.status == KV_BOUND:
        # Refused before the remedies' sweep: a limit they do not price is never dropped.
        require_priced(dict(limits or {}), PRICED_LATENCIES, "the simulated remedies", "limits")
        experiment = str(Path(run_dir) / "experiment.yaml")
        exp_path = next((i.path for i in info.inputs), experiment)
        from kvpressure.paths import REPO_ROOT

        candidate = Path(exp_path) if Path(exp_path).is_absolute() else REPO_ROOT / exp_path
        kept: dict[str, pd.DataFrame] = {}
        report = evaluate_remedies(
            base, _simulate_levels(str(candidate), info.levels, kept=kept,
                                   progress=progress),
            settings=settings, target_concurrency=focus_c, max_sequence_tokens=max_seq,
            remedies=_experiment_remedies(candidate), x=x,
        ).to_dict()
        rows = _remedy_rows(report, settings, tables.repeats, x)
        remedies = {"simulated": True, "try_first": report["try_first"], "why": report["why"],
                    "rows": rows, "report": report,
                    "recommendation": recommend(
                        report, settings, seed_gains(base, kept, report, x=x), limits,
                        operating_seed_gains=seed_gains(base, kept, report,
                                                        level=report["baseline"]["peak_x"], x=x),
                        axis=x)}
    elif status.status != NOT_ESTABLISHED:
        order = list(STATIC_REMEDIES)
        if status.status == SEQ_BOUND:  # one sequence is the problem: shrink it first
            order.remove("lower_max_model_len")
            order.insert(0, "lower_max_model_len")
        rows = [{"parameter": p, "change": f"{d} (from {settings.get(p, 'unknown')})",
                 "effect": e, "cost": c, "remedy": name}
                for name in order for (p, d, e, c) in [STATIC_REMEDIES[name]]]
        remedies = {"simulated": False, "try_first": order[0],
                    "why": "the workflow's order: first make concurrency or per-sequence size fit "
                           "the pool, only then grow the pool (not simulated: "
                           + ("ingested data cannot be re-run)" if not info.simulated
                              else "remedy simulation was switched off)"),
                    "rows": rows}
    else:
        remedies = {"simulated": False, "try_first": None,
                    "why": "no KV-pressure remedy is called for by this status", "rows": []}
    if assumed is not None:
        status.findings.append(assumption_finding(assumed))
    status_d = status.to_dict()
    if "recommendation" not in remedies:
        refused = None if info.simulated else _twin_refusal(run_dir)
        rec = _twin_recommendation(run_dir)
        if rec is None:
            rec = recommend_from_symptoms(
                {"status": status_d, "symptoms": checklist.to_dict()},
                settings if assumed is None else {**settings, "max_num_seqs": assumed},
                ("ingested data cannot be re-run" + (f", and no twin of it: {refused}"
                                                     if refused else ""))
                if not info.simulated else "remedy simulation was switched off")
            if assumed is not None and rec.get("parameter") == "max_num_seqs":
                rec["text"] += (f" (max_num_seqs {assumed} is vLLM's default, assumed: the data "
                                "does not carry the server's setting)")
        remedies["recommendation"] = rec
    result = {
        "symptoms": checklist.to_dict(),
        "status": status_d,
        "remedies": remedies,
    }
    frames = {"symptoms": symptoms_frame(checklist, settings.get("max_num_seqs") or assumed,
                                         assumed is not None, x),
              "remedies": pd.DataFrame(remedies["rows"],
                                       columns=["parameter", "change", "effect", "cost"])}
    return StageOutput(as_result(VerdictResult, result), frames)


def closing_lines(run_dir: str | os.PathLike[str]) -> list[str]:
    """What ``kvpressure report`` prints when done: the status, the curve in one sentence,
    and the recommendation (plain text, for a terminal)."""
    from kvpressure.record.io import load_record

    record = load_record(Path(run_dir) / "record.yaml")
    lines = [f"status: {record.status}"]
    knee = record.perf.knee
    words = record_axis(record)
    if knee is not None:
        levels = (record.workload.request_rates if words.axis == "request_rate"
                  else record.workload.concurrency_levels)
        last = max(levels or [knee.peak_x])
        lines.append(to_plain(knee_sentence(knee, last, words.axis)))
    rec = read_stage(run_dir, VerdictResult).remedies.recommendation
    if rec.get("text"):
        lines.append(rec["text"])
        if rec.get("runner_up"):
            r = rec["runner_up"]
            lines.append(f"runner-up: {r['parameter']} {r['from']} -> {r['value']} "
                         f"({r['gain_pct']:+.0f}% at {words.at(rec['concurrency'])})")
    return lines
