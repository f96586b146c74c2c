"""The workload's length distributions (prompt and output tokens): exact from a simulated
point's requests.csv or a bench result's per-request lengths, means from its token totals, or
bucket-interpolated from vLLM's length histograms; unmeasured ones say why."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.errors import InputError


def length_stats(values: pd.Series, description: str, source: str) -> dict[str, Any]:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return {
        "description": description, "mean": float(v.mean()), "p50": float(v.quantile(0.5)),
        "p95": float(v.quantile(0.95)), "max": float(v.max()), "source": source,
    }


def bench_source(source: Any) -> tuple[Path, int] | None:
    """(file, index of the result in it) from a runs row's ``source`` (``path#k + log``)."""
    if not isinstance(source, str) or not source:
        return None
    first = source.split(" + ")[0]
    path, sep, k = first.rpartition("#")
    if sep and k.isdigit():
        return Path(path), int(k) - 1
    return Path(first), 0


def bench_lengths(where: tuple[Path, int]) -> dict[str, Any]:
    """Length distributions from a bench result: exact from ``--save-detailed``'s
    ``input_lens``/``output_lens``, else only the means from its token totals."""
    from kvpressure.ingestion.bench import load_results

    path, index = where
    if path.suffix not in (".json", ".jsonl", ".gz") or not path.is_file():
        return {}
    try:
        results = load_results(path)
    except InputError:
        return {}
    if index >= len(results) or not isinstance(results[index][1], dict):
        return {}
    res = results[index][1]
    if "completed" not in res:
        return {}
    out = {}
    for key, array, total in (("input_len_distribution", "input_lens", "total_input_tokens"),
                              ("output_len_distribution", "output_lens", "total_output_tokens")):
        values = res.get(array)
        if isinstance(values, list) and values:
            errors = res.get("errors")
            if isinstance(errors, list) and len(errors) == len(values):
                values = [v for v, e in zip(values, errors, strict=True) if not e]
            out[key] = length_stats(pd.Series(values), f"per request, from {array}",
                                     f"{path.name} ({array}, exact)")
        elif isinstance(res.get(total), int | float) and res.get("completed"):
            mean = float(res[total]) / float(res["completed"])
            out[key] = {"description": f"{total} / completed (mean only)", "mean": mean,
                        "p50": None, "p95": None, "max": None,
                        "source": f"{path.name} ({total})"}
    return out


def keep_mean(bench: dict[str, Any]) -> dict[str, Any]:
    """A bench result's exact mean wins over a histogram's bucket-interpolated one."""
    if bench.get("mean") is None:
        return {}
    return {"mean": bench["mean"], "description": "quantiles from the histogram, mean from the "
            "bench result's token totals"}


def unmeasured(base: str) -> dict[str, Any]:
    return {"description": f"not measured ({base} missing, no bench result)", "mean": None,
            "p50": None, "p95": None, "max": None, "source": base}


def length_from_histogram(series: pd.DataFrame, base: str, t0: float | None, t1: float
                           ) -> dict[str, Any]:
    """Length statistics of the requests finished in ``(t0, t1]`` (``t0`` None: since the
    process started, the log's counters read from zero)."""
    from kvpressure.ingestion.counters import histogram_mean, histogram_quantile

    origin = "zero" if t0 is None else "first"

    def q(x: float) -> float:
        return histogram_quantile(series, base, x, t0, t1, origin=origin)

    mean = histogram_mean(series, base, t0, t1, origin=origin)
    stats = {"mean": mean, "p50": q(0.5), "p95": q(0.95), "max": q(1.0)}
    if any(not isinstance(v, float) or math.isnan(v) for v in stats.values()):
        return {"description": f"not measured ({base} missing)", "mean": None, "p50": None,
                "p95": None, "max": None, "source": base}
    return {"description": f"from the {base} histogram", **stats,
            "source": f"{base} (bucket-interpolated)"}
