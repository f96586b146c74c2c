"""Per-request latencies by level, as ``vllm bench serve``, GuideLLM and AIPerf users read them:
distributions of TTFT, TPOT (each request's mean inter-token latency) and end-to-end latency per
concurrency level, requests/s, and goodput (requests/s meeting latency limits, the
``vllm bench serve --goodput`` idea).

Requests come from the simulation's kept points (``points/<variant>/c<level>/requests.csv``,
the experiment's own seed) or from ``vllm bench serve --save-detailed`` results among the
ingested inputs (their ``ttfts``, ``itls`` and ``latencies`` arrays). Data without per-request
values gives an empty table: the per-level percentiles of stage 03 are then all there is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.stages.results import CollectInfo

COLUMNS = ["concurrency", "ttft_s", "tpot_s", "e2e_s"]


def _level(info: CollectInfo, level: Any) -> Any:
    return float(level) if info.level_axis == "request_rate" else int(level)


def _simulated(run_dir: Path, info: CollectInfo) -> pd.DataFrame:
    from kvpressure.sweeps.sweep import point_folder

    variant = info.baseline_variant
    x = info.level_axis
    frames = []
    for level in info.levels:
        folder = (point_folder(variant, None, float(level)) if x == "request_rate"
                  else point_folder(variant, int(level)))
        path = run_dir / folder / "requests.csv"
        if not path.is_file():
            continue
        req = pd.read_csv(path)
        if not {"ttft_s", "itl_mean_s", "arrival_time_s", "finish_time_s"} <= set(req.columns):
            continue
        frames.append(pd.DataFrame({
            x: _level(info, level), "ttft_s": req["ttft_s"], "tpot_s": req["itl_mean_s"],
            "e2e_s": req["finish_time_s"] - req["arrival_time_s"]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[x, *COLUMNS[1:]])


def _bench(info: CollectInfo) -> pd.DataFrame:
    from kvpressure.errors import InputError
    from kvpressure.ingestion.bench import load_results
    from kvpressure.paths import stored_path

    x = info.level_axis
    frames = []
    for item in info.inputs:
        path = stored_path(item.path)
        if path.suffix != ".json" or not path.is_file():
            continue
        try:
            results = load_results(path)
        except (InputError, OSError, ValueError):
            continue
        for _, res in results:
            if not isinstance(res, dict) or not isinstance(res.get("ttfts"), list):
                continue
            ttfts = res["ttfts"]
            n = len(ttfts)
            errors = _array(res, "errors", n, "")
            itls = _array(res, "itls", n, None)
            e2e = _array(res, "latencies", n, None)
            out_lens = _array(res, "output_lens", n, None)
            if errors is None or itls is None or e2e is None or out_lens is None:
                continue
            ok = [not e for e in errors]
            level = res.get("max_concurrency" if x == "concurrency" else "request_rate")
            frames.append(pd.DataFrame({
                x: level,
                "ttft_s": [t for t, k in zip(ttfts, ok, strict=True) if k],
                "tpot_s": [request_tpot(t, x, o, r) for t, x, o, r, k
                           in zip(ttfts, e2e, out_lens, itls, ok, strict=True) if k],
                "e2e_s": [x for x, k in zip(e2e, ok, strict=True) if k],
            }))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[x, *COLUMNS[1:]])
    return out.dropna(subset=[x])


def _array(res: dict[str, Any], key: str, n: int, fill: Any) -> list[Any] | None:
    """The per-request array ``key`` of a result (``fill`` for each request when the result
    has none), or None when its length does not match the requests'."""
    value = res.get(key)
    if not isinstance(value, list):
        return [fill] * n
    return value if len(value) == n else None


def request_tpot(ttft: Any, e2e: Any, output_len: Any, itls: Any = None) -> float:
    """One request's time per output token as ``vllm bench serve`` defines it: the time after
    the first token over the tokens after it, ``(e2e - ttft) / (output_len - 1)``; from its
    token gaps when the result kept them (``--save-detailed``) and the lengths are missing.
    NaN when it has no token after the first (a TPOT that does not exist, not a slow one)."""
    try:
        n_out, first, total = int(output_len), float(ttft), float(e2e)
    except (TypeError, ValueError):
        return float(np.mean(itls)) if itls else np.nan
    if n_out <= 1 or not (np.isfinite(first) and np.isfinite(total)):
        return np.nan
    return (total - first) / (n_out - 1)


def level_requests(run_dir: str | os.PathLike[str], info: CollectInfo) -> pd.DataFrame:
    """One row per completed request: its level, TTFT, TPOT and end-to-end latency (s)."""
    if info.simulated:
        return _simulated(Path(run_dir), info)
    return _bench(info)


def within_limits(requests: pd.DataFrame, ttft_limit_s: float | None,
                  tpot_limit_s: float | None, e2el_limit_s: float | None = None) -> float:
    """The share of ``requests`` within every limit given (None: no limit on it), as ``vllm
    bench serve --goodput ttft:MS tpot:MS e2el:MS`` counts: a request without a token after
    its first has no TPOT and is judged on the others alone. NaN when a limited latency is
    known for no request (the data cannot judge that limit: never read as every request
    failing it)."""
    limits = {"ttft_s": ttft_limit_s, "tpot_s": tpot_limit_s, "e2e_s": e2el_limit_s}
    limits = {col: v for col, v in limits.items() if v is not None}
    if not len(requests) or not limits or any(
            col not in requests or requests[col].isna().all() for col in limits):
        return float("nan")
    ok = pd.Series(True, index=requests.index)
    for col, limit in limits.items():
        # Only TPOT may be missing for a request (one output token): it has none to judge.
        ok &= (requests[col] <= limit) | (requests[col].isna() if col == "tpot_s" else False)
    return float(ok.mean())


def goodput(requests: pd.DataFrame, runs: pd.DataFrame, ttft_limit_s: float | None,
            tpot_limit_s: float | None, e2el_limit_s: float | None = None,
            x: str = "concurrency") -> pd.DataFrame:
    """Per level: requests/s, the share of requests within the limits, and goodput (that share
    of requests/s); ``runs`` gives each level's request throughput (its first repeat)."""
    rows = []
    rate = (runs.sort_values([c for c in ("repeat",) if c in runs])
            .drop_duplicates(x).set_index(x)["request_throughput"]
            if "request_throughput" in runs else pd.Series(dtype=float))
    for level, part in requests.groupby(x):
        good = within_limits(part, ttft_limit_s, tpot_limit_s, e2el_limit_s)
        rps = float(rate.get(level, np.nan))
        rows.append({x: int(level) if x == "concurrency" else float(level),
                     "requests": int(len(part)),
                     "requests/s": rps, "within limits": good,
                     "goodput (requests/s)": rps * good})
    return pd.DataFrame(rows)


def latency_figure(requests: pd.DataFrame, ttft_limit_s: float | None = None,
                   tpot_limit_s: float | None = None, e2el_limit_s: float | None = None,
                   x: str = "concurrency") -> Any:
    """TTFT, TPOT and E2E as empirical CDFs, one line per level, with the limits marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    data = requests.copy()
    from kvpressure.report.sentences import num

    if x == "concurrency":
        data["level"] = data[x].astype(int).astype(str)
        order = [str(c) for c in sorted(data[x].astype(int).unique())]
    else:
        data["level"] = data[x].map(num)
        order = [num(c) for c in sorted(data[x].astype(float).unique())]
    palette = sns.color_palette("viridis", n_colors=len(order))
    for ax, col, title, limit in ((axes[0], "ttft_s", "Time to first token", ttft_limit_s),
                                  (axes[1], "tpot_s", "Time per output token", tpot_limit_s),
                                  (axes[2], "e2e_s", "End-to-end latency", e2el_limit_s)):
        part = data.dropna(subset=[col])
        if len(part):
            sns.ecdfplot(data=part, x=col, hue="level", hue_order=order, palette=palette, ax=ax,
                         legend=ax is axes[2])
        if limit is not None:
            ax.axvline(limit, color="0.2", ls="--", lw=1)
        ax.set(title=title, xlabel="seconds", ylabel="share of requests")
        if col != "tpot_s":
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            # Labelled minor ticks ("2x10^0 3x10^0 ...") overlap on a short decade.
            ax.xaxis.set_minor_formatter(NullFormatter())
    legend = axes[2].get_legend()
    if legend is not None:
        legend.set_title("concurrency" if x == "concurrency" else "request rate (req/s)")
        sns.move_legend(axes[2], "upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
