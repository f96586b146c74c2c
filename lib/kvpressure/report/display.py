"""How the notebooks show things: figures as PNG, tables, generated sentences.

Figures are rendered to PNG bytes here rather than left to the matplotlib backend, so they appear
the same in JupyterLab, under papermill and under nbval whatever ``MPLBACKEND`` says, and the
report can embed them as they are.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvpressure.stages.results import Window

if TYPE_CHECKING:
    from kvpressure.folders.run_context import RunContext

FIGSIZE = (9.0, 4.2)
DPI = 100


def _show_input_error(shell: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> Any:
    """A bad parameter or input in a notebook: its message, not a 40-line traceback (the
    message names the file, line or parameter; the traceback adds nothing a user can act on).
    It is still the cell's error output, so papermill and nbval see the failed cell and its
    InputError."""
    shell.showtraceback((etype, value, tb), exception_only=True)


def _quiet_input_errors() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        from kvpressure.errors import InputError

        shell.set_custom_exc((InputError,), _show_input_error)


_quiet_input_errors()


def setup_plots() -> None:
    """Seaborn's theme, sized for a 1280 px wide report."""
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "kvpressure"
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook", rc={"figure.figsize": FIGSIZE})


def open_context(run_dir: Any = "", experiment: Any = "", source: Any = "",
                 banner: bool = True) -> RunContext:
    """The run a notebook reads (see :mod:`kvpressure.folders.run_context`), shown as a
    banner naming the run folder, the experiment or sources and when they were collected."""
    from kvpressure.folders.run_context import current_run

    ctx = current_run(experiment, source, run_dir)
    if banner:
        show_banner(ctx)
    return ctx


BANNER_METADATA = {"kvpressure": {"banner": True}}


def show_banner(ctx: RunContext, collecting: bool = False) -> None:
    """The run folder, the experiment or sources and when collected, on top of a notebook (the
    report names them once, in its own header, so it leaves these out)."""
    from IPython.display import Markdown, display

    from kvpressure.folders.run_context import banner_text

    display(Markdown(banner_text(ctx, collecting)), metadata=BANNER_METADATA)


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
    :func:`kvpressure.analysis.levels.level_means` gives it), with the spread between repeats
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


# Column names as a reader sees them, with units; ITL columns are shown in milliseconds.
COLUMN_NAMES = {
    "variant": "variant", "concurrency": "concurrency (clients)",
    "request_rate": "request rate (req/s)",
    "output_throughput": "output throughput (tok/s)", "request_throughput": "requests/s",
    "total_token_throughput": "total throughput (tok/s)",
    "ttft_mean_s": "TTFT mean (s)", "ttft_p95_s": "TTFT p95 (s)", "e2e_mean_s": "E2E mean (s)",
    "itl_mean_s": "ITL mean (ms)", "itl_p95_s": "ITL p95 (ms)", "itl_p99_s": "ITL p99 (ms)",
    "preemptions": "preemptions", "recomputed_tokens": "recomputed tokens",
    "recompute_ratio": "recompute ratio", "mean_running": "running (mean)",
    "max_running": "running (max)", "mean_kv_usage": "KV usage (mean)",
    "mean_waiting": "waiting (mean)", "repeats": "runs averaged", "num_requests": "requests",
    "t0": "from (s)", "t1": "to (s)", "gauge_t0": "steady from (s)", "gauge_t1": "steady to (s)",
    "recompute_ratio_low": "recompute ratio, low end", "recompute_ratio_high":
    "recompute ratio, high end", "seed": "seed",
}
MS_COLUMNS = frozenset({"itl_mean_s", "itl_p95_s", "itl_p99_s"})
# Counts: whole numbers even when averaged over seeds (620.333 preemptions reads as noise).
COUNT_COLUMNS = frozenset({"preemptions", "recomputed_tokens", "max_running", "num_requests",
                           "requests_preempted", "requests", "count", "repeats", "steps",
                           "preemptions measured"})
# Measurements whose value depends on the window they are read over: the table names it.
WINDOWED_COLUMNS = frozenset({"preemptions", "recomputed_tokens", "recompute_ratio",
                              "recompute_ratio_low", "recompute_ratio_high"})


def readable(frame: Any, window: str = "") -> Any:
    """``frame`` with human column names and units, ITL in ms, counts and whole-number levels
    as integers; ``window`` (e.g. "whole runs, mean of 3 seeds") is added to the names of the
    columns whose value depends on the window they were counted over."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        return frame
    out = frame.copy()
    for col in out.columns:
        if col == "variant":
            continue
        values = pd.to_numeric(out[col], errors="coerce")
        if col in MS_COLUMNS:
            out[col] = values * 1000.0
        elif col in COUNT_COLUMNS or (col == "concurrency" and values.notna().all()
                                      and (values % 1 == 0).all()):
            out[col] = values.round().astype("Int64")
    names = {c: COLUMN_NAMES.get(c, c) + (f" ({window})" if window and c in WINDOWED_COLUMNS
                                          else "")
             for c in out.columns if c in COLUMN_NAMES or (window and c in WINDOWED_COLUMNS)}
    return out.rename(columns=names)


def show_table(frame: Any, digits: int = 3, index: bool = False, text: bool = False,
               missing: str = "", window: str = "") -> None:
    """Display a DataFrame rounded for reading, with human column names (``readable``), counts
    with thousands separators; ``text`` left-aligns every column; ``missing`` is shown for
    empty cells (e.g. "no data" where a measurement is missing, never zero); ``window`` names
    the window of the counted columns."""
    import pandas as pd
    from IPython.display import HTML, display

    shown = readable(frame, window)
    shown = shown.round(digits) if hasattr(shown, "round") else shown
    classes = ["kv-table", "text"] if text else "kv-table"
    formatters = {}
    if isinstance(shown, pd.DataFrame):
        for col in shown.columns:
            if str(shown[col].dtype) == "Int64":
                formatters[col] = lambda v: missing if pd.isna(v) else f"{int(v):,}"
    display(HTML(shown.to_html(index=index, border=0, classes=classes, na_rep=missing,
                               formatters=formatters or None)))


def say(text: str) -> None:
    """Display generated Markdown (the notebook's interpretation of its results)."""
    from IPython.display import Markdown, display

    display(Markdown(text))


def progress_bar(total: int | None = None, desc: str = "") -> Any:
    """A tqdm bar: the notebook widget in Jupyter, text in a terminal. In batch (the kernels of
    ``kvpressure report``) plain lines on stderr instead, which the command copies to its
    terminal; a widget would only leave markup in the executed notebook."""
    from kvpressure.folders.run_context import BATCH_ENV

    if os.environ.get(BATCH_ENV):
        return _StderrBar(total, desc)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def point_progress(desc: str) -> Callable[[int, int], None]:
    """``progress(done, total)`` for a sweep's points: a bar, moved at every point and named
    at every tenth of the way (in batch, ten lines rather than one a point)."""
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(total, desc)
        bar.update(1)
        if done % max(1, total // 10) == 0 or done == total:
            bar.set_postfix_str("every remedy at every level and seed")
        if done == total:
            bar.close()

    return update


class _StderrBar:
    """A bar for batch kernels: each step a line ``[n/total] desc: what`` on stderr, which
    ``kvpressure report`` shows as its bar's postfix (a widget would only leave markup)."""

    def __init__(self, total: int | None, desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        import sys

        of = f"/{self.total}" if self.total else ""
        print(f"[{self.n}{of}] {self.desc}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class LineProgress:
    """Progress lines ``[done/total] text`` (the sweep's) shown as one bar."""

    _LINE = r"^\[(\d+)/(\d+)\]\s*(.*)$"

    def __init__(self, desc: str = "") -> None:
        from kvpressure.folders.run_context import BATCH_ENV

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


def legend_outside(ax: Any) -> None:
    """The legend right of the plot, where it covers no data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def time_series_panel(timeline: Any, preemptions: Any, window: Window,
                      max_num_seqs: Any = None) -> Any:
    """Running, waiting by reason, KV usage and preemptions on one shared time axis (the
    Grafana view of a vLLM server), with the level's window and its steady part marked."""
    import matplotlib.pyplot as plt

    from kvpressure.report.sentences import EPOCH_S, clock

    t0, t1 = window.window
    g0, g1 = window.gauge_window
    # Ingested data keeps the server's epoch clock: seconds from the level's start read better
    # than "+1.7961554e9", and the wall clock of that start is in the axis label.
    times = timeline["t"] if len(timeline) else []
    origin = 0.0
    xlabel = "time (s)"
    if len(times) and float(min(times)) > EPOCH_S:
        origin = float(t0) if t0 is not None else float(min(times))
        xlabel = f"time (s from {clock(origin)})"
        timeline = timeline.assign(t=timeline["t"] - origin)
        if preemptions is not None and len(preemptions):
            preemptions = preemptions.assign(t=preemptions["t"] - origin)

    def shift(a: float | None) -> float | None:
        return None if a is None else a - origin

    t0, t1, g0, g1 = shift(t0), shift(t1), shift(g0), shift(g1)
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(FIGSIZE[0], 7.6),
                             gridspec_kw={"height_ratios": [1.2, 1.2, 1.0, 0.8]})
    run_ax, wait_ax, kv_ax, pre_ax = axes

    def line(ax: Any, metric: str, label: str, color: str) -> None:
        part = timeline[timeline["metric"] == metric]
        if len(part):
            ax.step(part["t"], part["value"], where="post", label=label, color=color, lw=1.4)

    line(run_ax, "running", "running", "tab:blue")
    if max_num_seqs:
        top = max(float(timeline.loc[timeline["metric"] == "running", "value"].max() or 0), 1.0)
        if max_num_seqs <= 3 * top:
            run_ax.axhline(max_num_seqs, color="0.3", ls="--", lw=1, label="max_num_seqs")
        else:  # keep the running count readable; the legend says where the setting is
            run_ax.plot([], [], ls="none", label=f"max_num_seqs {max_num_seqs} (off the chart)")
    run_ax.set_title("Running, waiting, KV usage and preemptions over time"
                     + (f" (concurrency {window.concurrency})" if window.concurrency
                        else ""), loc="left")
    run_ax.set(ylabel="sequences")
    line(wait_ax, "waiting: capacity", "waiting for KV space (capacity)", "tab:red")
    line(wait_ax, "waiting: deferred", "waiting, deferred", "tab:orange")
    if not len(timeline[timeline["metric"].isin(["waiting: capacity", "waiting: deferred"])]):
        line(wait_ax, "waiting", "waiting", "tab:red")
    wait_ax.set(ylabel="requests")
    line(kv_ax, "kv_cache_usage_perc", "KV cache usage", "tab:purple")
    kv_ax.axhline(0.95, color="0.3", ls=":", lw=1, label="near full (95%)")
    kv_ax.set(ylabel="KV usage", ylim=(0, 1.05))
    if preemptions is not None and len(preemptions):
        width = float(preemptions["t"].diff().median() or 1.0) * 0.9
        pre_ax.bar(preemptions["t"], preemptions["preemptions"], width=width, color="tab:brown",
                   label="preemptions per scrape interval")
    pre_ax.set(ylabel="preemptions", xlabel=xlabel)
    for ax in axes:
        if t0 is not None and t1 is not None:
            ax.axvspan(t0, t1, color="0.93", zorder=0,
                       label="the level's window" if ax is run_ax else None)
        if g0 is not None and g1 is not None and (g0, g1) != (t0, t1):
            ax.axvspan(g0, g1, color="tab:green", alpha=0.06, zorder=0,
                       label="steady part (gauges)" if ax is run_ax else None)
        legend_outside(ax)
    fig.align_ylabels(axes)
    return fig
