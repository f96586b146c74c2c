"""The report's figures as a reader sees them (``report.figures.layout_problems``): legends
over no other plot, time axes in seconds from a start or wall-clock time, titles whole. The
check itself is held to figures drawn wrong on purpose, so it can fail."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kvpressure.investigation.latency import latency_figure  # noqa: E402
from kvpressure.paths import REPO_ROOT  # noqa: E402
from kvpressure.report.display import legend_outside, setup_plots, time_series_panel  # noqa: E402
from kvpressure.report.figures import (  # noqa: E402
    knee_figure,
    latency_levels_figure,
    layout_problems,
)
from kvpressure.stages.results import ThroughputKnee  # noqa: E402

FALL = REPO_ROOT / "tests" / "data" / "twin_real_fall"


@pytest.fixture(autouse=True)
def _theme():
    setup_plots()
    yield
    plt.close("all")


def test_the_check_finds_what_the_old_figures_did_wrong():
    # a legend placed right of the first of two panels lies over the second ("itl_" cut)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    axes[0].plot([1, 2], [1, 2], label="itl_mean_s")
    axes[0].plot([1, 2], [2, 1], label="itl_p95_s")
    axes[1].plot([1, 2], [1, 2])
    legend_outside(axes[0])
    assert any("legend lies over another plot" in p for p in layout_problems(fig))
    # epoch seconds on a time axis come out as an offset ("+1.7961554e9")
    fig, ax = plt.subplots()
    ax.plot([1796155440.0, 1796155450.0, 1796155460.0], [1, 2, 3])
    ax.set(xlabel="time (s)")
    assert any("raw epoch seconds" in p for p in layout_problems(fig))


CURVE = pd.DataFrame({
    "concurrency": [8, 16, 24, 32, 40, 42, 44, 46, 48, 64],
    "output_throughput": [221.0, 297.8, 338.1, 363.3, 381.3, 350.0, 265.0, 220.0, 201.8, 201.8],
    "output_throughput_min": [218, 290, 330, 355, 370, 330, 240, 205, 200, 200],
    "output_throughput_max": [224, 305, 346, 371, 400, 370, 290, 235, 204, 204],
    "repeats": [3] * 10,
    "itl_mean_s": [0.034, 0.049, 0.063, 0.076, 0.088, 0.1, 0.15, 0.18, 0.195, 0.195],
    "itl_p95_s": [0.025, 0.27, 0.29, 0.29, 0.30, 0.30, 0.31, 0.31, 0.311, 0.311],
    "ttft_p95_s": [5.9, 29.3, 50.5, 73.4, 97.2, 99.0, 107.0, 113.0, 124.1, 396.3],
})
# The parts of a knee the figure draws (model_construct: the rest is not drawn).
KNEE = ThroughputKnee.model_construct(knee_x=16.0, peak_x=40.0, peak_y=400.0,
                                      plateau=(40.0, 40.0), decline_onset=42.0, declines=True,
                                      decline_pct=47.1)


def test_the_curve_figures_pass():
    fig = knee_figure(CURVE, KNEE, 3, "seeds")
    assert layout_problems(fig) == []
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert not any(label.startswith("plateau") for label in labels)  # no plateau drawn
    assert fig.axes[0].get_ylim()[1] > KNEE.peak_y * 1.05  # the peak's star is not clipped
    assert layout_problems(latency_levels_figure(CURVE)) == []


def test_the_per_request_cdfs_pass():
    reqs = pd.DataFrame({"concurrency": [2] * 5 + [8] * 5,
                         "ttft_s": [0.1, 0.2, 0.3, 0.2, 0.1, 1.0, 2.0, 1.5, 0.9, 1.2],
                         "tpot_s": [0.01] * 5 + [0.02] * 5,
                         "e2e_s": [2.0] * 5 + [3.0, 3.1, 3.2, 3.3, 3.4]})
    assert layout_problems(latency_figure(reqs, 10.0, 0.1)) == []


def test_real_datas_time_panel_counts_seconds_from_the_level_start(tmp_path):
    from kvpressure.investigation.collect import collect, load_tables
    from kvpressure.investigation.stages import recompute_stage

    collect(tmp_path / "run", source=[str(FALL / "bench"), str(FALL / "metrics.prom.jsonl.gz")])
    stage = recompute_stage(load_tables(tmp_path / "run"))
    fig = time_series_panel(stage.frames["timeline"], stage.frames["preemptions"],
                            stage.result.window, 64)
    assert layout_problems(fig) == []
    label = fig.axes[-1].get_xlabel()
    assert label.startswith("time (s from ") and label.endswith("UTC)")
    lo, hi = fig.axes[-1].get_xlim()
    assert -60 < lo < hi < 600


def test_log_axes_of_a_short_decade_have_no_overlapping_labels():
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0.6, 4.0], [0, 1])
    ax.set_xscale("log")
    ax.set_xlim(0.6, 4.0)
    assert any("tick labels overlap" in p for p in layout_problems(fig))
    # the same range in the per-request CDFs (E2E 0.6-4 s, as on the real falling sweep)
    reqs = pd.DataFrame({"concurrency": [2] * 4 + [16] * 4, "ttft_s": [0.1] * 8,
                         "tpot_s": [0.01] * 8,
                         "e2e_s": [0.6, 0.8, 0.9, 1.0, 3.0, 3.5, 3.8, 4.0]})
    assert layout_problems(latency_figure(reqs, 10.0, 0.1)) == []
