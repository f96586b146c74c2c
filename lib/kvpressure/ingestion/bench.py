"""``vllm bench serve --save-result`` JSON -> rows of the ``runs`` table.

One file holds one run, or several when ``--append-result`` added one JSON object per line.
vLLM writes latencies in milliseconds (``mean_ttft_ms``, ``p99_itl_ms``); the table holds
seconds. Which percentiles exist depends on ``--metric-percentiles`` (default: 99 only) and
``--percentile-metrics`` (default: ttft,tpot,itl; no e2el); with ``--save-detailed`` the
per-request arrays (``ttfts``, ``itls``, ``latencies`` in seconds, ``errors``) are there and
the missing statistics are computed from them the way vLLM does (``numpy.percentile``, linear).
A statistic neither in the file nor computable stays NaN and is named in the report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from kvpressure.errors import InputError
from kvpressure.user_files import parse_user_json, read_user_text

REQUIRED = ("duration", "completed")
NaN = math.nan

# runs column -> (result field in ms, detailed array, statistic)
_LATENCIES: dict[str, tuple[str, str | None, str | int]] = {
    "ttft_mean_s": ("mean_ttft_ms", "ttfts", "mean"),
    "ttft_p95_s": ("p95_ttft_ms", "ttfts", 95),
    "ttft_p99_s": ("p99_ttft_ms", "ttfts", 99),
    "tpot_mean_s": ("mean_tpot_ms", None, "mean"),
    "itl_mean_s": ("mean_itl_ms", "itls", "mean"),
    "itl_p95_s": ("p95_itl_ms", "itls", 95),
    "itl_p99_s": ("p99_itl_ms", "itls", 99),
    "e2e_mean_s": ("mean_e2el_ms", "latencies", "mean"),
    "e2e_p95_s": ("p95_e2el_ms", "latencies", 95),
    "e2e_p99_s": ("p99_e2el_ms", "latencies", 99),
}


def load_results(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The result objects of one file, with the line each starts on."""
    text = read_user_text(path, "results file")
    if _one_document(text):
        return [(1, parse_user_json(text, path))]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if not _one_document(line):
            raise InputError(f"{path}: line {lineno}: not JSON")
        out.append((lineno, parse_user_json(line, f"{path} (JSON line {lineno})")))
    return out


def _one_document(text: str) -> bool:
    """Whether ``text`` parses as one JSON document (a deep one too: the strict reader then
    says what is wrong with it)."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    except RecursionError:
        return True
    return True


def _num(value: Any) -> float:
    if value is None:
        return NaN
    if isinstance(value, str):
        return math.inf if value.strip().lower() in ("inf", "+inf") else _float_or_nan(value)
    if isinstance(value, bool):
        return NaN
    if isinstance(value, int | float):
        return float(value)
    return NaN


def _checked(res: dict[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    """A count, rate or time of the result, NaN when absent or null; InputError naming the field
    for what vllm bench serve never writes: true/false, text, NaN or a negative number (and 0
    where ``positive``)."""
    value = res.get(key)
    if value is None:
        return NaN
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf"):
        number = math.inf
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: field '{key}' must be a number, got {value!r}")
    else:
        number = float(value)
    if not (number > 0 if positive else number >= 0):
        raise InputError(f"{where}: field '{key}' must be {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return number


def _float_or_nan(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return NaN


def _success_mask(res: dict[str, Any], n: int) -> np.ndarray:
    errors = res.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        return np.array([not e for e in errors], dtype=bool)
    return np.ones(n, dtype=bool)


def _detailed(res: dict[str, Any], array: str) -> np.ndarray | None:
    values = res.get(array)
    if not isinstance(values, list) or not values:
        return None
    ok = _success_mask(res, len(values))
    if array == "itls":
        flat = [x for keep, row in zip(ok, values, strict=True) if keep and row for x in row]
        return np.asarray(flat, dtype=float) if flat else None
    arr = np.asarray(values, dtype=float)[ok]
    return arr if len(arr) else None


def bench_row(
    res: dict[str, Any], where: str, run: str, notes: list[str]
) -> dict[str, Any]:
    """One ``runs`` row from one result object; InputError naming what is missing."""
    if not isinstance(res, dict):
        raise InputError(f"{where}: a vllm bench result is a JSON object")
    missing = [f for f in REQUIRED if f not in res]
    if missing:
        raise InputError(
            f"{where}: not a 'vllm bench serve' result: missing field(s) {', '.join(missing)}"
        )
    for key in ("completed", "failed", "num_prompts", "total_input_tokens",
                "total_output_tokens", "request_throughput", "output_throughput",
                "total_token_throughput", *(f for f, _, _ in _LATENCIES.values())):
        _checked(res, key, where)
    for key in ("duration", "max_concurrency"):
        _checked(res, key, where, positive=True)
    if not isinstance(res.get("request_rate"), str):
        _checked(res, "request_rate", where, positive=True)
    date = res.get("date")
    if date is not None:
        import datetime as _dt

        # vllm bench serve stamps when the run ended; its window in a scrape log hangs on it
        try:
            _dt.datetime.strptime(str(date), "%Y%m%d-%H%M%S")
        except ValueError:
            raise InputError(f"{where}: field 'date' {date!r} is not vllm bench serve's "
                             "YYYYmmdd-HHMMSS (the run's end, local time)") from None
    duration = _num(res["duration"])
    metadata_variant = res.get("variant")
    label = res.get("label")
    variant = str(metadata_variant or label or "default")
    row: dict[str, Any] = {
        "run": run,
        "variant": variant,
        "concurrency": _num(res.get("max_concurrency")),
        "request_rate": _num(res.get("request_rate")),
        "num_requests": _num(res.get("completed")),
        "failed": _num(res.get("failed")),
        "duration_s": duration,
        "request_throughput": _num(res.get("request_throughput")),
        "output_throughput": _num(res.get("output_throughput")),
        "total_token_throughput": _num(res.get("total_token_throughput")),
        "model": res.get("model_id"),
        "date": res.get("date"),
    }
    window = res.get("kvpressure_window")
    if isinstance(window, dict):
        # `kvpressure collect` stamps the level's span in unix seconds, finer than 'date'.
        start, end = _num(window.get("start")), _num(window.get("end"))
        if math.isfinite(start) and math.isfinite(end) and end > start:
            row["window_start"], row["window_end"] = start, end
    if "max_concurrency" not in res:
        notes.append(f"{where}: no 'max_concurrency' (older vLLM?): concurrency left empty")
    elif res.get("max_concurrency") is None:
        notes.append(f"{where}: max_concurrency is null (no client limit): concurrency empty")
    totals = {k: _num(res.get(k)) for k in ("total_input_tokens", "total_output_tokens")}
    if math.isnan(row["output_throughput"]) and duration > 0:
        row["output_throughput"] = totals["total_output_tokens"] / duration
    if math.isnan(row["total_token_throughput"]) and duration > 0:
        row["total_token_throughput"] = (
            totals["total_input_tokens"] + totals["total_output_tokens"]
        ) / duration
    if math.isnan(row["request_throughput"]) and duration > 0:
        row["request_throughput"] = row["num_requests"] / duration

    unknown = []
    for column, (field, array, stat) in _LATENCIES.items():
        value = _num(res.get(field)) / 1000.0
        if math.isnan(value) and array is not None:
            data = _detailed(res, array)
            if data is not None:
                value = float(np.mean(data) if isinstance(stat, str)
                              else np.percentile(data, stat))
        if math.isnan(value):
            unknown.append(column)
        row[column] = value
    core_unknown = [c for c in unknown if c in ("ttft_mean_s", "ttft_p95_s", "itl_mean_s",
                                                  "itl_p95_s", "itl_p99_s", "e2e_mean_s")]
    if core_unknown:
        notes.append(
            f"{where}: not in the file and no per-request arrays to compute them: "
            f"{', '.join(core_unknown)} (vllm bench serve --save-detailed, or "
            "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 95,99)"
        )
    return row


def read_bench(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    """All runs of one bench file."""
    results = load_results(path)
    if not results:
        raise InputError(f"{path}: no result in the file")
    rows = []
    for k, (lineno, res) in enumerate(results):
        where = f"{path}" if len(results) == 1 else f"{path}: line {lineno}"
        level = res.get("kvpressure_level") if isinstance(res, dict) else None
        if isinstance(level, dict) and level.get("complete") is False:
            # A level cut short (server gone, Ctrl-C, timeout) would put a false point on the
            # curve; it is kept on disk for reading and named here.
            notes.append(f"{where}: level incomplete ({level.get('reason') or 'no reason given'})"
                         ": not on the curve")
            continue
        row = bench_row(res, where, run, notes)
        row["source"] = str(path) if len(results) == 1 else f"{path}#{k + 1}"
        rows.append(row)
    return rows
