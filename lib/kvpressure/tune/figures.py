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


def pareto_figure(levels: pd.DataFrame, front: pd.DataFrame, latency: str,
                  limits: Mapping[str, float], highlight: Mapping[str, str], path: Path
                  ) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.scatter(levels[latency], levels["output_throughput"], s=8, color="0.75",
               label="every configuration, every level")
    ax.plot(front[latency], front["output_throughput"], "-o", color="tab:blue", ms=4,
            label="Pareto front")
    colors = {"recommended": "tab:green", "runner-up": "tab:orange", "baseline": "tab:red"}
    for label, cid in highlight.items():
        pts = levels[levels["id"] == cid]
        if not pts.empty:
            ax.plot(pts[latency], pts["output_throughput"], "-s", ms=4,
                    color=colors.get(label, "k"), label=f"{label}: {cid}")
    if latency in limits:
        ax.axvline(limits[latency], color="k", ls="--", lw=1,
                   label=f"{latency.removesuffix('_s')} limit")
    ax.set_xscale("log")
    ax.set_xlabel(f"{latency.removesuffix('_s')} (s, log)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Throughput vs latency: every level of every configuration")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_figure(levels: pd.DataFrame, level_name: str, limits: Mapping[str, float],
                  highlight: Mapping[str, str], path: Path) -> None:
    plt = _plt()
    panels = ["output_throughput", *[k for k in limits if k in levels]]
    if len(panels) == 1:
        panels += ["ttft_p95_s", "itl_p95_s"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    colors = {"recommended": "tab:green", "runner-up": "tab:orange", "baseline": "tab:red"}
    for ax, metric in zip(axes, panels, strict=True):
        for label, cid in highlight.items():
            pts = levels[levels["id"] == cid]
            ax.plot(pts[level_name], pts[metric], "-o", ms=4, color=colors.get(label, "k"),
                    label=f"{label}: {cid}")
        if metric in limits:
            ax.axhline(limits[metric], color="k", ls="--", lw=1, label="limit")
            ax.set_yscale("log")
        ax.set_xlabel(level_name)
        ax.set_title(metric)
    axes[0].set_ylabel("simulated")
    axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
