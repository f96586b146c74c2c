"""``prometheus-rules.yml`` beside ``record.yaml``: the investigation as rules a Prometheus (and
a Grafana on it) evaluates on the live server.

Recording rules for the recompute ratio's range, the same estimate ``record.yaml`` carries for
a measured window (docs/scheduler.md#rec-estimate): per preemption, between the partly filled
last block ((B - 1) / 2 tokens: everything else survives in the prefix cache) and a whole
average running context (usage * (N - 1) * B / running - B / 2: nothing survives), over the
tokens processed (prompt and generated tokens, plus the recompute). The pool's N blocks of B
tokens are this server's, from the record, written in as numbers; the context uses the gauges
at evaluation time, where the record uses the scrape before each preemption. The prompt
counter holds prefix-cached tokens too, so with prefix caching on the ratio reads low.

An alert for running past the knee: the clients in the server (running + waiting) at or past
the record's knee while it preempts, for five minutes.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvpressure.record.schema import Record

RULES_FILE = "prometheus-rules.yml"
WINDOW = "5m"


def _num(v: float) -> str:
    return f"{v:g}"


def rules(record: Record) -> dict[str, Any]:
    """The rule groups for ``record``'s server (``RULES_FILE``'s content)."""
    s, knee = record.scheduler, record.perf.knee
    w = WINDOW
    preempt = f"kvpressure:vllm_num_preemptions:rate{w}"
    processed = f"kvpressure:vllm_processed_tokens:rate{w}"
    out: list[dict[str, Any]] = [
        {"record": preempt, "expr": f"rate(vllm:num_preemptions_total[{w}])"},
        {"record": processed,
         "expr": f"rate(vllm:prompt_tokens_total[{w}]) + rate(vllm:generation_tokens_total[{w}])"},
    ]
    if s.block_size:
        b = int(s.block_size)
        tail = _num((b - 1) / 2)
        out.append({"record": f"kvpressure:recompute_ratio_low:{w}",
                    "expr": f"({preempt} * {tail}) / ({processed} + {preempt} * {tail})"})
        if s.num_gpu_blocks:
            ctx = "kvpressure:victim_context_tokens"
            out.append({"record": ctx, "expr": (
                f"clamp_min(vllm:kv_cache_usage_perc * {_num((int(s.num_gpu_blocks) - 1) * b)}"
                f" / clamp_min(vllm:num_requests_running, 1) - {_num(b / 2)}, {tail})")})
            out.append({"record": f"kvpressure:recompute_ratio_high:{w}",
                        "expr": f"({preempt} * {ctx}) / ({processed} + {preempt} * {ctx})"})
    at = None if knee is None or knee.knee_x is None else float(knee.knee_x)
    clients = "vllm:num_requests_running + vllm:num_requests_waiting"
    cond = (f"({clients}) >= {_num(at)} and {preempt} > 0" if at is not None
            else f"vllm:num_requests_waiting > 0 and {preempt} > 0")
    where = (f"at or past the knee ({_num(at)} clients, where throughput stopped growing in "
             "the investigation)" if at is not None else "queued (the investigation found no "
             "knee in its range)")
    out.append({
        "alert": "VLLMPastTheKnee", "expr": cond, "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "vLLM preempts with {{ $value }} clients " + where,
            "description": (f"Status of the investigation: {record.status}. Each preemption "
                            "recomputes its context: see kvpressure:recompute_ratio_low/high "
                            f"and the record ({record.workload.model_name})."),
        },
    })
    return {"groups": [{"name": "kvpressure", "rules": out}]}


def rules_text(record: Record) -> str:
    head = ("# Prometheus rules from this investigation (kvpressure): the recompute ratio's "
            "range and a past-the-knee alert.\n# Load with rule_files: [prometheus-rules.yml]; "
            "check with promtool check rules.\n")
    return head + yaml.safe_dump(rules(record), sort_keys=False, width=100)
