"""Cuts the folders AIPerf 0.13 and GuideLLM 0.8 wrote into small test fixtures, keeping each
file's shape: ``python cut_exports.py aiperf SRC DEST`` / ``python cut_exports.py guidellm SRC
DEST``. What is cut (see README.md):

* AIPerf: per level only the files the kit reads (the export JSON and CSV, the server-metrics
  JSON and JSONL, one Parquet); the server metrics keep vLLM's families the analysis reads, and
  the JSONL only the scrapes from one before the profiling phase to one after it.
* GuideLLM: each benchmark keeps one request of each status and drops the per-modality
  metric breakdowns (text, image, video, audio); the YAML is the cut JSON in GuideLLM's own
  layout (keys in order, ``benchmarks`` first)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

KEEP = ("vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
        "vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
        "vllm:cache_config_info")


def cut_aiperf(src: Path, dest: Path) -> None:
    for export in sorted(src.rglob("profile_export_aiperf.json")):
        level = export.parent
        if {"aggregate", "sweep_aggregate"} & set(level.relative_to(src).parts):
            continue
        out = dest / level.relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("profile_export_aiperf.json", "profile_export_aiperf.csv"):
            shutil.copy(level / name, out / name)
        summary = json.loads((level / "server_metrics_export.json").read_text())
        summary["metrics"] = {k: v for k, v in summary["metrics"].items() if k in KEEP}
        (out / "server_metrics_export.json").write_text(json.dumps(summary, indent=2) + "\n")
        span = summary["summary"]["phase_time_ranges"]["profiling"]
        lines = [json.loads(x) for x in (level / "server_metrics_export.jsonl").read_text()
                 .splitlines() if x.strip()]
        inside = [k for k, x in enumerate(lines)
                  if span["start_ns"] <= x["timestamp_ns"] <= span["end_ns"]]
        first, last = max(inside[0] - 1, 0), min(inside[-1] + 1, len(lines) - 1)
        with open(out / "server_metrics_export.jsonl", "w") as fh:
            for x in lines[first:last + 1]:
                x["metrics"] = {k: v for k, v in x["metrics"].items() if k in KEEP}
                fh.write(json.dumps(x, separators=(",", ":")) + "\n")


def cut_guidellm(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    report = json.loads((src / "benchmarks.json").read_text())
    for b in report["benchmarks"]:
        b["requests"] = {k: (v[:1] if isinstance(v, list) else v)
                         for k, v in b["requests"].items()}
        for modality in ("text", "image", "video", "audio"):
            b["metrics"].pop(modality, None)
    (dest / "benchmarks.json").write_text(json.dumps(report, indent=2) + "\n")
    ordered = {"benchmarks": report["benchmarks"],
               **{k: v for k, v in report.items() if k != "benchmarks"}}
    (dest / "benchmarks.yaml").write_text(yaml.safe_dump(ordered, sort_keys=True))
    shutil.copy(src / "benchmarks.csv", dest / "benchmarks.csv")


if __name__ == "__main__":
    tool, src, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    {"aiperf": cut_aiperf, "guidellm": cut_guidellm}[tool](src, dest)
