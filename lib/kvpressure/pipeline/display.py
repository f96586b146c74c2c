"""How the notebooks show things: figures as PNG, tables, generated sentences.

Figures are rendered to PNG bytes here rather than left to the matplotlib backend, so they appear
the same in JupyterLab, under papermill and under nbval whatever ``MPLBACKEND`` says, and the
report can embed them as they are.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpressure.pipeline.collect import Tables

FIGSIZE = (9.0, 4.2)
DPI = 100


def setup_plots() -> None:
    """Seaborn's theme, sized for a 1280 px wide report."""
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "kvpressure"
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook", rc={"figure.figsize": FIGSIZE})


def open_run(run_dir: str | os.PathLike[str], experiment: str | os.PathLike[str] = "",
             source: Any = "") -> Tables:
    """What notebooks 02-06 open with: the plot theme, stage 01's results (running stage 01
    first when the run folder lacks them, so each notebook also runs on its own) and its tables."""
    from kvpressure.pipeline.collect import ensure_collected, load_tables

    setup_plots()
    ensure_collected(run_dir, experiment, source)
    return load_tables(run_dir)


def figure_png(fig: Any) -> bytes:
    """PNG bytes of a matplotlib figure, without the run-dependent metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def show_figure(fig: Any) -> None:
    """Display ``fig`` as a PNG and close it (so no backend shows it a second time)."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    png = figure_png(fig)
    plt.close(fig)
    display(Image(data=png, format="png"))


def plot_band(ax: Any, frame: Any, y: str = "output_throughput", x: str = "concurrency",
              hue: str | None = None, label: str | None = None, color: Any = None,
              repeats_word: str = "repeats") -> None:
    """One line per ``hue`` value through the level means of ``frame`` (one row per level, as
    :func:`kvpressure.pipeline.levels.level_means` gives it), with the spread between repeats
    (``<y>_min`` to ``<y>_max``) as a band in the line's colour; no band when each level ran
    once. ``repeats_word`` names the repeats in the legend ("seeds" for a simulation)."""
    import seaborn as sns

    groups = [(label, frame)] if hue is None else [(str(k), g) for k, g in
                                                   frame.groupby(hue, sort=False)]
    colors = [color] if hue is None and color is not None else sns.color_palette(
        n_colors=len(groups))
    lo, hi = f"{y}_min", f"{y}_max"
    for (name, part), c in zip(groups, colors, strict=True):
        sns.lineplot(data=part, x=x, y=y, marker="o", color=c, label=name, ax=ax,
                     errorbar=None)
        if lo in part and hi in part and (part[hi] > part[lo]).any():
            n = int(part["repeats"].max()) if "repeats" in part else 0
            ax.fill_between(part[x], part[lo], part[hi], color=c, alpha=0.2, lw=0,
                            label=f"{name}: range over {n} {repeats_word}" if n > 1 and name
                            else None)


def show_table(frame: Any, digits: int = 3, index: bool = False, text: bool = False,
               missing: str = "") -> None:
    """Display a DataFrame rounded for reading; ``text`` left-aligns every column; ``missing``
    is shown for empty cells (e.g. "no data" where a measurement is missing, never zero)."""
    from IPython.display import HTML, display

    shown = frame.round(digits) if hasattr(frame, "round") else frame
    classes = ["kv-table", "text"] if text else "kv-table"
    display(HTML(shown.to_html(index=index, border=0, classes=classes, na_rep=missing)))


def say(text: str) -> None:
    """Display generated Markdown (the notebook's interpretation of its results)."""
    from IPython.display import Markdown, display

    display(Markdown(text))
