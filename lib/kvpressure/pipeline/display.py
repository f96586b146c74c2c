"""How the notebooks show things: figures as PNG, tables, generated sentences.

Figures are rendered to PNG bytes here rather than left to the matplotlib backend, so they appear
the same in JupyterLab, under papermill and under nbval whatever ``MPLBACKEND`` says, and the
report can embed them as they are.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from kvpressure.pipeline.run_folder import has_stage

if TYPE_CHECKING:
    from kvpressure.pipeline.collect import Tables
    from kvpressure.pipeline.run_context import RunContext

FIGSIZE = (9.0, 4.2)
DPI = 100


def setup_plots() -> None:
    """Seaborn's theme, sized for a 1280 px wide report."""
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "kvpressure"
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook", rc={"figure.figsize": FIGSIZE})


def open_context(run_dir: Any = "", experiment: Any = "", source: Any = "",
                 banner: bool = True) -> RunContext:
    """The run a notebook reads (see :mod:`kvpressure.pipeline.run_context`), shown as a
    banner naming the run folder, the experiment or sources and when they were collected."""
    from kvpressure.pipeline.run_context import current_run

    ctx = current_run(experiment, source, run_dir)
    if banner:
        show_banner(ctx)
    return ctx


BANNER_METADATA = {"kvpressure": {"banner": True}}


def show_banner(ctx: RunContext, collecting: bool = False) -> None:
    """The run folder, the experiment or sources and when collected, on top of a notebook (the
    report names them once, in its own header, so it leaves these out)."""
    from IPython.display import Markdown, display

    from kvpressure.pipeline.run_context import banner_text

    display(Markdown(banner_text(ctx, collecting)), metadata=BANNER_METADATA)


def open_run(run_dir: Any = "", experiment: Any = "", source: Any = "") -> Tables:
    """What notebooks 02-06 open with: the plot theme, stage 01's results (running stage 01
    first when the run folder lacks them, so each notebook also runs on its own) and its tables.
    ``run_dir`` may be a :class:`RunContext`. A folder whose inputs changed since stage 01 read
    them is refused (InputError saying to rerun 01)."""
    from kvpressure.pipeline.collect import ensure_collected, load_tables
    from kvpressure.pipeline.run_context import RunContext, check_fresh, current_run

    ctx = run_dir if isinstance(run_dir, RunContext) else current_run(experiment, source, run_dir)
    setup_plots()
    check = has_stage(ctx.run_dir, "collect")
    ensure_collected(ctx.run_dir, ctx.experiment, ctx.source)
    if check:
        check_fresh(ctx.run_dir)
    return load_tables(ctx.run_dir)


def figure_png(fig: Any) -> bytes:
    """PNG bytes of a matplotlib figure, without the run-dependent metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def show_figure(fig: Any, alt: str = "") -> None:
    """Display ``fig`` as a PNG and close it (so no backend shows it a second time). ``alt``
    says what the figure shows; it is the output's text form, which the report uses as the
    image's alt text (a figure's title when not given)."""
    import base64

    import matplotlib.pyplot as plt
    from IPython.display import display

    if not alt:
        titles = [a.get_title() for a in fig.axes if a.get_title()]
        alt = "; ".join(titles) or "figure"
    png = figure_png(fig)
    plt.close(fig)
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt}, raw=True)


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


def progress_bar(total: int | None = None, desc: str = "") -> Any:
    """A tqdm bar: the notebook widget in Jupyter, text in a terminal. In batch (the kernels of
    ``kvpressure report``) plain lines on stderr instead, which the command copies to its
    terminal; a widget would only leave markup in the executed notebook."""
    from kvpressure.pipeline.run_context import BATCH_ENV

    if os.environ.get(BATCH_ENV):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, disable=True)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


class LineProgress:
    """Progress lines ``[done/total] text`` (the sweep's) shown as one bar."""

    _LINE = r"^\[(\d+)/(\d+)\]\s*(.*)$"

    def __init__(self, desc: str = "") -> None:
        from kvpressure.pipeline.run_context import BATCH_ENV

        self.desc = desc
        self.bar: Any = None
        self.batch = bool(os.environ.get(BATCH_ENV))

    def __call__(self, line: str) -> None:
        import re
        import sys

        if self.batch:
            print(line, file=sys.stderr, flush=True)
            return
        m = re.match(self._LINE, line)
        if m is None:
            return
        done, total, text = int(m.group(1)), int(m.group(2)), m.group(3)
        if self.bar is None:
            self.bar = progress_bar(total, self.desc)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(text[:60], refresh=True)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
