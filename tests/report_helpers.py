"""Shared helpers of the report tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def empty_fields(node: Any, path: str = "") -> Iterator[str]:
    """Dotted paths of every empty value (None, "", [], {}) in a nested record."""
    if node is None or node == "" or node == [] or node == {}:
        yield path
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from empty_fields(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from empty_fields(v, f"{path}[{i}]")


SHA = "0" * 63 + "1"


def _dist(desc: str, mean: float) -> dict:
    return {"description": desc, "mean": mean, "p50": mean, "p95": mean * 1.5,
            "max": mean * 2, "source": "requests.csv"}


def valid_record() -> dict:
    """A complete record (a KV-bound simulation) as the YAML would hold it."""
    return {
        "scheduler": {
            "policy": "fcfs", "max_num_seqs": 256, "max_num_seqs_effective": 41.0,
            "gpu_memory_utilization": 0.9, "preemption_mode": "recompute",
            "num_gpu_blocks": 6000, "block_size": 16, "max_num_batched_tokens": 2048,
        },
        "counters": {
            "window": {"run": "baseline/c64", "concurrency": 64, "start_s": 10.0, "end_s": 90.0,
                       "gauges_start_s": 10.0, "gauges_end_s": 90.0},
            "num_requests_running": 38.5, "num_requests_waiting": 25.5,
            "waiting_capacity": 25.5, "waiting_deferred": 0.0,
            "kv_cache_usage_perc": 0.99, "num_preemptions_total": 912.0,
            "recomputed_tokens": 1.5e6, "recompute_ratio": 0.64,
            "recomputed_tokens_range": [1.5e6, 1.5e6], "recompute_ratio_range": [0.64, 0.64],
            "recompute_exact": True,
        },
        "workload": {
            "model_name": "llama-3.1-70b", "concurrency": 64,
            "concurrency_levels": [8, 16, 32, 64], "num_requests": 300,
            "input_len_distribution": _dist("uniform 1024-4096", 2560.0),
            "output_len_distribution": _dist("uniform 256-1024", 640.0),
        },
        "perf": {
            "variant": "baseline",
            "throughput_by_concurrency": [
                {"concurrency": c, "output_throughput": y, "itl_mean_s": 0.05,
                 "itl_p95_s": 0.09, "ttft_p95_s": 2.0, "preemptions": p,
                 "recompute_ratio": r}
                for c, y, p, r in ((8, 446.0, 0, 0.0), (16, 772.0, 0, 0.0),
                                   (32, 922.0, 365, 0.43), (64, 709.0, 912, 0.64))
            ],
            "knee": {"knee_x": 32.0, "peak_x": 32.0, "peak_y": 922.0, "plateau": False,
                     "sustained_to": 32.0, "declines": True, "decline_pct": 23.1},
            "itl_mean": 0.05, "itl_p95": 0.09, "ttft_p95": 2.0,
        },
        "status": "bound by KV blocks",
        "evidence": {
            "checks": [{"name": "vllm:kv_cache_usage_perc stays near 1", "holds": True,
                        "observed": "99% of the window at >= 0.95",
                        "metric": "vllm:kv_cache_usage_perc"}],
            "comparison": {"parameter": "max_num_seqs", "baseline": "baseline",
                           "variants": ["max_num_seqs=32"], "knee_shift": 1.0,
                           "sustained_shift": 32.0, "beyond_noise": True,
                           "noise": "bootstrap over the repeated measurements of each level",
                           "summary": "the knee moved right"},
            "interference": "no prefill interference",
            "reasons": ["2: KV usage near full"],
        },
        "remedies": [{"parameter": "max_num_seqs", "change": "256 -> 32",
                      "effect": "less preemption", "cost": "lower peak concurrency"}],
        "provenance": {
            "kit_version": "0.1.0", "vllm_behaviour_version": "0.33.0", "mode": "simulation",
            "inputs": [{"path": "data/experiments/seed_case.yaml", "sha256": SHA}], "seed": 7,
            "seeds": [7, 369571992, 1009178997],
        },
    }
