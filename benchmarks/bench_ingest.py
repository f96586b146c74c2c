"""Ingestion speed and memory on one day of 1-second scrapes of a busy vLLM 0.33 server.

    python benchmarks/bench_ingest.py [--hours 24] [--keep]

Generates ``benchmarks/out/day.metrics.prom.jsonl`` (86,400 scrapes of vLLM 0.33.0's
exposition: the 72 ``# TYPE`` families of the reference run, histograms included, values
moving every second; seeded, so the same file every time), then measures in fresh
subprocesses, each reporting its wall time and peak RSS (``ru_maxrss``):

* ``json_lines``: reading the file and ``json.loads`` of every line (the floor for any reader);
* ``prometheus_client``: ``text_string_to_metric_families`` over every sample of a sample of
  scrapes, without building a table, extrapolated to the whole file;
* ``ingest_all``: ``ingest()`` keeping every family;
* ``ingest_core``: ``ingest(options=IngestOptions(metrics="core"))``, the families the analysis
  reads.

Results go to stdout and ``benchmarks/out/bench_ingest.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
TEMPLATE = ROOT / "tests" / "data" / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"
PROM_CLIENT_SAMPLE = 1500  # scrapes parsed by prometheus_client, then extrapolated


def _template() -> str:
    with gzip.open(TEMPLATE, "rt", encoding="utf-8") as fh:
        last = None
        for line in fh:
            last = line
    assert last is not None
    return json.loads(last)["text"]


def generate(path: Path, scrapes: int, seed: int = 0) -> dict[str, float]:
    """Write ``scrapes`` 1-second scrapes; counters and buckets grow, gauges wander."""
    text = _template()
    pieces: list[str] = []  # constant text between values
    kinds: list[str] = []  # per value: counter | gauge | bucket share
    shares: list[float] = []
    pending: list[str] = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            pending.append(line + "\n" if line else "")
            continue
        head = line.rpartition(" ")[0]
        pending.append(head + " ")
        pieces.append("".join(pending))
        pending = []
        name = head.split("{", 1)[0]
        if name.endswith("_created") or name == "vllm:cache_config_info":
            kinds.append("const")
            shares.append(float(line.rpartition(" ")[2]))
        elif name.endswith("_bucket"):
            le = head.split('le="', 1)[1].split('"', 1)[0]
            kinds.append("bucket")
            # cumulative share of observations below this bound (a log-normal-ish shape)
            shares.append(1.0 if le == "+Inf" else float(1 - np.exp(-float(le) / 2.0)))
        elif name.endswith(("_total", "_sum", "_count")) or "_total{" in line:
            kinds.append("counter")
            shares.append(1.0)
        else:
            kinds.append("gauge")
            shares.append(1.0)
    tail = "".join(pending)
    n = len(kinds)
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.5, 400.0, n)
    kind_arr = np.array(kinds)
    share_arr = np.array(shares)
    counter_mask = kind_arr == "counter"
    bucket_mask = kind_arr == "bucket"
    gauge_mask = kind_arr == "gauge"
    const_mask = kind_arr == "const"
    state = np.zeros(n)
    state[const_mask] = share_arr[const_mask]
    obs = 0.0
    t0 = 1_750_000_000.0
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(path, "w", encoding="utf-8") as fh:
        for k in range(scrapes):
            obs += float(rng.poisson(40))
            state[counter_mask] += rates[counter_mask] * rng.uniform(0.5, 1.5)
            state[bucket_mask] = np.floor(obs * share_arr[bucket_mask])
            state[gauge_mask] = np.round(
                20 + 10 * np.sin(k / 900.0) + rng.normal(0, 2, int(gauge_mask.sum())), 3
            )
            values = state.tolist()
            body = "".join([p + repr(v) + "\n" for p, v in zip(pieces, values, strict=True)])
            fh.write(json.dumps({"t": t0 + k, "text": body + tail}) + "\n")
    return {
        "generate_s": time.perf_counter() - start,
        "sample_lines_per_scrape": n,
        "bytes": path.stat().st_size,
    }


_CHILD = r"""
import json, resource, sys, time
mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
extra = {}
if mode == "json_lines":
    count = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            json.loads(line)
            count += 1
    extra["scrapes"] = count
elif mode == "prometheus_client":
    from prometheus_client.parser import text_string_to_metric_families
    samples = 0
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh):
            if k >= n:
                break
            for family in text_string_to_metric_families(json.loads(line)["text"]):
                samples += len(family.samples)
    extra["scrapes"] = n
    extra["samples"] = samples
else:
    from kvpressure.ingestion.api import ingest
    from kvpressure.ingestion.ingest_options import IngestOptions
    result = ingest([path], run="day",
                    options=IngestOptions(metrics=None if mode == "ingest_all" else "core"))
    extra["series_rows"] = len(result.series)
    extra["series_bytes"] = int(result.series.memory_usage(deep=False).sum())
    extra["runs_rows"] = len(result.runs)
    est = result.report.runs["day"].get("recompute_estimate", {})
    extra["preemptions"] = est.get("preemptions")
wall = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"mode": mode, "wall_s": wall, "peak_rss_mb": rss, **extra}))
"""


def measure(mode: str, path: Path, n: int = 0) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lib"))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path), str(n)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--keep", action="store_true", help="keep the generated file")
    args = parser.parse_args()
    scrapes = int(args.hours * 3600)
    path = OUT / "day.metrics.prom.jsonl"
    gen = generate(path, scrapes)
    print(json.dumps({"generated": str(path), "scrapes": scrapes, **gen}), flush=True)

    results: dict[str, dict[str, object]] = {}
    for mode in ("json_lines", "prometheus_client", "ingest_core", "ingest_all"):
        n = min(PROM_CLIENT_SAMPLE, scrapes) if mode == "prometheus_client" else 0
        results[mode] = measure(mode, path, n)
        print(json.dumps(results[mode]), flush=True)
    pc = results["prometheus_client"]
    per_scrape = float(pc["wall_s"]) / int(pc["scrapes"])
    pc["extrapolated_wall_s"] = per_scrape * scrapes
    base_json = float(results["json_lines"]["wall_s"])
    summary = {
        "scrapes": scrapes,
        "file_gb": gen["bytes"] / 1e9,
        "sample_lines_per_scrape": gen["sample_lines_per_scrape"],
        "results": results,
        "ratios": {
            f"{mode}_vs_json_lines": float(results[mode]["wall_s"]) / base_json
            for mode in ("ingest_core", "ingest_all")
        }
        | {
            f"prometheus_client_extrapolated_vs_{mode}": pc["extrapolated_wall_s"]
            / float(results[mode]["wall_s"])
            for mode in ("ingest_core", "ingest_all")
        },
    }
    (OUT / "bench_ingest.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["ratios"], indent=2))
    if not args.keep:
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
