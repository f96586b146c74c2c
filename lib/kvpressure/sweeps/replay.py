"""A simulated sweep laid out the way a real load test leaves it behind.

A real load test runs ``vllm bench serve --max-concurrency C --save-result`` at one level after
another against one server, while ``kvpressure scrape`` (or Prometheus) polls ``/metrics`` the
whole time. :func:`replay_sweep` turns the point folders of a simulated sweep
(``points/<variant>/c<C>/``) into exactly that:

* one continuous scrape log (``{"t": unix seconds, "text": ...}`` per line) on a fixed scrape
  grid from ``epoch``: the server's counters keep counting from level to level (each level's
  counters are added to what the earlier levels left), gauges are the level's own, and between
  levels the idle server is scraped too (nothing running, waiting or held in the KV cache);
* one bench result per level, with vLLM's field names and units (latencies in ms), its ``date``
  the local time (in ``bench_timezone``) at which the level ended, truncated to the second as
  vLLM writes it, and the per-request ``input_lens``/``output_lens`` of ``--save-detailed``.

Each level starts on a scrape of the idle server and its last counts are in the first scrape
after it ends, so each level's counters over its bench window are the simulation's exactly:
an investigation of the replay can be checked against the simulation's known answers.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.ingestion.api import bench_tzinfo

_LEVEL = re.compile(r"^c(\d+)$")
_SAMPLE = re.compile(r"^([^\s{]+)(\{.*\})?\s+(\S+)$")
# Gauges of the engine's state: zero while the server idles between levels.
_STATE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc")
# vLLM's bench result file name: backend, rate, concurrency, model, date.
_NAME = "openai-infqps-concurrency{c}-{model}-{date}.json"


@dataclass
class Replay:
    """What :func:`replay_sweep` wrote, and each level's true span on the wall clock."""

    log: Path
    bench: list[Path]
    levels: list[int]
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)


def _points(points_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for p in sorted(points_dir.iterdir()) if points_dir.is_dir() else []:
        m = _LEVEL.match(p.name)
        if m and (p / "metrics.prom.jsonl").is_file() and (p / "summary.json").is_file():
            found.append((int(m.group(1)), p))
    if not found:
        raise InputError(f"{points_dir}: no c<concurrency>/ folders with metrics.prom.jsonl "
                         "and summary.json (a sweep's points/<variant>/ folder)")
    return sorted(found)


def _families(text: str) -> dict[str, str]:
    """Metric family -> type, from the ``# TYPE`` lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            out[name] = kind.strip()
    return out


def _kind(sample: str, families: dict[str, str]) -> str:
    """``counter`` (accumulates over the server's life), ``created`` or ``gauge``."""
    if sample.endswith("_created"):
        return "created"
    if families.get(sample) == "counter" or (
            sample.endswith("_total") and families.get(sample[:-6]) == "counter"):
        return "counter"
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and families.get(sample[: -len(suffix)]) == "histogram":
            return "counter"
    return "gauge"


def _rewrite(text: str, families: dict[str, str], offsets: dict[str, float], created: float,
             idle: bool = False, zero_counters: bool = False) -> tuple[str, dict[str, float]]:
    """The scrape with the earlier levels' counts added; returns it and its counter values."""
    lines, counters = [], {}
    for line in text.splitlines():
        m = None if line.startswith("#") else _SAMPLE.match(line)
        if m is None:
            lines.append(line)
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        key = name + labels
        kind = _kind(name, families)
        value = float(raw)
        if kind == "counter":
            value = offsets.get(key, 0.0) + (0.0 if zero_counters else value)
            counters[key] = value
        elif kind == "created":
            value = created
        elif idle and name in _STATE_GAUGES:
            value = 0.0
        else:
            lines.append(line)
            continue
        lines.append(f"{name}{labels} {value!r}")
    return "\n".join(lines) + "\n", counters


def _bench_result(concurrency: int, point: Path, end: float, tz: _dt.tzinfo | None,
                  model_id: str) -> dict[str, Any]:
    s = json.loads((point / "summary.json").read_text())
    req = pd.read_csv(point / "requests.csv")
    duration = float(s["duration_s"])
    ttft = req["ttft_s"].to_numpy(float)
    e2e = (req["finish_time_s"] - req["arrival_time_s"]).to_numpy(float)
    out_len = req["output_len"].to_numpy(float)
    # vLLM's TPOT: time after the first token over the tokens after the first.
    many = out_len > 1
    tpot = (e2e[many] - ttft[many]) / (out_len[many] - 1)
    naive = _dt.datetime.fromtimestamp(math.floor(end), tz).replace(tzinfo=None)

    def ms(x: float) -> float:
        return float(x) * 1000.0

    return {
        "date": naive.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": model_id, "tokenizer_id": model_id,
        "num_prompts": int(s["num_requests"]), "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": duration,
        "completed": int(s["num_requests"]), "failed": 0,
        "total_input_tokens": int(s["total_prompt_tokens"]),
        "total_output_tokens": int(s["total_output_tokens"]),
        "request_throughput": float(s["request_throughput"]),
        "output_throughput": float(s["output_throughput"]),
        "total_token_throughput": float(s["total_token_throughput"]),
        "mean_ttft_ms": ms(np.mean(ttft)), "median_ttft_ms": ms(np.median(ttft)),
        "p95_ttft_ms": ms(np.percentile(ttft, 95)), "p99_ttft_ms": ms(np.percentile(ttft, 99)),
        "mean_tpot_ms": ms(np.mean(tpot)) if len(tpot) else None,
        "mean_itl_ms": ms(s["itl_mean_s"]), "p95_itl_ms": ms(s["itl_p95_s"]),
        "p99_itl_ms": ms(s["itl_p99_s"]),
        "mean_e2el_ms": ms(np.mean(e2e)), "p95_e2el_ms": ms(np.percentile(e2e, 95)),
        "p99_e2el_ms": ms(np.percentile(e2e, 99)),
        "input_lens": [int(x) for x in req["prompt_len"]],
        "output_lens": [int(x) for x in req["output_len"]],
    }


def replay_sweep(
    points_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    epoch: float = 1_740_794_400.0,
    bench_timezone: str = "+08:00",
    scrape_interval_s: float = 5.0,
    idle_scrapes: int = 2,
    model_id: str = "llama-3.1-8b",
    log_name: str = "prod.jsonl",
) -> Replay:
    """Write ``out_dir/<log_name>`` and ``out_dir/bench/*.json`` from a sweep's
    ``points/<variant>/`` folder; the levels run in increasing concurrency from ``epoch``
    (unix seconds, a multiple of the scrape interval), ``idle_scrapes`` idle scrapes apart."""
    points = _points(Path(points_dir))
    if idle_scrapes < 1:
        raise InputError("idle_scrapes: at least one scrape of the idle server between levels")
    out = Path(out_dir)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    tz = bench_tzinfo(bench_timezone)
    step = float(scrape_interval_s)
    lines: list[str] = []
    offsets: dict[str, float] = {}
    start = float(epoch)
    bench: list[Path] = []
    spans: dict[int, tuple[float, float]] = {}

    def emit(t: float, text: str) -> None:
        lines.append(json.dumps({"t": round(t, 3), "text": text}))

    for k, (concurrency, point) in enumerate(points):
        scrapes = [json.loads(x) for x in (point / "metrics.prom.jsonl").read_text().splitlines()
                   if x.strip()]
        families = _families(scrapes[0]["text"])
        if k == 0:  # the server is up and idle before the first level
            text, _ = _rewrite(scrapes[0]["text"], families, {}, epoch, idle=True,
                               zero_counters=True)
            emit(start - step, text)
            emit(start, text)
        duration = float(json.loads((point / "summary.json").read_text())["duration_s"])
        last_counters: dict[str, float] = dict(offsets)
        final_text = scrapes[-1]["text"]
        for sc in scrapes:
            t = float(sc["t"])
            if t > duration or not math.isclose(t / step, round(t / step)):
                continue  # the simulation's closing scrape is off the grid: see below
            text, last_counters = _rewrite(sc["text"], families, offsets, epoch)
            emit(start + t, text)
        # After the level: the idle server on the grid, its counters final.
        end_grid = math.ceil(duration / step) * step
        if math.isclose(end_grid, duration):  # that grid scrape was the level's own
            end_grid += step
        idle_text, last_counters = _rewrite(final_text, families, offsets, epoch, idle=True)
        for j in range(idle_scrapes + 1):
            emit(start + end_grid + j * step, idle_text)
        spans[concurrency] = (start, start + duration)
        result = _bench_result(concurrency, point, start + duration, tz, model_id)
        path = out / "bench" / _NAME.format(c=concurrency, model=model_id, date=result["date"])
        path.write_text(json.dumps(result) + "\n")
        bench.append(path)
        offsets = last_counters
        # The next level starts on the last idle scrape.
        start = start + end_grid + idle_scrapes * step
    log = out / log_name
    log.write_text("\n".join(lines) + "\n")
    return Replay(log=log, bench=bench, levels=[c for c, _ in points], spans=spans)
