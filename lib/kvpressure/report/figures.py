"""The report's figures that the notebooks draw from a stage's frames, and the checks every
figure passes before it reaches the page (:func:`layout_problems`): no legend over another
plot or off the canvas, time axes readable (seconds from a start or wall-clock time, never raw
epoch seconds with an offset), no marker clipped at the axes' edge, titles whole.
"""

from __future__ import annotations

from typing import Any

from kvpressure.report.display import legend_outside, plot_band
from kvpressure.report.sentences import level_words, num
from kvpressure.stages.results import ThroughputKnee

# Readable names for the latency lines of the curve's table.
LATENCY_LABELS = {"itl_mean_s": "ITL mean", "itl_p95_s": "ITL p95", "ttft_p95_s": "TTFT p95"}


def knee_figure(points: Any, knee: ThroughputKnee, repeats: int, repeats_word: str,
                x: str = "concurrency") -> Any:
    """Throughput against concurrency with the knee, the peak, the sustained range (when it
    spans more than the peak), where the curve turns down and how far it falls."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    words = level_words(x)
    plot_band(ax, points, x=x, label="output throughput", color="tab:blue",
              repeats_word=repeats_word)
    if knee.knee_x is not None:
        ax.axvline(knee.knee_x, color="tab:orange", ls="--",
                   label=f"knee ({num(knee.knee_x)})")
    ax.plot([knee.peak_x], [knee.peak_y], "*", ms=16, color="tab:red", clip_on=False,
            label=f"peak ({num(knee.peak_y)} tok/s)")
    lo, hi = knee.plateau
    if hi > lo:
        ax.axvspan(lo, hi, color="tab:orange", alpha=0.08,
                   label=f"plateau ({num(lo)}–{num(hi)})")
    if knee.decline_onset is not None:
        ax.axvline(knee.decline_onset, color="tab:red", ls=":",
                   label=f"decline from {num(knee.decline_onset)}")
    if knee.declines:
        end = points["output_throughput"].iloc[-1]
        ax.annotate(f"-{knee.decline_pct:.0f}%", (points[x].iloc[-1], end),
                    textcoords="offset points", xytext=(-10, 12), ha="right", color="tab:red")
    top = max(float(points.get("output_throughput_max", points["output_throughput"]).max()),
              float(knee.peak_y))
    ax.set(xlabel=words.label, ylabel="output tokens/s", ylim=(0, top * 1.12),
           title=f"Throughput vs {words.singular}"
           + (f" (mean of {repeats} {repeats_word})" if repeats > 1 else ""))
    legend_outside(ax)
    return fig


def two_runs_figure(result: dict[str, Any]) -> Any:
    """``kvpressure compare``: both folders' throughput curves with their knees, and their
    preemptions, against concurrency."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"A": "tab:blue", "B": "tab:orange"}
    names = {"A": result["a"], "B": result["b"]}
    for v in result["knees"]["variants"]:
        xs = [p["x"] for p in v["points"]]
        left.plot(xs, [p["y"] for p in v["points"]], "o-", color=colours[v["variant"]],
                  label=f"{v['variant']}: {names[v['variant']]}")
        if v["knee_x"] is not None:
            left.axvline(v["knee_x"], color=colours[v["variant"]], ls="--", lw=1,
                         label=f"knee {v['variant']} ({num(v['knee_x'])})")
    for k, name in enumerate(("A", "B")):
        pts = [(r["concurrency"], r["preemptions"][k]) for r in result["levels"]
               if r["preemptions"][k] is not None]
        if pts:
            right.plot(*zip(*pts, strict=True), "o-", color=colours[name], label=name)
    left.set(xlabel="concurrency (clients)", ylabel="output tokens/s", ylim=(0, None),
             title="Throughput")
    right.set(xlabel="concurrency (clients)", ylabel="preemptions", ylim=(0, None),
              title="Preemptions per level")
    legend_outside(left)
    fig.tight_layout()
    return fig


def latency_levels_figure(points: Any, x: str = "concurrency") -> Any:
    """Inter-token latency (mean and p95) and TTFT p95 by level, each panel with its own
    legend inside it."""
    import matplotlib.pyplot as plt

    label = level_words(x).label
    fig, (itl_ax, ttft_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for col, color in (("itl_mean_s", "tab:blue"), ("itl_p95_s", "tab:orange")):
        if col in points and points[col].notna().any():
            itl_ax.plot(points[x], points[col] * 1000.0, marker="o", color=color,
                        label=LATENCY_LABELS[col])
    itl_ax.set(title="Inter-token latency", xlabel=label, ylabel="ms")
    if itl_ax.get_legend_handles_labels()[0]:
        itl_ax.legend(loc="best", frameon=True)
    if "ttft_p95_s" in points and points["ttft_p95_s"].notna().any():
        ttft_ax.plot(points[x], points["ttft_p95_s"], marker="o", color="tab:green")
    ttft_ax.set(title="Time to first token, p95", xlabel=label, ylabel="seconds")
    return fig


def _bbox(artist: Any, renderer: Any) -> Any:
    return artist.get_window_extent(renderer)


def layout_problems(fig: Any) -> list[str]:
    """What a reader would find wrong with ``fig`` as drawn (empty when nothing): a legend over
    another plot or outside the canvas, a time axis in raw epoch seconds (an offset such as
    ``+1.7961554e9``), a title wider than the figure, tick labels that overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    problems = []
    axes = [a for a in fig.axes if a.get_visible()]
    for ax in axes:
        name = ax.get_title() or ax.get_title(loc="left") or ax.get_ylabel() or "an axes"
        legend = ax.get_legend()
        if legend is not None:
            box = _bbox(legend, renderer)
            for other in axes:
                if other is not ax and box.overlaps(other.get_window_extent(renderer)):
                    problems.append(f"{name}: its legend lies over another plot")
        for title in (ax.title, ax._left_title, ax._right_title):
            if title.get_text() and _bbox(title, renderer).width > canvas.width:
                problems.append(f"{name}: title wider than the figure")
        if "time" in ax.get_xlabel().lower():
            offset = ax.xaxis.get_offset_text().get_text()
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            if offset or any(abs(t) > 1e6 for t in ticks):
                problems.append(f"{name}: time axis in raw epoch seconds ({offset or ticks[0]})")
        labels = [t for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
                  if t.get_text() and t.get_visible()]
        labels.sort(key=lambda t: _bbox(t, renderer).x0)
        boxes = [_bbox(t, renderer) for t in labels]
        for a, b in zip(boxes, boxes[1:], strict=False):
            if a.overlaps(b):
                problems.append(f"{name}: x tick labels overlap")
                break
    for text in fig.texts:
        if text.get_text() and _bbox(text, renderer).width > canvas.width:
            problems.append(f"figure title wider than the figure: {text.get_text()[:40]}…")
    return problems
