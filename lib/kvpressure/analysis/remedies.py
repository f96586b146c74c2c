"""What-if for the workflow's remedies: simulate each change on the same workload, report its
gain and its cost, in the workflow's order, and say which to try first.

Order: first make concurrency or per-sequence size fit the pool
(lower ``max_num_seqs``, lower ``max_model_len``), only then grow the pool
(``gpu_memory_utilization``), then flatten the prefill peak (``max_num_batched_tokens``). Two
admission rules the seed's table does not list follow: full-sequence admission
(``scheduler_reserve_full_isl``, vLLM 0.33.0's default) and a KV ``watermark``.

The simulation is passed in: ``simulate_variant(overrides) -> runs`` (stage 06 gives its
sweep runner), so this module only compares runs tables.

Gain: throughput at the target concurrency and at the peak, recompute ratio at the target.
Cost: sequences that can no longer run at once (``max_num_seqs`` below the peak running count),
TTFT and ITL change at the target, context window lost (``max_model_len``), and the known
preconditions (a bigger ``gpu_memory_utilization`` squeezes activations and workspace).

The first remedy in order whose throughput gain at the target is at least ``min_gain_pct`` (or
that cuts the recompute ratio by half or more without losing throughput) and that refuses no
request of the workload is the one to try first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvpressure.analysis.knee import find_knee
from kvpressure.errors import InputError
from kvpressure.jsonable import to_jsonable

REMEDY_ORDER = (
    "lower_max_num_seqs",
    "lower_max_model_len",
    "raise_gpu_memory_utilization",
    "lower_max_num_batched_tokens",
    "scheduler_reserve_full_isl",
    "watermark",
)

# Every remedy's overrides at once -> their runs, in the same order: one sweep for all of them
# keeps both cores busy to the end instead of draining a pool per remedy.
RunsFn = Callable[[list[dict]], list[pd.DataFrame]]

# The remedy each engine argument's change is, so an experiment's own remedy values take the
# place of the defaults for the same argument.
PARAMETER_REMEDY = {
    "max_num_seqs": "lower_max_num_seqs",
    "max_model_len": "lower_max_model_len",
    "gpu_memory_utilization": "raise_gpu_memory_utilization",
    "max_num_batched_tokens": "lower_max_num_batched_tokens",
    "scheduler_reserve_full_isl": "scheduler_reserve_full_isl",
    "watermark": "watermark",
}


def given_remedies(changes: Mapping[str, Mapping]) -> dict[str, dict]:
    """Remedies an experiment lists (``{label: {parameter: value}}``, as
    ``Experiment.remedies()`` gives them) keyed as :func:`evaluate_remedies` takes them: the
    first value of a parameter in its remedy's place, further values (and parameters no remedy
    of the workflow names) under their own label, in the order given."""
    out: dict[str, dict] = {}
    for label, overrides in changes.items():
        if len(overrides) != 1:
            raise InputError(f"remedy {label}: one setting a remedy (got {len(overrides)})")
        param = next(iter(overrides))
        name = PARAMETER_REMEDY.get(param, label)
        out[name if name not in out else label] = dict(overrides)
    return out


@dataclass
class RemedyOutcome:
    remedy: str
    overrides: dict
    applicable: bool
    reason: str = ""
    gain: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)


@dataclass
class RemedyReport:
    target_concurrency: float | None
    baseline: dict
    outcomes: list[RemedyOutcome]
    try_first: str | None
    why: str

    def to_dict(self) -> dict:
        return to_jsonable(self)


def default_overrides(
    settings: Mapping, baseline_runs: pd.DataFrame, *, max_sequence_tokens: int | None = None,
    target: float | None = None, x: str = "concurrency",
) -> dict[str, dict | None]:
    """The concrete change for each remedy, from the baseline settings and runs.

    None marks a remedy that does not apply (e.g. the flag is already on).
    """
    out: dict[str, dict | None] = {}
    row = _row_at(baseline_runs, target, x) if target is not None else None
    mns = settings.get("max_num_seqs")
    running = None
    if row is not None and "mean_running" in row and not pd.isna(row["mean_running"]):
        running = float(row["mean_running"])
    if mns is not None and running is not None and math.floor(running) < mns:
        out["lower_max_num_seqs"] = {"max_num_seqs": max(1, int(math.floor(running)))}
    elif mns is not None:
        out["lower_max_num_seqs"] = {"max_num_seqs": max(1, int(mns) // 2)}
    else:
        out["lower_max_num_seqs"] = None
    mml = settings.get("max_model_len")
    # Lowering max_model_len below the longest sequence would refuse requests: only down to it.
    out["lower_max_model_len"] = (
        {"max_model_len": int(max_sequence_tokens)}
        if mml and max_sequence_tokens and max_sequence_tokens < mml else None
    )
    gmu = settings.get("gpu_memory_utilization")
    out["raise_gpu_memory_utilization"] = (
        {"gpu_memory_utilization": round(min(float(gmu) + 0.05, 0.98), 3)}
        if gmu is not None and float(gmu) < 0.98 else None
    )
    mbt = settings.get("max_num_batched_tokens")
    if mbt and settings.get("enable_chunked_prefill", True):
        out["lower_max_num_batched_tokens"] = {"max_num_batched_tokens": max(512, int(mbt) // 2)}
    else:
        out["lower_max_num_batched_tokens"] = None
    isl = settings.get("scheduler_reserve_full_isl")
    out["scheduler_reserve_full_isl"] = (
        {"scheduler_reserve_full_isl": True} if isl is False else None
    )
    wm = settings.get("watermark")
    out["watermark"] = {"watermark": 0.01} if wm is not None and float(wm) < 0.01 else None
    return out


def _row_at(runs: pd.DataFrame, target: float | None, x: str) -> pd.Series | None:
    if runs is None or runs.empty or x not in runs:
        return None
    num = runs.copy()
    num[x] = pd.to_numeric(num[x], errors="coerce")
    agg = num.groupby(x).mean(numeric_only=True).sort_index()
    if agg.empty:
        return None
    if target is None:
        return agg.iloc[-1]
    i = int(np.argmin(np.abs(agg.index.to_numpy(float) - target)))
    return agg.iloc[i]


def _get(row: pd.Series | None, col: str) -> float | None:
    if row is None or col not in row or pd.isna(row[col]):
        return None
    return float(row[col])


def _pct(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return 100.0 * (new - old) / old


def _summary(runs: pd.DataFrame, target: float | None, x: str, y: str) -> dict:
    row = _row_at(runs, target, x)
    k = None
    if x in runs and y in runs and runs[x].nunique() >= 1:
        k = find_knee(pd.to_numeric(runs[x]), pd.to_numeric(runs[y]))
    return {
        "throughput_at_target": _get(row, y),
        "peak_y": k.peak_y if k else None, "peak_x": k.peak_x if k else None,
        "knee_x": k.knee_x if k else None,
        "sustained_end": k.sustained_end if k else None,
        "declines": bool(k.declines) if k else None,
        "recompute_ratio_at_target": _get(row, "recompute_ratio"),
        "ttft_p95_s": _get(row, "ttft_p95_s"), "itl_p95_s": _get(row, "itl_p95_s"),
        "itl_mean_s": _get(row, "itl_mean_s"),
        "max_running": float(pd.to_numeric(runs["max_running"], errors="coerce").max())
        if "max_running" in runs else None,
    }


def evaluate_remedies(
    baseline_runs: pd.DataFrame,
    simulate_variants: RunsFn,
    *,
    settings: Mapping,
    target_concurrency: float | None = None,
    remedies: Mapping[str, dict | None] | None = None,
    max_sequence_tokens: int | None = None,
    x: str = "concurrency",
    y: str = "output_throughput",
    min_gain_pct: float = 2.0,
) -> RemedyReport:
    """Simulate the remedies with ``simulate_variants([overrides, ...])`` (one call for all)
    and compare each with the baseline.

    ``settings`` are the baseline's engine arguments; ``remedies`` (name -> overrides, None to
    skip) replaces the default changes of ``default_overrides``. ``target_concurrency`` defaults
    to the largest level of the baseline.
    """
    for col in (x, y):
        if col not in baseline_runs.columns:
            raise InputError(f"baseline runs: missing column '{col}'")
    if target_concurrency is None:
        target_concurrency = float(pd.to_numeric(baseline_runs[x]).max())
    chosen = dict(default_overrides(settings, baseline_runs, max_sequence_tokens=max_sequence_tokens,
                                    target=target_concurrency, x=x))
    if remedies is not None:
        unknown = [k for k, v in remedies.items() if k not in REMEDY_ORDER and not v]
        if unknown:
            raise InputError(f"remedies: unknown remedy '{unknown[0]}' "
                             f"(known: {', '.join(REMEDY_ORDER)})")
        chosen.update(remedies)
    base = _summary(baseline_runs, target_concurrency, x, y)
    # The workflow's order, then remedies given beyond it (another value, another setting).
    refused: dict[str, RemedyOutcome] = {}
    planned: dict[str, dict] = {}
    for name in [*REMEDY_ORDER, *[k for k in chosen if k not in REMEDY_ORDER]]:
        ov = chosen.get(name)
        if not ov:
            refused[name] = RemedyOutcome(name, {}, False, "does not apply to these settings")
        elif (name == "lower_max_model_len" and max_sequence_tokens
                and ov.get("max_model_len", math.inf) < max_sequence_tokens):
            refused[name] = RemedyOutcome(
                name, dict(ov), False,
                f"max_model_len {ov['max_model_len']} would refuse the workload's longest "
                f"sequence ({max_sequence_tokens} tokens)")
        else:
            planned[name] = dict(ov)
    simulated = dict(zip(planned, simulate_variants([dict(ov) for ov in planned.values()]),
                         strict=True)) if planned else {}
    outcomes = []
    for name in [*REMEDY_ORDER, *[k for k in chosen if k not in REMEDY_ORDER]]:
        if name in refused:
            outcomes.append(refused[name])
            continue
        ov, runs = planned[name], simulated[name]
        if not isinstance(runs, pd.DataFrame) or runs.empty:
            outcomes.append(RemedyOutcome(name, dict(ov), False, "the simulation gave no runs"))
            continue
        new = _summary(runs, target_concurrency, x, y)
        # Today's operating limit (the baseline's peak): what the change does where a user who
        # sized the clients by the curve already runs.
        at_op = _row_at(runs, base["peak_x"], x) if base["peak_x"] is not None else None
        op_base = _row_at(baseline_runs, base["peak_x"], x) if base["peak_x"] is not None else None
        gain = {
            "operating_concurrency": base["peak_x"],
            "throughput_at_operating_pct": _pct(_get(at_op, y), _get(op_base, y)),
            "ttft_p95_at_operating_pct": _pct(_get(at_op, "ttft_p95_s"),
                                              _get(op_base, "ttft_p95_s")),
            "itl_p95_at_operating_pct": _pct(_get(at_op, "itl_p95_s"),
                                             _get(op_base, "itl_p95_s")),
            "new_peak_x": new["peak_x"], "new_knee_x": new["knee_x"],
            "new_sustained_end": new["sustained_end"], "new_declines": new["declines"],
            "throughput_at_target": new["throughput_at_target"],
            "throughput_at_target_pct": _pct(new["throughput_at_target"],
                                             base["throughput_at_target"]),
            "peak_y": new["peak_y"], "peak_pct": _pct(new["peak_y"], base["peak_y"]),
            "knee_x": new["knee_x"],
            "recompute_ratio_at_target": new["recompute_ratio_at_target"],
            "recompute_ratio_before": base["recompute_ratio_at_target"],
        }
        cost: dict = {
            "ttft_p95_change_pct": _pct(new["ttft_p95_s"], base["ttft_p95_s"]),
            "itl_p95_change_pct": _pct(new["itl_p95_s"], base["itl_p95_s"]),
            "itl_mean_change_pct": _pct(new["itl_mean_s"], base["itl_mean_s"]),
        }
        if "max_num_seqs" in ov:
            lost = None
            if base["max_running"] is not None:
                lost = max(0.0, base["max_running"] - ov["max_num_seqs"])
            cost["peak_concurrency_lost"] = lost
        if "max_model_len" in ov and settings.get("max_model_len"):
            cost["context_window_lost_tokens"] = int(settings["max_model_len"]) - int(
                ov["max_model_len"])
        if name == "raise_gpu_memory_utilization":
            cost["precondition"] = ("less memory for activations and workspace; can still fail "
                                    "when the prefill peak rises")
        if name == "lower_max_num_batched_tokens":
            cost["precondition"] = "lower per-batch throughput; longer TTFT for long prompts"
        outcomes.append(RemedyOutcome(name, dict(ov), True, "", gain, cost))

    try_first, why = None, "no remedy gained throughput or cut recompute at the target"
    for o in outcomes:
        if not o.applicable:
            continue
        g = o.gain.get("throughput_at_target_pct")
        r0, r1 = o.gain.get("recompute_ratio_before"), o.gain.get("recompute_ratio_at_target")
        cut = r0 is not None and r1 is not None and r0 > 0 and r1 <= 0.5 * r0
        if (g is not None and g >= min_gain_pct) or (cut and (g is None or g >= 0)):
            try_first = o.remedy
            level = (f"request rate {target_concurrency:g} req/s" if x == "request_rate"
                     else f"concurrency {target_concurrency:g}")
            why = (f"first in the workflow's order with a gain: throughput at {level} "
                   f"{'+' if (g or 0) >= 0 else ''}{(g or 0):.1f}%"
                   + (f", recompute ratio {r0:.3f} -> {r1:.3f}" if cut else ""))
            break
    return RemedyReport(target_concurrency=target_concurrency, baseline=base, outcomes=outcomes,
                        try_first=try_first, why=why)
