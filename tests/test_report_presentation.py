"""How the report and the notebooks word and show things, on hand-made inputs."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pandas as pd

from kvpressure.notebooks.batch import TerminalProgress
from kvpressure.report.display import readable
from kvpressure.report.sentences import knee_sentence, symptom_sentence


def test_tables_get_units_milliseconds_and_whole_counts():
    frame = pd.DataFrame({"concurrency": [16], "itl_p95_s": [0.0321], "preemptions": [620.333],
                          "ttft_p95_s": [368.2], "custom": [1.5]})
    out = readable(frame)
    assert list(out.columns) == ["concurrency (clients)", "ITL p95 (ms)", "preemptions",
                                 "TTFT p95 (s)", "custom"]
    assert abs(out["ITL p95 (ms)"].iloc[0] - 32.1) < 1e-9
    assert out["preemptions"].iloc[0] == 620 and str(out["preemptions"].dtype) == "Int64"
    assert frame["itl_p95_s"].iloc[0] == 0.0321  # the caller's frame is left alone


def test_symptom_rows_in_words():
    row = {"id": "running_below_max_num_seqs", "verdict": "present",
           "evidence": {"frac_silent": 1.0, "mean_running": 46.2, "max_running": 53}}
    assert symptom_sentence(row, 256) == ("requests waited for KV space 100% of the time while "
                                          "46 of 256 allowed sequences ran (at most 53)")
    missing = {"id": "kv_usage_near_full", "verdict": "no data",
               "evidence": {"missing": "no engine metrics"}}
    assert symptom_sentence(missing) == "no data: no engine metrics"


def _knee(knee_x, peak_x, peak_y, decline_pct, declines):
    return SimpleNamespace(knee_x=knee_x, peak_x=peak_x, peak_y=peak_y,
                           decline_pct=decline_pct, declines=declines)


def test_knee_and_peak_name_the_operating_limit():
    text = knee_sentence(_knee(16, 40, 2210.0, 41.0, True), 96)
    assert "growth slows from concurrency **16**" in text
    assert "peaks at **2,210 tok/s** at concurrency **40**, then falls 41% by 96" in text
    assert "The operating limit is concurrency 40**" in text
    flat = knee_sentence(_knee(16, 24, 500.0, 0.2, False), 48)
    assert "then stays flat" in flat and "The operating limit is concurrency 16**" in flat
    rising = knee_sentence(_knee(None, 48, 500.0, 0.0, False), 48)
    assert "still rising" in rising


def test_terminal_bar_counts_notebooks_and_shows_the_sweep():
    out = io.StringIO()
    bar = TerminalProgress(3, file=out)
    bar("[1/2] 01_collect ...")
    bar.write("[3/36] baseline concurrency 16 (seed 7): 180 output tok/s\n[4/")
    assert bar.bar.n == 0 and "180 output tok/s" in str(bar.bar.postfix)
    bar("[1/2] 01_collect done in 6.3 s")
    bar("[2/2] 02_recompute ...")
    bar("[2/2] 02_recompute done in 2.0 s")
    assert bar.bar.n == 2
    bar("index.html ...")
    bar("done in 9.0 s: /tmp/x/index.html")
    assert bar.bar.n == 3
