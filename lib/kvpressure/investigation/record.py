"""Build the record from the stages' results (:class:`kvpressure.stages.results.RunStages`;
the caller reads them, ``kvpressure.stages.files.read_stages``)."""

from __future__ import annotations

from typing import Any

from kvpressure import VLLM_BEHAVIOUR_VERSION, __version__
from kvpressure.errors import InputError
from kvpressure.record.io import validate_record
from kvpressure.record.schema import Record, check_path, null_fields
from kvpressure.stages.results import (
    CollectInfo,
    KneeResult,
    LengthStats,
    RunStages,
    Symptoms,
)


def _length(d: LengthStats, what: str) -> dict[str, Any]:
    if not d.description:
        raise InputError(f"record: workload.{what}: no description of where it comes from")
    return d.model_dump()


# The metric behind each counter of the record, for a reason when it is missing.
_COUNTER_METRICS = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "waiting_capacity": 'vllm:num_requests_waiting_by_reason{reason="capacity"}',
    "waiting_deferred": 'vllm:num_requests_waiting_by_reason{reason="deferred"}',
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "num_preemptions_total": "vllm:num_preemptions_total",
}
_ENGINE_ARGS = ("policy", "max_num_seqs", "max_num_batched_tokens")
_CACHE_CONFIG = ("num_gpu_blocks", "block_size", "gpu_memory_utilization")
NO_DATA = "no data"  # the symptom checklist's verdict for a symptom it could not judge
_NO_ENGINE_METRICS = ("no engine metrics: only vllm bench results were given (no Prometheus "
                      "scrapes of the server's /metrics)")


def _why_missing(path: str, collect: CollectInfo, knee: KneeResult) -> str:
    """Why the data could not give the field at ``path`` (a dotted path of the record)."""
    field = path.rsplit(".", 1)[-1]
    no_engine = not collect.engine_metrics
    engine_fields = path.startswith("counters.") or path in (
        "scheduler.max_num_seqs_effective", *(f"scheduler.{f}" for f in _CACHE_CONFIG),
        "perf.throughput_by_concurrency[*].preemptions",
        "perf.throughput_by_concurrency[*].recompute_ratio",
        "perf.throughput_by_request_rate[*].preemptions",
        "perf.throughput_by_request_rate[*].recompute_ratio")
    unknown_c = ("the load's concurrency is not known: the metrics do not carry it (give "
                 "--param focus_concurrency=C)")
    if path in ("counters.window.concurrency", "workload.concurrency",
                "workload.concurrency_levels", "perf.throughput_by_concurrency"):
        return unknown_c
    if no_engine and engine_fields:
        return _NO_ENGINE_METRICS
    if path == "perf.knee":
        return knee.why_not or f"too few {'levels' if knee.x == 'request_rate' else 'concurrency levels'} for a knee"
    if path.startswith("scheduler.") and field in ("policy", "max_num_seqs",
                                                   "max_num_batched_tokens"):
        arg = "scheduling_policy" if field == "policy" else field
        return (f"an engine argument the metrics do not carry: give it with --param "
                f"'engine_args={{{arg}: ...}}'")
    if path.startswith("scheduler.") and field in _CACHE_CONFIG:
        return (f"vllm:cache_config_info (which carries {field}) is not in the scrapes: give it "
                f"with --param 'engine_args={{{field}: ...}}'")
    if path == "scheduler.max_num_seqs_effective":
        return "vllm:num_requests_running is not in the scrapes"
    if path.startswith("workload.") and "_len_distribution" in path:
        dist: LengthStats = getattr(collect, path.split(".")[1])
        return f"{dist.description} ({dist.source})"
    if path == "workload.num_requests":
        return "neither a bench result nor vllm:request_success_total gives the request count"
    if field in _COUNTER_METRICS:
        return f"{_COUNTER_METRICS[field]} is not in the scrapes"
    if path.startswith("counters."):
        return ("vllm:num_preemptions_total or the token counters to size the recompute are not "
                "in the scrapes")
    if path == "perf.itl_p95" and knee.itl_p99_s is not None:
        return (f"not measured: the runs have ITL p99 only ({1000 * knee.itl_p99_s:.1f} ms at "
                "the focus level; vllm bench serve writes p99 unless given --metric-percentiles "
                "95,99)")
    if "itl" in field or "ttft" in field:
        return ("neither the bench result nor the scrapes give it (vllm bench serve "
                "--percentile-metrics ttft,tpot,itl --metric-percentiles 95,99, or the "
                "vllm:inter_token_latency_seconds / vllm:time_to_first_token_seconds histograms)")
    return "not measured by the given data"


def _checks(symptoms: Symptoms, axis: str = "concurrency") -> list[dict[str, Any]]:
    out = []
    for s in symptoms.symptoms:
        ev = s.evidence
        shown = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in ev.items() if not isinstance(v, dict | list) and k != "source"
        )
        metric = {
            "curve_falls": f"output_throughput by {axis}",
            "waiting_persists": "vllm:num_requests_waiting",
            "running_below_max_num_seqs": "vllm:num_requests_running",
            "kv_usage_near_full": "vllm:kv_cache_usage_perc",
            "preemption_recompute": "vllm:num_preemptions_total",
            "itl_jitter": "vllm:inter_token_latency_seconds",
        }.get(s.id, s.id)
        # "no data" is neither present nor absent: null, explained under 'missing'.
        holds = None if s.verdict == NO_DATA else s.verdict == "present"
        out.append({"name": s.name, "holds": holds,
                    "observed": f"{s.verdict}: {shown}" if shown else s.verdict,
                    "metric": metric})
    return out


def _checks_missing(symptoms: Symptoms, collect: CollectInfo) -> dict[str, str]:
    """Why each check without data could not be judged: the symptom's own stated reason."""
    no_engine = not collect.engine_metrics
    out = {}
    for i, s in enumerate(symptoms.symptoms):
        if s.verdict != NO_DATA:
            continue
        needs = s.evidence.get("missing")
        why = f"{s.name}: no data (needs {needs})" if needs else f"{s.name}: no data"
        out[check_path(i)] = f"{why}; {_NO_ENGINE_METRICS}" if no_engine else why
    return out


def _level(value: float | int | None, rates: bool) -> float | int | None:
    """A curve level as the record holds it: a request rate a float, a concurrency an int."""
    if value is None:
        return None
    return float(value) if rates else int(value)


def _range(low: Any, high: Any) -> list[Any] | None:
    return None if low is None or high is None else [low, high]


def build_record(stages: RunStages, where: str = "record.yaml") -> Record:
    """The record of one investigation from its stages' results (validated; InputError naming
    ``where`` and the field)."""
    collect, rec, knee = stages.collect, stages.recompute, stages.knee
    compare, verdict = stages.compare, stages.verdict
    s = collect.settings
    focus = collect.focus
    k = knee.knee
    comparison = None
    if compare.available:
        shifts = compare.shifts
        comparison = {
            "parameter": compare.parameter, "baseline": compare.baseline,
            "variants": compare.variant_names,
            "knee_shift": max((x.shift for x in shifts), default=0.0),
            "sustained_shift": max((x.sustained_shift for x in shifts), default=0.0),
            "beyond_noise": bool(compare.moved_right_beyond_noise),
            "noise": compare.noise_method,
            "summary": compare.summary,
        }
    status = verdict.status
    reasons = [status.rule, *status.findings]
    gauge_t0, gauge_t1 = focus.gauge_window
    rates = collect.level_axis == "request_rate"
    x = collect.level_axis
    curve = [
        {x: _level(p.level(x), rates), "output_throughput": p.output_throughput,
         "itl_mean_s": p.itl_mean_s, "itl_p95_s": p.itl_p95_s, "ttft_p95_s": p.ttft_p95_s,
         "preemptions": p.preemptions, "recompute_ratio": p.recompute_ratio}
        for p in knee.curve
    ] or None
    data = {
        "scheduler": {
            "policy": s.get("scheduling_policy") or s.get("policy"),
            "max_num_seqs": s.get("max_num_seqs"),
            "max_num_seqs_effective": rec.running_max,
            "gpu_memory_utilization": s.get("gpu_memory_utilization"),
            "preemption_mode": "recompute",
            "num_gpu_blocks": s.get("num_gpu_blocks"),
            "block_size": s.get("block_size"),
            "max_num_batched_tokens": s.get("max_num_batched_tokens"),
            "async_scheduling": s.get("async_scheduling"),
        },
        "counters": {
            "window": {"run": focus.run, "concurrency": focus.concurrency,
                       "request_rate": focus.request_rate, "start_s": focus.t0, "end_s": focus.t1,
                       "gauges_start_s": gauge_t0, "gauges_end_s": gauge_t1,
                       "snapshot": collect.load.snapshot},
            "num_requests_running": rec.running_mean,
            "num_requests_waiting": rec.waiting_mean,
            "waiting_capacity": rec.waiting_capacity_mean,
            "waiting_deferred": rec.waiting_deferred_mean,
            "kv_cache_usage_perc": rec.kv_usage_mean,
            "num_preemptions_total": rec.preemptions,
            "recomputed_tokens": rec.recomputed_tokens,
            "recompute_ratio": rec.recompute_ratio,
            "recomputed_tokens_range": _range(rec.recomputed_tokens_low,
                                              rec.recomputed_tokens_high),
            "recompute_ratio_range": _range(rec.recompute_ratio_low, rec.recompute_ratio_high),
            "recompute_exact": rec.exact,
        },
        "workload": {
            "model_name": collect.model_name,
            "concurrency": focus.concurrency,
            "concurrency_levels": collect.concurrency_levels or None,
            "num_requests": collect.num_requests,
            "input_len_distribution": _length(collect.input_len_distribution,
                                              "input_len_distribution"),
            "output_len_distribution": _length(collect.output_len_distribution,
                                               "output_len_distribution"),
            "level_axis": collect.level_axis,
            "request_rate": focus.request_rate,
            "request_rates": [float(r) for r in collect.request_rates] or None,
            "max_concurrency": collect.max_concurrency if rates else None,
        },
        "perf": {
            "variant": knee.variant,
            "throughput_by_concurrency": None if rates else curve,
            "throughput_by_request_rate": curve if rates else None,
            "knee": None if k is None else {
                "knee_x": k.knee_x, "peak_x": k.peak_x, "peak_y": k.peak_y,
                "declines": k.declines, "decline_pct": k.decline_pct,
                "same_schedule_from": k.same_schedule_from,
                "plateau": k.plateau[1] > k.plateau[0], "sustained_to": k.sustained_end},
            "itl_mean": knee.itl_mean_s,
            "itl_p95": knee.itl_p95_s,
            "ttft_p95": knee.ttft_p95_s,
            "latency_fidelity": (None if collect.latency_fidelity is None
                                 else collect.latency_fidelity.model_dump()),
        },
        "status": status.status,
        "evidence": {
            "checks": _checks(verdict.symptoms, collect.level_axis.replace("_", " ")),
            "comparison": comparison,
            "interference": stages.interference.summary,
            "reasons": reasons,
        },
        "remedies": [r.model_dump(include={"parameter", "change", "effect", "cost"})
                     for r in verdict.remedies.rows],
        "provenance": {
            "kit_version": __version__,
            "vllm_behaviour_version": VLLM_BEHAVIOUR_VERSION,
            "mode": collect.mode,
            "inputs": [i.model_dump() for i in collect.inputs],
            "seed": collect.seed,
            "seeds": collect.seeds,
            "vllm_version_served": collect.server_version,
            "platform": collect.server_platform,
            "load_tool": collect.load_tool,
            "engine_args_from": dict(sorted(collect.settings_from.items())),
        },
    }
    checks = _checks_missing(verdict.symptoms, collect)
    data["missing"] = {path: checks.get(path) or _why_missing(path, collect, knee)
                       for path in sorted(null_fields(data))}
    return validate_record(data, where=where)
