"""One ``runs`` row from a run's scraped series (what a real server's metrics say about it).

Throughputs are rates over the scraped span (``t_last - t_first``, increases from the first
scrape), as Prometheus' ``rate()`` would give. Totals (requests, preemptions, recompute) and
latency statistics use the run's counter origin: when the log starts with the process
(``origin="zero"``) what happened before the first scrape counts too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.ingestion.counters import (
    gauge_max,
    gauge_mean,
    histogram_mean,
    histogram_quantile,
    window_increase,
)
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.recompute_estimate import recompute_range

RUNS_COLUMNS = [
    "run",
    "variant",
    "concurrency",
    "request_rate",
    "num_requests",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "ttft_mean_s",
    "ttft_p95_s",
    "itl_mean_s",
    "itl_p95_s",
    "itl_p99_s",
    "e2e_mean_s",
    "preemptions",
    "recomputed_tokens",
    "recompute_ratio",
    "recompute_ratio_low",
    "recompute_ratio_high",
    "mean_running",
    "max_running",
    "mean_kv_usage",
    "source",
    # beyond the contract's minimum
    "recomputed_tokens_low",
    "recomputed_tokens_high",
    "ttft_p99_s",
    "tpot_mean_s",
    "e2e_p95_s",
    "e2e_p99_s",
    "failed",
    "model",
    "date",
    "t_start",
    "t_end",
    # the steady part of the window the gauge columns are read over (load_window.py)
    "t_steady_start",
    "t_steady_end",
]

# Columns a scrape log can fill (the rest come from a bench result).
SCRAPE_COLUMNS = (
    "preemptions",
    "recomputed_tokens",
    "recompute_ratio",
    "recompute_ratio_low",
    "recompute_ratio_high",
    "recomputed_tokens_low",
    "recomputed_tokens_high",
    "mean_running",
    "max_running",
    "mean_kv_usage",
    "t_start",
    "t_end",
    "t_steady_start",
    "t_steady_end",
)


def _div(a: float, b: float) -> float:
    return a / b if b and b > 0 and not math.isnan(a) else math.nan


def scrape_row(
    series: pd.DataFrame,
    run: str,
    *,
    t0: float | None = None,
    t1: float | None = None,
    origin: str = "first",
    source: str = "",
    engine: EngineFacts | None = None,
    gauges: tuple[float, float] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's row and its recompute estimate (with assumptions).

    ``gauges`` is the span the gauge columns are read over (the load's steady part,
    :mod:`kvpressure.ingestion.load_window`); default ``(t0, t1)``.
    """
    rows = series
    if "run" in series.columns and not _only_run(series, run):
        rows = series[series["run"] == run]
    t = rows["t"].to_numpy(dtype=float)
    lo = float(np.min(t)) if len(t) else math.nan
    hi = float(np.max(t)) if len(t) else math.nan
    t_start = lo if t0 is None else max(lo, t0)
    t_end = hi if t1 is None else min(hi, t1)
    span = t_end - t_start
    kw: dict[str, Any] = {"run": run}

    def inc(metric: str, labels: Any = None, how: str = origin) -> float:
        return window_increase(rows, metric, t0, t1, labels, origin=how, **kw)

    gen_rate = inc("vllm:generation_tokens_total", how="first")
    prompt_rate = inc("vllm:prompt_tokens_total", how="first")
    done_rate = inc("vllm:request_success_total", how="first")
    estimate = recompute_range(rows, t0, t1, origin=origin, engine=engine, **kw)

    g0, g1 = gauges if gauges is not None else (t0, t1)

    def hmean(base: str) -> float:
        return histogram_mean(rows, base, t0, t1, origin=origin, **kw)

    def hq(base: str, q: float) -> float:
        return histogram_quantile(rows, base, q, t0, t1, origin=origin, **kw)

    row: dict[str, Any] = {
        "run": run,
        "variant": "default",
        "concurrency": math.nan,
        "request_rate": math.nan,
        "num_requests": inc("vllm:request_success_total"),
        "duration_s": span,
        "request_throughput": _div(done_rate, span),
        "output_throughput": _div(gen_rate, span),
        "total_token_throughput": _div(gen_rate + prompt_rate, span),
        "ttft_mean_s": hmean("vllm:time_to_first_token_seconds"),
        "ttft_p95_s": hq("vllm:time_to_first_token_seconds", 0.95),
        "itl_mean_s": hmean("vllm:inter_token_latency_seconds"),
        "itl_p95_s": hq("vllm:inter_token_latency_seconds", 0.95),
        "itl_p99_s": hq("vllm:inter_token_latency_seconds", 0.99),
        "e2e_mean_s": hmean("vllm:e2e_request_latency_seconds"),
        "preemptions": estimate["preemptions"],
        "recomputed_tokens": estimate["point"],
        "recompute_ratio": estimate["ratio_point"],
        "recompute_ratio_low": estimate["ratio_low"],
        "recompute_ratio_high": estimate["ratio_high"],
        "mean_running": gauge_mean(rows, "vllm:num_requests_running", g0, g1, **kw),
        "max_running": gauge_max(rows, "vllm:num_requests_running", g0, g1, **kw),
        "mean_kv_usage": gauge_mean(rows, "vllm:kv_cache_usage_perc", g0, g1, **kw),
        "source": source,
        "recomputed_tokens_low": estimate["low"],
        "recomputed_tokens_high": estimate["high"],
        "ttft_p99_s": hq("vllm:time_to_first_token_seconds", 0.99),
        "tpot_mean_s": hmean("vllm:request_time_per_output_token_seconds"),
        "e2e_p95_s": hq("vllm:e2e_request_latency_seconds", 0.95),
        "e2e_p99_s": hq("vllm:e2e_request_latency_seconds", 0.99),
        "failed": math.nan,
        "model": None,
        "date": None,
        "t_start": t_start,
        "t_end": t_end,
        "t_steady_start": t_start if g0 is None else max(lo, g0),
        "t_steady_end": t_end if g1 is None else min(hi, g1),
    }
    return {k: _plain(v) for k, v in row.items()}, estimate


def _only_run(series: pd.DataFrame, run: str) -> bool:
    """Whether every row belongs to ``run`` (then no filtered copy of a large table is made)."""
    col = series["run"]
    if isinstance(col.dtype, pd.CategoricalDtype) and list(col.cat.categories) == [run]:
        return True
    return False


def _plain(value: Any) -> Any:
    """numpy scalars -> Python floats (JSON and CSV stay the same everywhere)."""
    if isinstance(value, np.generic):
        return value.item()
    return value
