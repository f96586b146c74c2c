"""The tune folder's figures: the Pareto front (throughput vs latency over every level of
every configuration) and the recommended configuration's curves beside the baseline's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


_STYLE: dict[str, dict[str, Any]] = {
    "baseline": {"color": "tab:red", "ls": "-", "marker": "o", "ms": 4},
    "runner-up": {"color": "tab:orange", "ls": "--", "marker": "^", "ms": 5},
    "recommended": {"color": "tab:green", "ls": "-", "marker": "s", "ms": 4, "lw": 2},
}


def _drawing_order(highlight: Mapping[str, str]) -> list[tuple[str, str]]:
    """Baseline, runner-up, recommended: the recommendation on top where curves coincide."""
    return [(k, highlight[k]) for k in ("baseline", "runner-up", "recommended") if k in highlight]


def pareto_figure(levels: pd.DataFrame, front: pd.DataFrame, latency: str,
                  limits: Mapping[str, float], highlight: Mapping[str, str], path: Path
                  ) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.6))
    ax.scatter(levels[latency], levels["output_throughput"], s=8, color="0.75",
               label="every configuration, every level")
    ax.plot(front[latency], front["output_throughput"], "-", color="tab:blue", lw=3,
            alpha=0.35, label="Pareto front", zorder=1)
    for label, cid in _drawing_order(highlight):
        pts = levels[levels["id"] == cid]
        if not pts.empty:
            ax.plot(pts[latency], pts["output_throughput"], **_STYLE[label],
                    label=f"{label}: {cid}", zorder=3)
    if latency in limits:
        ax.axvline(limits[latency], color="k", ls="--", lw=1,
                   label=f"{latency.removesuffix('_s')} limit")
    ax.set_xscale("log")
    ax.set_xlabel(f"{latency.removesuffix('_s')} (s, log)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Throughput vs latency: every level of every configuration")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=2,
               frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_figure(levels: pd.DataFrame, level_name: str, limits: Mapping[str, float],
                  highlight: Mapping[str, str], path: Path) -> None:
    plt = _plt()
    panels = ["output_throughput", *[k for k in limits if k in levels]]
    if len(panels) == 1:
        panels += ["ttft_p95_s", "itl_p95_s"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4))
    for ax, metric in zip(axes, panels, strict=True):
        for label, cid in _drawing_order(highlight):
            pts = levels[levels["id"] == cid]
            ax.plot(pts[level_name], pts[metric], **_STYLE[label], label=f"{label}: {cid}")
        if metric in limits:
            ax.axhline(limits[metric], color="k", ls="--", lw=1, label="limit")
            ax.set_yscale("log")
        ax.set_xlabel(level_name)
        ax.set_title(metric)
    axes[0].set_ylabel("simulated")
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=2,
               frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
