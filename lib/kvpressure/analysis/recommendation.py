"""The one change to make: remedies ranked by their effect under latency limits, or, without a
what-if, the remedy the symptoms point to first.

Ranking (simulated remedies, :func:`recommend`): a remedy qualifies when its output throughput
at the target concurrency grows by at least ``min_gain_pct`` and its TTFT p95 and ITL p95 stay
within the limits: absolute limits when given (``ttft_p95_s``, ``itl_p95_s``, as
``kvpressure tune --limits`` writes them), else no more than ``latency_tolerance_pct`` worse than
the baseline. Qualifying remedies are ranked by that gain; the first is recommended, the second
is the runner-up. Remedies whose gain is below ``min_gain_pct`` have no effect worth a change.

Without simulation (:func:`recommend_from_symptoms`) the symptoms say what to try first: a pool
that holds fewer sequences than ``max_num_seqs`` admits -> lower ``max_num_seqs`` to what runs;
one sequence too large for the pool -> lower ``max_model_len``; long prefills slowing decodes ->
lower ``max_num_batched_tokens``; a full pool otherwise -> raise ``gpu_memory_utilization``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvpressure.analysis.limits import require_priced
from kvpressure.jsonable import finite_or_none as _finite

LATENCIES = (("ttft_p95", "TTFT p95"), ("itl_p95", "ITL p95"))
# The latencies a simulated remedy's change is priced on, as analysis.limits names them.
PRICED_LATENCIES = tuple(f"{key}_s" for key, _ in LATENCIES)


def _pct(v: float) -> str:
    return "0%" if round(v) == 0 else f"{v:+.0f}%"


def _limit_text(limits: Mapping[str, float], tolerance: float) -> str:
    if not limits:
        return f"TTFT p95 and ITL p95 no more than {tolerance:g}% above today's"
    return ", ".join(f"{k.removesuffix('_s')} <= {v:g} s" for k, v in limits.items())


def _latency(outcome: Mapping[str, Any], baseline: Mapping[str, Any], key: str
             ) -> tuple[float | None, float | None]:
    """(change %, new value in s) of one latency at the target."""
    change = _finite(outcome.get("cost", {}).get(f"{key}_change_pct"))
    base = _finite(baseline.get(f"{key}_s"))
    new = None if change is None or base is None else base * (1 + change / 100.0)
    return change, new


def _breaks(outcome: Mapping[str, Any], baseline: Mapping[str, Any],
            limits: Mapping[str, float], tolerance: float) -> list[str]:
    out = []
    for key, label in LATENCIES:
        change, new = _latency(outcome, baseline, key)
        limit = limits.get(f"{key}_s")
        if limits:
            if limit is not None and new is not None and new > limit:
                out.append(f"{label} {new:.3g} s > {limit:g} s")
        elif change is not None and change > tolerance:
            out.append(f"{label} {change:+.0f}%")
    return out


def _cost_text(outcome: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    parts, worse = [], False
    for key, label in LATENCIES:
        change, _ = _latency(outcome, baseline, key)
        if change is not None:
            parts.append(f"{label} {_pct(change)}")
            worse = worse or change > 0.5
    extra = []
    cost = outcome.get("cost", {})
    if cost.get("peak_concurrency_lost"):
        extra.append(f"{cost['peak_concurrency_lost']:.0f} fewer sequences at once")
    if cost.get("context_window_lost_tokens"):
        extra.append(f"a context window {cost['context_window_lost_tokens']:,} tokens shorter")
    if cost.get("precondition"):
        extra.append(cost["precondition"])
    lat = " / ".join(parts) or "latency not measured"
    head = f"at a cost of {lat}" if worse else f"and latency falls too ({lat})"
    return head + ("; watch: " + "; ".join(extra) if extra else "")


def _range(seeds: Sequence[float]) -> list[float] | None:
    return [min(seeds), max(seeds)] if len(seeds) > 1 else None


def _change_text(gain: float | None, spread: list[float] | None, seeds: int, where: str) -> str:
    """A throughput change at ``where`` with its spread over the seeds; "no measurable effect"
    when the spread holds zero (the change is inside the run-to-run noise)."""
    if gain is None:
        return f"output throughput at {where} not measured"
    if spread is None:
        return f"{_pct(gain)} output throughput at {where}"
    over = f"{_pct(spread[0])} to {_pct(spread[1])} over {seeds} seeds"
    if round(spread[0]) == round(spread[1]) == 0:
        return f"no change in output throughput at {where} (0% on each of {seeds} seeds)"
    if spread[0] <= 0.0 <= spread[1]:
        return f"no measurable effect on output throughput at {where} ({_pct(gain)}, {over})"
    return f"{_pct(gain)} output throughput at {where} ({over})"


def _level(axis: str, value: Any) -> str:
    """A level on the sweep's axis: ``concurrency 48`` or ``request rate 2 req/s``."""
    if axis == "request_rate":
        return f"request rate {_num(value)} req/s"
    return f"concurrency {_num(value)}"


def _where_to_run(gain: Mapping[str, Any], axis: str = "concurrency") -> str:
    """Which concurrency (or offered load) to run with the change: its own curve's operating
    limit."""
    peak_x, knee_x = _finite(gain.get("new_peak_x")), _finite(gain.get("new_knee_x"))
    end = _finite(gain.get("new_sustained_end"))
    if peak_x is None:
        return ""
    if axis == "request_rate":
        if gain.get("new_declines"):
            return (f" With it, admit at most {_num(peak_x)} requests/s: its curve peaks there "
                    "and falls after.")
        limit = knee_x if knee_x is not None else peak_x
        hold = (f" and holds to {_num(end)}" if end is not None and end > limit else "")
        return (f" With it, throughput reaches its plateau at {_num(limit)} requests/s{hold}; "
                "more offered load only adds waiting time.")
    if gain.get("new_declines"):
        return f" With it, run at most {_num(peak_x)} clients: its curve peaks there and falls after."
    limit = knee_x if knee_x is not None else peak_x
    hold = (f" and holds to {_num(end)}" if end is not None and end > limit else "")
    return (f" With it, run at {_num(limit)} clients or more: throughput reaches its plateau "
            f"there{hold}, and more clients only add waiting time.")


def recommend(report: Mapping[str, Any], settings: Mapping[str, Any],
              seed_gains: Mapping[str, Sequence[float]] | None = None,
              limits: Mapping[str, float] | None = None, *, min_gain_pct: float = 2.0,
              latency_tolerance_pct: float = 10.0,
              operating_seed_gains: Mapping[str, Sequence[float]] | None = None,
              axis: str = "concurrency") -> dict[str, Any]:
    """The recommendation from a remedy what-if (``evaluate_remedies(...).to_dict()``).

    ``seed_gains``: per remedy, its throughput change (%) at the target seed by seed (the range
    shown with the mean). ``axis``: what the levels are (``concurrency`` or
    ``request_rate``), for the wording. Returns ``text`` (one sentence), the chosen remedy's numbers, the
    runner-up and the remedies folded away (no effect, over the limits).
    """
    limits = dict(limits or {})
    require_priced(limits, PRICED_LATENCIES, "the simulated remedies", "limits")
    baseline = report.get("baseline") or {}
    target = report.get("target_concurrency")
    rows = []
    for o in report.get("outcomes", []):
        if not o.get("applicable"):
            continue
        gain = _finite(o.get("gain", {}).get("throughput_at_target_pct"))
        param, value = next(iter(o["overrides"].items()))
        seeds = [g for g in (seed_gains or {}).get(o["remedy"], []) if _finite(g) is not None]
        op_seeds = [g for g in (operating_seed_gains or {}).get(o["remedy"], [])
                    if _finite(g) is not None]
        g = o.get("gain", {})
        rows.append({
            "remedy": o["remedy"], "parameter": param, "value": value,
            "from": settings.get(param), "gain_pct": gain,
            "gain_range_pct": _range(seeds),
            "seeds": len(seeds),
            "operating_concurrency": _finite(g.get("operating_concurrency")),
            "operating_gain_pct": _finite(g.get("throughput_at_operating_pct")),
            "operating_gain_range_pct": _range(op_seeds),
            "peak_pct": _finite(g.get("peak_pct")),
            "ttft_p95_at_operating_pct": _finite(g.get("ttft_p95_at_operating_pct")),
            "itl_p95_at_operating_pct": _finite(g.get("itl_p95_at_operating_pct")),
            "where_to_run": _where_to_run(g, axis),
            "breaks": _breaks(o, baseline, limits, latency_tolerance_pct),
            "ttft_p95_change_pct": _latency(o, baseline, "ttft_p95")[0],
            "itl_p95_change_pct": _latency(o, baseline, "itl_p95")[0],
            "cost": _cost_text(o, baseline),
        })
    no_effect = [r for r in rows if r["gain_pct"] is None or r["gain_pct"] < min_gain_pct]
    over = [r for r in rows if r not in no_effect and r["breaks"]]
    ranked = sorted((r for r in rows if r not in no_effect and not r["breaks"]),
                    key=lambda r: -r["gain_pct"])
    refused = [{"remedy": o["remedy"], "parameter": next(iter(o["overrides"])),
                "value": next(iter(o["overrides"].values())),
                "from": settings.get(next(iter(o["overrides"]))), "why": o.get("reason", "")}
               for o in report.get("outcomes", []) if not o.get("applicable") and o.get("overrides")]
    out: dict[str, Any] = {
        "source": "simulated remedies", "concurrency": target,
        "limits": _limit_text(limits, latency_tolerance_pct),
        "ranked": ranked, "no_effect": no_effect, "over_limits": over, "not_run": refused,
    }
    if not ranked:
        out.update(remedy=None, text=(
            f"No change recommended: no remedy raised throughput at {_level(axis, target)} "
            f"by {min_gain_pct:g}% or more within the latency limits "
            f"({out['limits']})."))
        return out
    best = ranked[0]
    out.update(
        remedy=best["remedy"], parameter=best["parameter"], value=best["value"],
        runner_up=ranked[1] if len(ranked) > 1 else None,
        text=_do_this(best, target, axis),
    )
    return out


def _do_this(best: Mapping[str, Any], target: Any, axis: str = "concurrency") -> str:
    """The recommendation: the change, its gain at the focus level, at today's operating limit
    and at the peak, the latency there, each with its spread over the seeds, and where to run."""
    head = (f"Do this: set {best['parameter']} to {best['value']} (now {best['from']}): "
            + _change_text(best["gain_pct"], best["gain_range_pct"], best["seeds"],
                           _level(axis, target))
            + f", {best['cost']}.")
    op = best.get("operating_concurrency")
    if op is None or _finite(target) == op:
        return head + best.get("where_to_run", "")
    lat = [f"{label} {_pct(v)}" for label, v in
           (("TTFT p95", best.get("ttft_p95_at_operating_pct")),
            ("ITL p95", best.get("itl_p95_at_operating_pct"))) if v is not None]
    peak = ("" if best.get("peak_pct") is None else
            "; the peak throughput is unchanged" if round(best["peak_pct"]) == 0 else
            f"; the peak throughput changes by {_pct(best['peak_pct'])}")
    return (head + " At today's operating limit, "
            + _change_text(best.get("operating_gain_pct"), best.get("operating_gain_range_pct"),
                           best["seeds"], _level(axis, op))
            + (f", with {' / '.join(lat)}" if lat else "") + peak + "."
            + best.get("where_to_run", ""))


def _num(v: Any) -> str:
    f = _finite(v)
    return "?" if f is None else f"{f:g}"


def recommend_from_symptoms(result: Mapping[str, Any], settings: Mapping[str, Any],
                            why_not_simulated: str) -> dict[str, Any]:
    """What to try first, and why, from stage 06's symptoms and status (no what-if)."""
    status = result["status"]
    name = status.get("status")
    ev = {s["id"]: s.get("evidence", {}) for s in result["symptoms"]["symptoms"]}
    verdicts = {s["id"]: s.get("verdict") for s in result["symptoms"]["symptoms"]}
    mns = settings.get("max_num_seqs")
    running = _finite(ev.get("running_below_max_num_seqs", {}).get("mean_running"))
    silent = _finite(ev.get("running_below_max_num_seqs", {}).get("frac_silent"))
    base = {"source": "symptoms", "simulated": False, "why_not_simulated": why_not_simulated}
    if name == "bound by single-sequence length":
        return {**base, "remedy": "lower_max_model_len", "parameter": "max_model_len",
                "text": (f"Try first: lower max_model_len (now {settings.get('max_model_len')}) "
                         "toward the longest sequence the workload needs: one sequence takes a "
                         "large share of the KV pool, so fewer fit however concurrency is set.")}
    if name != "bound by KV blocks":
        return {**base, "remedy": None, "text": (
            "No KV-cache change recommended: the symptoms do not establish KV pressure "
            f"({name}).")}
    if status.get("prefill_interference"):
        return {**base, "remedy": "lower_max_num_batched_tokens",
                "parameter": "max_num_batched_tokens", "text": (
                    "Try first: lower max_num_batched_tokens (now "
                    f"{settings.get('max_num_batched_tokens')}): long prefills fill whole steps "
                    "and every decode in them waits.")}
    if verdicts.get("running_below_max_num_seqs") == "present" and running and mns:
        target = max(1, int(math.floor(running)))
        return {**base, "remedy": "lower_max_num_seqs", "parameter": "max_num_seqs",
                "value": target, "text": (
                    f"Try first: set max_num_seqs to about {target} (now {mns}): requests "
                    f"waited for KV space {silent:.0%} of the time while {running:.0f} of "
                    f"{mns} allowed sequences ran, so the pool, not the setting, limits the "
                    "batch; a matching setting stops the preemptions and their recompute.")
                if silent is not None else (
                    f"Try first: set max_num_seqs to about {target} (now {mns}): only "
                    f"{running:.0f} of {mns} allowed sequences ran while requests waited.")}
    return {**base, "remedy": "raise_gpu_memory_utilization",
            "parameter": "gpu_memory_utilization", "text": (
                "Try first: raise gpu_memory_utilization (now "
                f"{settings.get('gpu_memory_utilization', 'unknown')}) for a larger KV pool: the "
                "pool is full and sequences are preempted, while the running batch already "
                "fills max_num_seqs.")}
