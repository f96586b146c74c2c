"""Remedies on the fitted twin, their uncertainty, and the setting to recommend.

The remedies and their gains and costs are the kit's (``analysis.remedies``), simulated on the
twin at every measured level. Two changes for a measured server: lowering ``max_num_seqs``
goes to what the pool holds (full sequences of the focus level's mean length, the number that
runs without preemption), and growing the pool through ``gpu_memory_utilization`` is left out
(the twin's pool is measured; how it grows with memory needs the hardware profile).

Each setting is also priced under every bootstrap draw of the coefficients, on the same
request set as the baseline, so the predicted change in throughput at the focus level comes
with an interval. The recommendation is the setting (the baseline included) with the highest
predicted throughput at the focus level whose TTFT and ITL percentiles meet the limits, when
it gains at least 2% over the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.analysis.limits import broken, require_priced
from kvpressure.errors import InputError
from kvpressure.twin.lengths import MEANS
from kvpressure.twin.noise import (
    NO_EFFECT,
    RAISES,
    change_interval,
    effect_text,
    run_to_run_noise,
)
from kvpressure.twin.simulate import simulate_level
from kvpressure.twin.workload import REDRAWS

# The latencies a twin's level prices (simulate.py), as analysis.limits names them.
PRICED_LATENCIES = ("ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_mean_s",
                    "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_mean_s", "tpot_p99_s",
                    "e2e_mean_s", "e2e_p99_s")


def pool_holds(settings: Mapping[str, Any], workload: Any) -> int:
    """How many sequences of the workload's mean full length (prompt + output) the pool holds."""
    bs = int(settings["block_size"])
    mean_len = float(np.mean(np.add(workload.prompt_lens, workload.output_lens)))
    return max(1, int(settings["num_gpu_blocks"]) // max(1, math.ceil(mean_len / bs)))


def _curve(twin: Any, overrides: Mapping[str, Any]) -> pd.DataFrame:
    rows = [twin.predict_level(c, overrides) for c in sorted(twin.workloads)]
    return pd.DataFrame(rows)


def _priced(twin: Any, focus: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Point prediction and bootstrap draws at the focus level for one setting."""
    point = twin.predict_level(focus, overrides or None)
    draws = twin.level_draws(focus, overrides or None)
    thr, ttft_p95 = draws["output_throughput"], draws["ttft_p95_s"]
    return {"point": point,
            "throughput_draws": thr if len(thr) else np.array([point["output_throughput"]]),
            "ttft_p95_draws": ttft_p95 if len(ttft_p95) else np.array([point["ttft_p95_s"]])}


def _interval(values: np.ndarray) -> list[float]:
    lo, mid, hi = np.percentile(values, [5, 50, 95])
    return [float(lo), float(mid), float(hi)]


def _meets(point: Mapping[str, Any], limits: Mapping[str, float]) -> tuple[bool, list[str]]:
    out = broken(point, limits)
    return not out, out


def predict_remedies(twin: Any, *, focus: float | None, limits: Mapping[str, float],
                     candidates: Mapping[str, Mapping[str, Any]] | None = None,
                     latency_tolerance_pct: float | None = None,
                     min_gain_pct: float = 2.0) -> dict[str, Any]:
    """The kit's remedy report on the twin, every candidate's predicted effect at ``focus``
    with its bootstrap interval, and the recommendation under ``limits``. Without limits and
    with ``latency_tolerance_pct``, the limits are the twin's own TTFT and ITL p95 at the
    focus level that much worse (the report's rule: no more than 10% worse than now). A
    setting gaining less than ``min_gain_pct`` at the focus level is not recommended (the
    kit's threshold, ``analysis.recommendation``)."""
    from kvpressure.analysis.remedies import default_overrides, evaluate_remedies
    from kvpressure.twin.measured import level_value

    levels = sorted(twin.workloads)
    focus_rule = "given"
    if focus is not None:
        focus = level_value(focus, twin.key)
    elif twin.open_loop:
        focus, focus_rule = levels[-1], "the highest request rate"
    else:
        from kvpressure.analysis.focus import focus_level

        focus, focus_rule = focus_level(twin.measured.levels)
    if focus not in twin.workloads:
        raise InputError(f"--focus {focus:g}: not a measured level "
                         f"({', '.join(f'{c:g}' for c in levels)})")
    at = twin.level_name(focus)
    require_priced(limits, PRICED_LATENCIES, "the twin", "limits")
    settings = twin.settings
    fits = bool(twin.report.verdict.fits)
    trust = ("the twin fits the measured curve (" + twin.report.verdict.text + ")") if fits else (
        "UNTRUSTED: the twin does not fit the measured curve (" + twin.report.verdict.text
        + "); these predictions show the scheduler's logic, not this server's numbers")
    base_curve = pd.DataFrame([twin.report.twin_levels[c] for c in levels])
    longest = max(w.max_sequence_tokens() for w in twin.workloads.values())
    holds = pool_holds(settings, twin.workloads[focus])
    chosen = default_overrides(settings, base_curve, max_sequence_tokens=longest, target=focus,
                               x=twin.key)
    chosen["lower_max_num_seqs"] = (
        {"max_num_seqs": holds} if holds < int(settings["max_num_seqs"]) else None)
    chosen["raise_gpu_memory_utilization"] = None
    mbt = int(settings["max_num_batched_tokens"])
    # The kit's floor of 512 would raise a budget already below it: halve it, or nothing.
    chosen["lower_max_num_batched_tokens"] = (
        {"max_num_batched_tokens": mbt // 2}
        if settings.get("enable_chunked_prefill", True) and mbt // 2 >= int(
            settings["block_size"]) else None)
    kit = evaluate_remedies(base_curve, lambda ovs: [_curve(twin, ov) for ov in ovs],
                            settings=settings,
                            target_concurrency=focus, remedies=chosen,
                            max_sequence_tokens=longest, x=twin.key)
    options: dict[str, dict[str, Any]] = {"baseline": {}}
    for o in kit.outcomes:
        if o.applicable:
            options[o.remedy] = dict(o.overrides)
    mns = int(settings["max_num_seqs"])
    for f in (0.5, 0.75, 1.25, 1.5):
        v = int(round(holds * f))
        if 1 <= v < mns and v != holds:
            options.setdefault(f"max_num_seqs={v}", {"max_num_seqs": v})
    # The pool and the admission rule, both ways: what a KV-bound knee turns on.
    options.setdefault("larger_pool", {"num_gpu_blocks": 2 * int(settings["num_gpu_blocks"])})
    if settings.get("scheduler_reserve_full_isl") is True:
        options.setdefault("admit_by_first_chunk", {"scheduler_reserve_full_isl": False})
    for name, ov in (candidates or {}).items():
        options[str(name)] = dict(ov)
    # A remedy that sets what is already set changes nothing: not a remedy.
    no_ops = sorted(n for n, ov in options.items()
                    if ov and all(settings.get(k) == v for k, v in ov.items()))
    for n in no_ops:
        del options[n]
    # The same change under two names is priced once, under the later (the caller's) name.
    named: dict[str, str] = {}
    for n, ov in list(options.items()):
        same = named.get(repr(sorted(ov.items())))
        if ov and same is not None:
            del options[same]
        named[repr(sorted(ov.items()))] = n
    assumed = set(twin.assumed_settings)
    base = _priced(twin, focus, {})
    limits_rule = "given"
    if not limits and latency_tolerance_pct is not None:
        grow = 1.0 + float(latency_tolerance_pct) / 100.0
        limits = {k: float(base["point"][k]) * grow for k in ("ttft_p95_s", "itl_p95_s")
                  if math.isfinite(float(base["point"][k])) and base["point"][k] > 0}
        limits_rule = f"the twin's TTFT and ITL p95 at {at} +{latency_tolerance_pct:g}%"
    fit = twin.fitted
    noise = run_to_run_noise(twin.measured.runs, twin.key, twin.report.table,
                             fit.throughput_leverage)
    work = twin.workloads[focus]
    spread_known = work.lengths_source != MEANS
    # Versions of the focus level the data cannot tell apart: its lengths drawn again where
    # they are a draw, a closed loop's requests sent at once in another order.
    redraws = [w for w in (work.redrawn(seed) for seed in range(1, REDRAWS + 1))
               if w is not work]

    def redrawn_throughputs(ov: Mapping[str, Any]) -> np.ndarray:
        return np.array([simulate_level({**settings, **ov}, w, fit.step_coefficients(),
                                        fit.theta["ttft_offset"])["output_throughput"]
                         for w in redraws], dtype=float)

    base_redrawn = redrawn_throughputs({})
    table = []
    for name, ov in options.items():
        got = base if not ov else _priced(twin, focus, ov)
        p = got["point"]
        ok, broken = _meets(p, limits)
        change = 100.0 * (got["throughput_draws"] / base["throughput_draws"] - 1.0)
        point_change = 100.0 * (p["output_throughput"] / base["point"]["output_throughput"] - 1)
        coef = _interval(change)
        redrawn = (100.0 * (redrawn_throughputs(ov) / base_redrawn - 1.0)
                   if redraws and ov else None)
        draws = None if redrawn is None else np.append(redrawn, point_change)
        # The current settings measured again (a restart, a setting already set) are a
        # change between two runs too: no effect, but the band of both runs' noise, never
        # [0, 0], so a measured restart is read against it.
        lo, hi, effect = change_interval(point_change, coef[0], coef[2], draws, noise,
                                         spread_known or not ov)
        table.append({
            "setting": name, "overrides": ov,
            "output_throughput": p["output_throughput"],
            "output_throughput_p05_p50_p95": _interval(got["throughput_draws"]),
            "throughput_change_pct": point_change,
            "throughput_change_pct_p05_p50_p95": coef,
            "throughput_change_pct_with_noise": [lo, hi],
            "effect": effect if ov else NO_EFFECT,
            "effect_text": effect_text(point_change, lo, hi, effect, noise, spread_known)
            if ov else ("the current settings (measured again, a level's throughput moves "
                        f"by {lo:+.1f}% to {hi:+.1f}%: the run-to-run noise of two runs)"),
            "redraws_change_pct": None if redrawn is None else redrawn.tolist(),
            "better_than_baseline_share": float(np.mean(change > 0)) if ov else None,
            "ttft_p95_s": p["ttft_p95_s"],
            "ttft_p95_s_p05_p50_p95": _interval(got["ttft_p95_draws"]),
            "itl_p95_s": p["itl_p95_s"], "ttft_p50_s": p["ttft_p50_s"],
            "itl_p50_s": p["itl_p50_s"], "preemptions": p["preemptions"],
            "recompute_ratio": p["recompute_ratio"], "meets_limits": ok,
            "limits_broken": broken,
            "changes_assumed_settings": sorted(set(ov) & assumed),
        })
    # A change to a setting the data does not show is a change from a guess: not recommended.
    # ... and one inside the noise would not be seen to work: the baseline stays.
    # More KV memory is hardware, not a setting: priced, said, not recommended.
    allowed = [r for r in table if r["meets_limits"] and not r["changes_assumed_settings"]
               and (r["setting"] == "baseline" or r["effect"] == RAISES)
               and "num_gpu_blocks" not in r["overrides"]]
    if allowed:
        top = max(allowed, key=lambda r: (r["output_throughput"], r["setting"] == "baseline"))
        # A gain below the kit's threshold is no reason to change a production setting.
        small = top["setting"] != "baseline" and top["throughput_change_pct"] < min_gain_pct
        best = next((r for r in table if r["setting"] == "baseline"), top) if small else top
        if best["setting"] == "baseline":
            text = (f"keep the current settings: no candidate raises throughput at {at} "
                    f"by {min_gain_pct:g}% or more, beyond the run-to-run noise, within the "
                    "limits" + (f" (the best, {top['setting']}, "
                                f"{top['throughput_change_pct']:+.1f}%)" if small else ""))
            flagged = [r["setting"] for r in table if r["changes_assumed_settings"]
                       and r["effect"] == RAISES and r["meets_limits"]]
            if flagged:
                text += ("; " + ", ".join(flagged) + " would change a setting the data does "
                         "not show (" + ", ".join(sorted({k for r in table if r["setting"] in
                                                          flagged
                                                          for k in r["changes_assumed_settings"]}))
                         + "): give its value (--set) to have it priced")
        else:
            change = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
            name = change if best["setting"] == change else f"{best['setting']} ({change})"
            text = (f"{name}: output throughput at {at} {best['effect_text']}, TTFT p95 "
                    f"{best['ttft_p95_s']:.3g} s, ITL p95 {best['itl_p95_s'] * 1000:.3g} ms")
        pool = next((r for r in table if r["setting"] == "larger_pool"), None)
        if pool is not None and pool["effect"] == RAISES:
            text += (f"; more KV memory (the pool doubled, {pool['overrides']['num_gpu_blocks']} "
                     f"blocks: a smaller model or KV dtype, more memory) {pool['effect_text']}")
        recommendation = {"setting": best["setting"], "overrides": best["overrides"],
                          "text": text, "trusted": fits}
    else:
        recommendation = {"setting": None, "overrides": {}, "trusted": fits,
                          "text": f"no setting tried meets the limits at {at}"}
    if not fits:
        recommendation["text"] = "UNTRUSTED (twin does not fit): " + recommendation["text"]
    return {"focus_concurrency": focus if twin.key == "concurrency" else None,
            "focus": {twin.key: focus, "name": at, "rule": focus_rule},
            "no_ops_left_out": no_ops, "noise": noise.to_dict(),
            "lengths_source": work.lengths_source, "redraws": len(redraws),
            "assumed_settings": sorted(assumed),
            "limits": dict(limits), "limits_rule": limits_rule,
            "trust": trust,
            "trusted": fits, "pool_holds_sequences": holds, "kit_remedies": kit.to_dict(),
            "candidates": table, "recommendation": recommendation}
