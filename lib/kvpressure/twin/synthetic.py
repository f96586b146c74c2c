"""A measured-looking run folder from the simulation with known step-time coefficients.

What the twin is checked against when the truth must be known: every level is simulated with
``coefficients`` (event-driven, seeded request set), its times are multiplied by a seeded
log-normal noise of ``noise`` relative spread (a level's throughput and latencies move together,
the way run-to-run noise on a busy machine moves them), and the folder gets what an ingested
bench sweep would hold: ``runs.csv``, the per-request lengths (``points/baseline/c<C>/
requests.csv``, as a sweep writes them) and ``series.csv`` with ``vllm:cache_config_info``.
An open-loop level (a workload with arrival times) is written as ``vllm bench serve
--request-rate R --save-detailed`` would leave it: a result file ``bench/rate-<R>.json`` with
the per-request lengths and send times, its row keyed by ``request_rate``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.folders.run_folder import RunFolder
from kvpressure.twin.simulate import simulate_level
from kvpressure.twin.workload import LevelWorkload


def synthetic_workloads(levels: Sequence[float], *, input_len: tuple[int, int],
                        output_len: tuple[int, int], requests_per_level: int | None = None,
                        seed: int = 0, open_loop: bool = False) -> dict[Any, LevelWorkload]:
    """Uniform lengths in the given inclusive ranges; ``requests_per_level`` (default 4 x C,
    at least 32) requests per level, the same draw at every level (as ``vllm bench serve``
    with one seed). ``open_loop``: the levels are request rates, the arrivals Poisson at each
    (seeded)."""
    from kvpressure.twin.workload import drawn_arrivals

    out: dict[Any, LevelWorkload] = {}
    for c in levels:
        n = requests_per_level or max(32, 4 * int(c))
        rng = np.random.default_rng(seed)
        ins = tuple(map(int, rng.integers(input_len[0], input_len[1] + 1, size=n)))
        outs = tuple(map(int, rng.integers(output_len[0], output_len[1] + 1, size=n)))
        if open_loop:
            out[float(c)] = LevelWorkload(0, ins, outs, True, request_rate=float(c),
                                          arrival_times_s=drawn_arrivals(n, float(c), seed=seed))
        else:
            out[int(c)] = LevelWorkload(int(c), ins, outs, True)
    return out


def _bench_result(w: LevelWorkload, sim: Mapping[str, Any]) -> dict:
    """The fields of a ``vllm bench serve --save-detailed`` result the twin reads."""
    return {"date": "20260101-000000", "backend": "vllm", "model_id": "synthetic",
            "num_prompts": w.num_requests, "request_rate": w.request_rate, "burstiness": 1.0,
            "max_concurrency": None, "duration": sim["duration_s"],
            "completed": w.num_requests, "failed": 0,
            "total_input_tokens": sum(w.prompt_lens), "total_output_tokens": sum(w.output_lens),
            "input_lens": list(w.prompt_lens), "output_lens": list(w.output_lens),
            "start_times": [1000.0 + t for t in w.arrival_times_s or ()],
            "errors": [""] * w.num_requests}


def write_synthetic_run(out_dir: str | Path, settings: Mapping[str, Any],
                        workloads: Mapping[int, LevelWorkload],
                        coefficients: Mapping[str, float], *, ttft_offset: float = 0.0,
                        noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Write the folder; returns its ``runs`` table."""
    out = Path(out_dir)
    rng = np.random.default_rng(seed)
    rows = []
    for c, w in sorted(workloads.items()):
        sim = simulate_level(settings, w, coefficients, ttft_offset)
        f = float(np.exp(rng.normal(0.0, noise))) if noise > 0 else 1.0
        ratio = sim["recompute_ratio"]
        key = ({"run": f"synthetic/r{c:g}", "concurrency": float("nan"), "request_rate": c}
               if w.open_loop else {"run": f"synthetic/c{c}", "concurrency": c})
        source = "simulation"
        if w.open_loop:
            bench = out / "bench" / f"rate-{c:g}.json"
            bench.parent.mkdir(parents=True, exist_ok=True)
            bench.write_text(json.dumps(_bench_result(w, sim)) + "\n")
            source = str(bench.relative_to(out))
        rows.append({
            **key, "variant": "baseline",
            "num_requests": sim["num_requests"], "duration_s": sim["duration_s"] * f,
            "request_throughput": sim["num_requests"] / (sim["duration_s"] * f),
            "output_throughput": sim["output_throughput"] / f,
            "total_token_throughput": sim["total_token_throughput"] / f,
            "ttft_mean_s": sim["ttft_mean_s"] * f, "ttft_p95_s": sim["ttft_p95_s"] * f,
            "itl_mean_s": sim["itl_mean_s"] * f, "itl_p95_s": sim["itl_p95_s"] * f,
            "preemptions": sim["preemptions"], "recomputed_tokens": sim["recomputed_tokens"],
            "recompute_ratio": ratio, "recompute_ratio_low": ratio,
            "recompute_ratio_high": ratio, "mean_running": sim["mean_running"],
            "max_running": sim["max_running"], "source": source,
        })
        if w.open_loop:
            continue
        point = RunFolder(out).point_dir(f"baseline/c{c}")
        point.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"id": [r["id"] for r in w.requests()], "prompt_len": w.prompt_lens,
                      "output_len": w.output_lens}).to_csv(point / "requests.csv", index=False,
                                                           lineterminator="\n")
    runs = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(out)
    runs.to_csv(folder.runs_path, index=False, lineterminator="\n")
    labels = (f"block_size={settings['block_size']},enable_prefix_caching="
              f"{str(settings.get('enable_prefix_caching', True))},"
              f"num_gpu_blocks={settings['num_gpu_blocks']}")
    pd.DataFrame({"run": ["synthetic"], "t": [0.0], "metric": ["vllm:cache_config_info"],
                  "labels": [labels], "value": [1.0]}).to_csv(folder.series_path, index=False,
                                                             lineterminator="\n")
    engine = {k: v for k, v in settings.items() if k not in ("num_gpu_blocks", "block_size",
                                                                 "enable_prefix_caching")}
    (out / "engine.json").write_text(json.dumps(engine, indent=2, sort_keys=True) + "\n")
    return runs
