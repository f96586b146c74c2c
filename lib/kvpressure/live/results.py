"""A load level's outcomes as a ``vllm bench serve --save-result --save-detailed`` result.

The same fields, units and statistics as vLLM's writer (latencies in ms, ``numpy`` percentiles,
per-request arrays in seconds, failed requests counted apart and left out of every statistic),
so :mod:`kvpressure.ingestion.bench` reads one format whichever engine drove the load. Two
additions, ignored by other readers: ``kvpressure_window`` (the level's start and end in unix
seconds, finer than vLLM's whole-second local ``date``) and ``kvpressure_level`` (whether the
level ran to its end, and if not why).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvpressure.live.client import RequestOutcome

PERCENTILES = (50, 90, 95, 99)
WINDOW = "kvpressure_window"
LEVEL = "kvpressure_level"


def _stats(prefix: str, values_s: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values_s, dtype=float) * 1000.0
    if arr.size == 0:
        arr = np.zeros(1)
    out = {
        f"mean_{prefix}_ms": float(np.mean(arr)),
        f"median_{prefix}_ms": float(np.median(arr)),
        f"std_{prefix}_ms": float(np.std(arr)),
    }
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(arr, p))
    return out


def bench_result(
    outcomes: Sequence[RequestOutcome],
    *,
    concurrency: int | None,
    model: str,
    tokenizer: str,
    started: float,
    ended: float,
    complete: bool,
    reason: str | None = None,
    label: str | None = None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
) -> dict[str, Any]:
    """The result object of one level (``started``/``ended`` in unix seconds): a closed loop of
    ``concurrency`` clients, or requests sent at ``request_rate`` (capped at ``concurrency`` in
    flight; None: an open loop)."""
    ok = [o for o in outcomes if o.success]
    duration = max(ended - started, 1e-9)
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    result: dict[str, Any] = {
        "date": _dt.datetime.fromtimestamp(ended).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": label,
        "model_id": model,
        "tokenizer_id": tokenizer,
        "num_prompts": len(outcomes),
        "request_rate": "inf" if request_rate is None else float(request_rate),
        "burstiness": float(burstiness) if math.isfinite(burstiness) else "inf",
        "max_concurrency": None if concurrency is None else int(concurrency),
        "duration": duration,
        "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_concurrent_requests": (int(concurrency) if concurrency is not None
                                    else _most_in_flight(ok)),
    }
    result |= _stats("ttft", [o.ttft for o in ok])
    result |= _stats("tpot", tpots)
    result |= _stats("itl", [x for o in ok for x in o.itl])
    result |= _stats("e2el", [o.latency for o in ok])
    result |= {
        "input_lens": [o.prompt_len for o in outcomes],
        "output_lens": [o.output_len for o in outcomes],
        "ttfts": [o.ttft for o in outcomes],
        "itls": [o.itl for o in outcomes],
        "latencies": [o.latency for o in outcomes],
        "start_times": [o.start_time for o in outcomes],
        "errors": [o.error for o in outcomes],
        WINDOW: {"start": started, "end": ended},
        LEVEL: {"complete": bool(complete), "reason": reason},
    }
    return result


def _most_in_flight(outcomes: Sequence[RequestOutcome]) -> int:
    """The most requests in flight at once (an open loop has no cap to name)."""
    events = sorted([(o.start_time, 1) for o in outcomes]
                    + [(o.start_time + o.latency, -1) for o in outcomes],
                    key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def error_summary(outcomes: Sequence[RequestOutcome], limit: int = 3) -> str:
    """The commonest error reasons, e.g. ``"5x HTTP 500: boom; 1x timeout"``."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.error:
            key = o.error.split(" after ")[0][:120]
            counts[key] = counts.get(key, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return "; ".join(f"{n}x {e}" for e, n in top)


def write_result(result: dict[str, Any], path: Path) -> Path:
    """Write atomically: a reader never sees half a result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    text = json.dumps(result, allow_nan=False, default=_finite)
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _finite(value: Any) -> Any:  # numpy scalars that json does not know
    if hasattr(value, "item"):
        value = value.item()
        return None if isinstance(value, float) and not math.isfinite(value) else value
    raise TypeError(f"cannot write {type(value).__name__}")
