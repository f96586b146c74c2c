"""Writes this folder: one sweep in each tool's format, laid out as the tools' own writers lay
it out (vLLM 0.33.0 `vllm bench sweep serve`, GuideLLM's report and CSV writer, AIPerf's JSON
and CSV exporters). Hand-worked values: see tests/test_ingest_bench_tables.py."""

import csv
import io
import json
from pathlib import Path

import pandas as pd
import yaml

OUT = Path(__file__).parent
LEVELS = [1, 4, 8, 16, 32, 64]
TPUT = {1: 60.0, 4: 240.0, 8: 480.0, 16: 960.0, 32: 950.0, 64: 900.0}  # tok/s
TTFT_MS = {1: 20.0, 4: 22.0, 8: 25.0, 16: 40.0, 32: 180.0, 64: 650.0}
ITL_MS = {1: 10.0, 4: 10.5, 8: 11.0, 16: 13.0, 32: 26.0, 64: 55.0}
OUT_LEN = 200  # output tokens per request


def req_s(c):
    return TPUT[c] / OUT_LEN


DURATION = 100.0


# ---------------------------------------------------------------- vllm bench sweep serve
def vllm_result(c, run_number):
    r = {
        "date": f"20260301-{10 + c // 60:02d}{c % 60:02d}00",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "Qwen/Qwen3-0.6B",
        "tokenizer_id": "Qwen/Qwen3-0.6B",
        "num_prompts": 200,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": c,
        "duration": DURATION,
        "completed": int(req_s(c) * DURATION),
        "failed": 0,
        "total_input_tokens": int(req_s(c) * DURATION) * 512,
        "total_output_tokens": int(TPUT[c] * DURATION),
        "request_throughput": req_s(c),
        "request_goodput": None,
        "output_throughput": TPUT[c],
        "total_token_throughput": TPUT[c] + req_s(c) * 512,
        "max_output_tokens_per_s": TPUT[c] * 1.1,
        "max_concurrent_requests": c,
        "rtfx": 0.0,
    }
    for m, v in (
        ("ttft", TTFT_MS[c]),
        ("tpot", ITL_MS[c]),
        ("itl", ITL_MS[c]),
        ("e2el", TTFT_MS[c] + ITL_MS[c] * (OUT_LEN - 1)),
    ):
        r[f"mean_{m}_ms"] = v
        r[f"median_{m}_ms"] = v * 0.98
        r[f"std_{m}_ms"] = v * 0.1
        r[f"p99_{m}_ms"] = v * 1.5
    r["run_number"] = run_number
    r["max_concurrency"] = c  # the bench override, as _update_run_data writes it
    return r


sweep = OUT / "vllm_sweep"
all_data = []
for c in LEVELS:
    comb = sweep / f"BENCH-max_concurrency={c}"
    comb.mkdir(parents=True, exist_ok=True)
    data = [vllm_result(c, 0)]
    (comb / "run=0.json").write_text(json.dumps(data[0], indent=4))
    (comb / "summary.json").write_text(json.dumps(data, indent=4))
    all_data.extend(data)
pd.DataFrame.from_records(all_data).to_csv(sweep / "summary.csv")


# ---------------------------------------------------------------- GuideLLM
def dist(mean, p95=None, p99=None, count=100):
    p95 = mean * 1.4 if p95 is None else p95
    p99 = mean * 1.8 if p99 is None else p99
    return {
        "mean": mean,
        "median": mean,
        "mode": mean,
        "variance": (0.1 * mean) ** 2,
        "std_dev": 0.1 * mean,
        "min": 0.5 * mean,
        "max": 2 * mean,
        "count": count,
        "total_sum": mean * count,
        "percentiles": {
            "p001": 0.5 * mean,
            "p01": 0.6 * mean,
            "p05": 0.7 * mean,
            "p10": 0.8 * mean,
            "p25": 0.9 * mean,
            "p50": mean,
            "p75": 1.1 * mean,
            "p90": 1.3 * mean,
            "p95": p95,
            "p99": p99,
            "p999": 1.9 * mean,
        },
        "pdf": None,
    }


def empty():
    return {
        "mean": 0.0,
        "median": 0.0,
        "mode": 0.0,
        "variance": 0.0,
        "std_dev": 0.0,
        "min": 0.0,
        "max": 0.0,
        "count": 0,
        "total_sum": 0.0,
        "percentiles": {
            k: 0.0
            for k in ("p001", "p01", "p05", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p999")
        },
        "pdf": None,
    }


def sds(mean, **kw):
    d = dist(mean, **kw)
    return {"successful": d, "incomplete": empty(), "errored": empty(), "total": d}


PROFILE = {
    "str": "ConcurrentProfile",
    "type": "ConcurrentProfile",
    "class": "ConcurrentProfile",
    "module": "guidellm.benchmark.profiles.concurrent",
    "attributes": {
        "kind": "concurrent",
        "args": {"kind": "concurrent", "streams": LEVELS, "rampup_duration": 0.0},
        "completed_strategies": [],
    },
}


def guidellm_benchmark(k, c):
    t0 = 1772359200.0 + k * 130.0
    n = int(req_s(c) * DURATION)
    return {
        "type_": "generative_benchmark",
        "config": {
            "id_": f"bench-{k}",
            "run_id": "run-1",
            "run_index": k,
            "strategy": {
                "type_": "concurrent",
                "worker_count": None,
                "max_concurrency": None,
                "streams": c,
                "rampup_duration": 0.0,
            },
            "constraints": {"max_seconds": {"max_duration": DURATION}},
            "sample_size": None,
            "warmup": {"percent": None, "value": None, "mode": "prefer_duration"},
            "cooldown": {"percent": None, "value": None, "mode": "prefer_duration"},
            "prefer_response_metrics": True,
            "profile": PROFILE,
            "requests": {"data": ["prompt_tokens=512,output_tokens=200"]},
            "backend": {
                "type_": "openai_http",
                "target": "http://localhost:8000",
                "model": "Qwen/Qwen3-0.6B",
            },
            "environment": {"type_": "non_distributed"},
        },
        "scheduler_state": {
            "node_id": 0,
            "num_processes": 1,
            "start_time": t0,
            "end_time": t0 + DURATION,
            "created_requests": n,
            "processed_requests": n,
            "successful_requests": n,
            "errored_requests": 0,
            "cancelled_requests": 0,
        },
        "scheduler_metrics": {
            "start_time": t0,
            "request_start_time": t0,
            "measure_start_time": t0,
            "measure_end_time": t0 + DURATION,
            "request_end_time": t0 + DURATION,
            "end_time": t0 + DURATION,
            "requests_made": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
        },
        "metrics": {
            "request_totals": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
            "requests_per_second": sds(req_s(c)),
            "request_concurrency": sds(float(c)),
            "request_latency": sds((TTFT_MS[c] + ITL_MS[c] * (OUT_LEN - 1)) / 1000.0),
            "request_streaming_iterations_count": sds(float(OUT_LEN)),
            "prompt_token_count": sds(512.0),
            "output_token_count": sds(float(OUT_LEN)),
            "total_token_count": sds(712.0),
            "time_to_first_token_ms": sds(TTFT_MS[c], p95=TTFT_MS[c] * 1.25, p99=TTFT_MS[c] * 1.5),
            "time_to_first_output_token_ms": sds(TTFT_MS[c]),
            "time_per_output_token_ms": sds(ITL_MS[c]),
            "inter_token_latency_ms": sds(ITL_MS[c], p95=ITL_MS[c] * 1.2, p99=ITL_MS[c] * 1.6),
            "prompt_tokens_per_second": sds(req_s(c) * 512),
            "output_tokens_per_second": sds(TPUT[c]),
            "tokens_per_second": sds(TPUT[c] + req_s(c) * 512),
            "output_tokens_per_iteration": sds(1.0),
            "iter_tokens_per_iteration": sds(1.0),
        },
        "requests": {"successful": [], "incomplete": [], "errored": [], "total": None},
        "start_time": t0,
        "end_time": t0 + DURATION,
        "duration": DURATION,
        "warmup_duration": 0.0,
        "cooldown_duration": 0.0,
    }


report = {
    "metadata": {
        "version": 2,
        "guidellm_version": "0.5.0",
        "python_version": "3.12.3",
        "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
    },
    "config": {
        "target": "http://localhost:8000",
        "profile": "concurrent",
        "rate": LEVELS,
        "data": ["prompt_tokens=512,output_tokens=200"],
    },
    "benchmarks": [guidellm_benchmark(k, c) for k, c in enumerate(LEVELS)],
}
g = OUT / "guidellm"
g.mkdir(exist_ok=True)
(g / "benchmarks.json").write_text(json.dumps(report))
(g / "benchmarks.yaml").write_text(yaml.dump(report))


# CSV, as GuideLLM's CSV writer lays it out (three header rows)
def stats_fields(group, units, d):
    out = []
    for status in ("successful", "incomplete", "errored"):
        dd = d[status]
        if dd["total_sum"] == 0.0:
            continue
        pre = f"{status.capitalize()} "
        pc = dd["percentiles"]
        out += [
            ([group, pre + units, "Mean"], dd["mean"]),
            ([group, pre + units, "Median"], dd["median"]),
            ([group, pre + units, "Std Dev"], dd["std_dev"]),
            (
                [group, pre + units, "Percentiles"],
                f"[{dd['min']}, {pc['p001']}, {pc['p01']}, {pc['p05']}, {pc['p10']}, {pc['p25']}, "
                f"{pc['p75']}, {pc['p90']}, {pc['p95']}, {pc['p99']}, {dd['max']}]",
            ),
        ]
    return out


headers_all, values_all = [], []
for b in report["benchmarks"]:
    f = []
    cfg, m, sm = b["config"], b["metrics"], b["scheduler_metrics"]
    f += [
        (["Run Info", "Run ID", ""], cfg["run_id"]),
        (["Run Info", "Run Index", ""], cfg["run_index"]),
        (["Run Info", "Profile", ""], json.dumps(cfg["profile"])),
        (["Run Info", "Requests", ""], json.dumps(cfg["requests"])),
        (["Run Info", "Backend", ""], json.dumps(cfg["backend"])),
        (["Run Info", "Environment", ""], json.dumps(cfg["environment"])),
    ]
    f += [
        (["Benchmark", "Type", ""], b["type_"]),
        (["Benchmark", "ID", ""], cfg["id_"]),
        (["Benchmark", "Strategy", ""], cfg["strategy"]["type_"]),
        (["Benchmark", "Constraints", ""], json.dumps(cfg["constraints"])),
    ]
    for name, _key in (
        ("Start Time", "start_time"),
        ("Request Start Time", "request_start_time"),
        ("Measure Start Time", "measure_start_time"),
        ("Measure End Time", "measure_end_time"),
        ("Request End Time", "request_end_time"),
        ("End Time", "end_time"),
    ):
        f.append((["Timings", name, ""], "2026-03-01 10:00:00"))
    f += [
        (["Timings", "Duration", "Sec"], b["duration"]),
        (["Timings", "Warmup", "Sec"], 0.0),
        (["Timings", "Cooldown", "Sec"], 0.0),
    ]
    for st in ("successful", "incomplete", "errored", "total"):
        f.append((["Request Counts", st.capitalize(), ""], m["request_totals"][st]))
    f += stats_fields("Request Latency", "Sec", m["request_latency"])
    f += stats_fields("Streaming Iterations", "Count", m["request_streaming_iterations_count"])
    f += stats_fields("Time to First Token", "ms", m["time_to_first_token_ms"])
    f += stats_fields("Time to First Output Token", "ms", m["time_to_first_output_token_ms"])
    f += stats_fields("Time per Output Token", "ms", m["time_per_output_token_ms"])
    f += stats_fields("Inter Token Latency", "ms", m["inter_token_latency_ms"])
    f += stats_fields("Server Throughput", "Requests/Sec", m["requests_per_second"])
    f += stats_fields("Server Throughput", "Concurrency", m["request_concurrency"])
    f += stats_fields("Token Metrics", "Input Tokens", m["prompt_token_count"])
    f += stats_fields("Token Metrics", "Output Tokens", m["output_token_count"])
    f += stats_fields("Token Metrics", "Total Tokens", m["total_token_count"])
    f += stats_fields("Token Throughput", "Input Tokens/Sec", m["prompt_tokens_per_second"])
    f += stats_fields("Token Throughput", "Output Tokens/Sec", m["output_tokens_per_second"])
    f += stats_fields("Token Throughput", "Total Tokens/Sec", m["tokens_per_second"])
    headers_all.append([h for h, _ in f])
    values_all.append([v for _, v in f])
order = {}
maps = []
for hs, vs in zip(headers_all, values_all, strict=True):
    rm = {}
    for h, v in zip(hs, vs, strict=True):
        order.setdefault(tuple(h), None)
        rm[tuple(h)] = v
    maps.append(rm)
keys = list(order)
with open(g / "benchmarks.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    for i in range(3):
        w.writerow([k[i] for k in keys])
    for rm in maps:
        w.writerow([rm.get(k, "") for k in keys])

# ---------------------------------------------------------------- AIPerf
a = OUT / "aiperf"


def metric(unit, avg, p95=None, p99=None, full=True):
    d = {"unit": unit, "avg": avg}
    if full:
        d.update(
            {
                "p1": avg * 0.6,
                "p5": avg * 0.7,
                "p10": avg * 0.8,
                "p25": avg * 0.9,
                "p50": avg,
                "p75": avg * 1.1,
                "p90": avg * 1.15,
                "p95": p95,
                "p99": p99,
                "min": avg * 0.5,
                "max": avg * 2,
                "std": avg * 0.1,
            }
        )
    return d


for c in LEVELS:
    d = a / f"Qwen_Qwen3-0.6B-openai-chat-concurrency{c}"
    d.mkdir(parents=True, exist_ok=True)
    n = int(req_s(c) * DURATION)
    e2e = TTFT_MS[c] + ITL_MS[c] * (OUT_LEN - 1)
    exp = {
        "request_throughput": metric("requests/sec", req_s(c), full=False),
        "request_latency": metric("ms", e2e, e2e * 1.2, e2e * 1.4),
        "request_count": metric("requests", n, full=False),
        "time_to_first_token": metric("ms", TTFT_MS[c], TTFT_MS[c] * 1.25, TTFT_MS[c] * 1.5),
        "inter_token_latency": metric("ms", ITL_MS[c], ITL_MS[c] * 1.2, ITL_MS[c] * 1.6),
        "output_token_throughput": metric("tokens/sec", TPUT[c], full=False),
        "output_token_throughput_per_user": metric(
            "tokens/sec/user",
            1000.0 / ITL_MS[c],
            1000.0 / ITL_MS[c] * 1.1,
            1000.0 / ITL_MS[c] * 1.2,
        ),
        "output_sequence_length": metric("tokens", 200.0, 200.0, 200.0),
        "input_sequence_length": metric("tokens", 512.0, 512.0, 512.0),
        "benchmark_duration": metric("sec", DURATION, full=False),
        "total_output_tokens": metric("tokens", TPUT[c] * DURATION, full=False),
        "input_config": {
            "endpoint": {
                "model_names": ["Qwen/Qwen3-0.6B"],
                "type": "chat",
                "streaming": True,
                "url": "localhost:8000",
            },
            "loadgen": {"concurrency": c, "request_count": n},
            "cli_command": f"aiperf profile --model Qwen/Qwen3-0.6B --concurrency {c}",
        },
        "was_cancelled": False,
        "error_summary": [],
        "start_time": "2026-03-01T10:00:00.000000",
        "end_time": "2026-03-01T10:01:40.000000",
    }
    for key in (
        "request_throughput",
        "request_count",
        "output_token_throughput",
        "benchmark_duration",
        "total_output_tokens",
    ):
        for s in ("p95", "p99"):
            exp[key].pop(s, None)
    (d / "profile_export_aiperf.json").write_text(json.dumps(exp, indent=2))
# One CSV export (its folder name carries the level, as AIPerf names artifact folders)
c = 16
e2e = TTFT_MS[c] + ITL_MS[c] * (OUT_LEN - 1)
STAT_KEYS = [
    "avg",
    "min",
    "max",
    "p1",
    "p5",
    "p10",
    "p25",
    "p50",
    "p75",
    "p90",
    "p95",
    "p99",
    "std",
]


def fmt(v):
    return "" if v is None else (f"{int(v)}" if isinstance(v, int) else f"{float(v):.2f}")


buf = io.StringIO()
w = csv.writer(buf)
w.writerow(["Metric"] + STAT_KEYS)
for name, unit, avg, p95, p99 in (
    ("Inter Token Latency", "ms", ITL_MS[c], ITL_MS[c] * 1.2, ITL_MS[c] * 1.6),
    ("Input Sequence Length", "tokens", 512.0, 512.0, 512.0),
    ("Output Sequence Length", "tokens", 200.0, 200.0, 200.0),
    ("Output Token Throughput Per User", "tokens/sec/user", 1000.0 / ITL_MS[c], 84.6, 92.3),
    ("Request Latency", "ms", e2e, e2e * 1.2, e2e * 1.4),
    ("Time to First Token", "ms", TTFT_MS[c], TTFT_MS[c] * 1.25, TTFT_MS[c] * 1.5),
):
    m = metric(unit, avg, p95, p99)
    w.writerow([f"{name} ({unit})"] + [fmt(m.get(k)) for k in STAT_KEYS])
w.writerow([])
w.writerow(["Metric", "Value"])
for name, unit, v in (
    ("Benchmark Duration", "sec", DURATION),
    ("Output Token Throughput", "tokens/sec", TPUT[c]),
    ("Request Count", "requests", int(req_s(c) * DURATION)),
    ("Request Throughput", "requests/sec", req_s(c)),
    ("Total Output Tokens", "tokens", int(TPUT[c] * DURATION)),
):
    label = name if unit in ("count", "requests") else f"{name} ({unit})"
    w.writerow([label, fmt(v)])
csvdir = OUT / "aiperf_csv" / "Qwen_Qwen3-0.6B-openai-chat-concurrency16"
csvdir.mkdir(parents=True, exist_ok=True)
(csvdir / "profile_export_aiperf.csv").write_text(buf.getvalue())

# ---------------------------------------------------------------- a spreadsheet of runs
rows = [
    {
        "conc": c,
        "tok_s": TPUT[c],
        "req_per_s": req_s(c),
        "ttft_p95_ms": TTFT_MS[c] * 1.25,
        "itl_avg_ms": ITL_MS[c],
        "note": "",
    }
    for c in LEVELS
]
rows.append(
    {
        "conc": "off",
        "tok_s": 30.0,
        "req_per_s": 0.15,
        "ttft_p95_ms": 15.0,
        "itl_avg_ms": 9.0,
        "note": "warm-up, no limit",
    }
)
rows.append(
    {
        "conc": 128,
        "tok_s": "",
        "req_per_s": "",
        "ttft_p95_ms": "",
        "itl_avg_ms": "",
        "note": "client crashed",
    }
)
pd.DataFrame(rows).to_csv(OUT / "spreadsheet.csv", index=False)
