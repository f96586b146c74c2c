"""The best output throughput within the limits, the ranked table and the Pareto front.

A configuration's throughput within the limits: the highest output throughput among its levels
whose latencies meet every limit (0 when none does): what the server sustains while every
limited percentile stays within bounds. (Not vLLM's goodput, which counts the requests that
meet per-request limits: the report's goodput is that one.) Ranking: it, then the fewest
settings changed from the baseline (a change that does not bind is no reason to deploy it),
then peak throughput, then the id, so the order is total and the table the same on every
executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from kvpressure.analysis.limits import broken
from kvpressure.simulation.experiment import ENGINE_ARGS
from kvpressure.tune.grid import format_value
from kvpressure.tune.targets import LEVEL_METRICS


def changes(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """The parameters whose value differs from the baseline's setting in force."""
    out = []
    for k, v in config.items():
        base = baseline.get(k, baseline.get(ENGINE_ARGS.get(k) or k))
        if base != v:
            out.append(k)
    return out


def best_within_limits(levels: Sequence[Mapping[str, Any]], limits: Mapping[str, float]
            ) -> tuple[float, Mapping[str, Any] | None]:
    """``(output throughput, the level giving it)``; ``(0.0, None)`` when no level meets the limits."""
    best: Mapping[str, Any] | None = None
    for row in levels:
        if broken(row, limits):
            continue
        if best is None or row["output_throughput"] > best["output_throughput"]:
            best = row
    return (float(best["output_throughput"]), best) if best is not None else (0.0, None)


def rank(records: Sequence[Mapping[str, Any]], parameters: Sequence[str],
         limits: Mapping[str, float], baseline: Mapping[str, Any]) -> pd.DataFrame:
    """One row per valid configuration, best first."""
    rows = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        levels = rec["levels"]
        g, at = best_within_limits(levels, limits)
        peak = max(levels, key=lambda r: r["output_throughput"])
        settings = rec["settings"] or {}
        row: dict[str, Any] = {"id": rec["id"]}
        for p in parameters:
            row[p] = format_value(rec["config"][p]) if p in rec["config"] else ""
        row.update({
            "within_limits_output_tok_s": g,
            "within_limits_level": at["level"] if at is not None else None,
            "levels_within_limits": sum(not broken(r, limits) for r in levels),
            "peak_output_tok_s": float(peak["output_throughput"]),
            "peak_level": peak["level"],
        })
        for key in (*limits, "preemptions", "recompute_ratio"):
            row[f"{key}_at_best"] = at[key] if at is not None else None
        row["num_gpu_blocks"] = settings.get("num_gpu_blocks")
        row["changes_from_baseline"] = len(changes(rec["config"], baseline))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame.sort_values(
        ["within_limits_output_tok_s", "changes_from_baseline", "peak_output_tok_s", "id"],
        ascending=[False, True, False, True], kind="mergesort").reset_index(drop=True)
    frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame


def levels_frame(records: Sequence[Mapping[str, Any]], level_name: str,
                 limits: Mapping[str, float]) -> pd.DataFrame:
    rows = []
    for rec in records:
        for r in rec["levels"]:
            rows.append({"id": rec["id"], level_name: r["level"],
                         **{k: r.get(k) for k in LEVEL_METRICS},
                         "within_limits": not broken(r, limits)})
    return pd.DataFrame(rows, columns=["id", level_name, *LEVEL_METRICS, "within_limits"])


def invalid_frame(records: Sequence[Mapping[str, Any]], parameters: Sequence[str]
                  ) -> pd.DataFrame:
    rows = [{"id": rec["id"],
             **{p: format_value(rec["config"][p]) if p in rec["config"] else ""
                for p in parameters},
             "reason": rec["reason"]} for rec in records if rec["status"] != "ok"]
    return pd.DataFrame(rows, columns=["id", *parameters, "reason"])


def pareto_front(levels: pd.DataFrame, latency: str) -> pd.DataFrame:
    """The (configuration, level) points no other point beats on both output throughput
    (higher) and ``latency`` (lower), by latency."""
    pts = levels.dropna(subset=[latency, "output_throughput"])
    pts = pts.sort_values([latency, "output_throughput", "id"],
                          ascending=[True, False, True], kind="mergesort")
    keep, best = [], -float("inf")
    for idx, thr in zip(pts.index, pts["output_throughput"], strict=True):
        if thr > best:
            keep.append(idx)
            best = thr
    return pts.loc[keep].reset_index(drop=True)
