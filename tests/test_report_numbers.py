"""Each number the report prints, right or marked missing: the defects a reader found on the
seed case and on real CPU vLLM data, one test each (every one fails on the code before the fix).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis.knee import same_schedule_from
from kvpressure.analysis.recommendation import recommend
from kvpressure.analysis.remedies import given_remedies
from kvpressure.investigation.latency import goodput, request_tpot, within_limits
from kvpressure.notebooks.batch import TerminalProgress
from kvpressure.paths import REPO_ROOT
from kvpressure.report.display import readable
from kvpressure.report.sentences import (
    knee_sentence,
    recompute_ratio_text,
    same_schedule_sentence,
    span_text,
    symptom_sentence,
)

FALL = REPO_ROOT / "tests" / "data" / "twin_real_fall"


# --------------------------------------------------------------------------- TPOT and goodput
def test_tpot_from_e2e_ttft_and_output_length_matches_vllm_bench_serve():
    """A --save-result-shaped result keeps no token gaps; TPOT as vLLM defines it comes from
    E2E, TTFT and the output length, and its mean is the result's own mean_tpot_ms."""
    res = json.loads((FALL / "bench" / "c8.json").read_text())
    assert "itls" not in res
    tpots = [request_tpot(t, e, n) for t, e, n in
             zip(res["ttfts"], res["latencies"], res["output_lens"], strict=True)]
    assert np.isfinite(tpots).all()
    assert np.mean(tpots) * 1000 == pytest.approx(res["mean_tpot_ms"], rel=1e-9)
    assert request_tpot(0.1, 2.1, 101) == pytest.approx(0.02)
    assert np.isnan(request_tpot(0.1, 0.1, 1))  # no token after the first: no TPOT


def test_goodput_never_counts_an_unknown_tpot_as_failing():
    reqs = pd.DataFrame({"concurrency": [2, 2, 2, 4, 4],
                         "ttft_s": [0.1, 0.2, 20.0, 0.1, 0.1],
                         "tpot_s": [0.01, np.nan, 0.01, np.nan, np.nan]})
    # the one-token request is judged on its TTFT alone (vllm bench serve --goodput)
    assert within_limits(reqs[reqs.concurrency == 2], 10.0, 0.1) == pytest.approx(2 / 3)
    # a level whose TPOT is unknown throughout is not measured, not 0% within limits
    assert np.isnan(within_limits(reqs[reqs.concurrency == 4], 10.0, 0.1))
    runs = pd.DataFrame({"concurrency": [2, 4], "request_throughput": [1.5, 2.0]})
    gp = goodput(reqs, runs, 10.0, 0.1).set_index("concurrency")
    assert gp.loc[2, "goodput (requests/s)"] == pytest.approx(1.0)
    assert np.isnan(gp.loc[4, "goodput (requests/s)"])


# --------------------------------------------------------------------------- recompute
def test_an_estimated_recompute_ratio_is_stated_as_its_range():
    assert recompute_ratio_text(0.898, 0.083, 0.898, exact=False) == (
        "between 8.3% and 89.8% (estimated from counters)")
    assert recompute_ratio_text(0.639, 0.639, 0.639, exact=True) == "63.9%"
    sym = {"id": "preemption_recompute", "verdict": "present",
           "evidence": {"preemptions": 275.0, "recompute_ratio": 0.898, "ratio_low": 0.083,
                        "ratio_high": 0.898, "recomputed_tokens": 74852.0}}
    text = symptom_sentence(sym)
    assert "an estimated 8% to 90%" in text and "74,852" not in text
    assert not text.startswith("275.0")


# --------------------------------------------------------------------------- remedies
def test_the_experiments_own_remedy_values_are_the_ones_simulated():
    from kvpressure.investigation.verdict import _experiment_remedies

    chosen = _experiment_remedies(REPO_ROOT / "data" / "experiments" / "seed_case.yaml")
    assert chosen["watermark"] == {"watermark": 0.05}
    assert chosen["lower_max_model_len"] == {"max_model_len": 24576}
    assert chosen["raise_gpu_memory_utilization"] == {"gpu_memory_utilization": 0.95}
    assert chosen["scheduler_reserve_full_isl"] == {"scheduler_reserve_full_isl": True}
    # a second value of one setting keeps its own label, after the first
    two = given_remedies({"watermark=0.05": {"watermark": 0.05},
                          "watermark=0.1": {"watermark": 0.1}})
    assert two == {"watermark": {"watermark": 0.05}, "watermark=0.1": {"watermark": 0.1}}


def _outcome(name, overrides, gain, op_gain, peak_pct, new_peak_x, new_declines):
    return {"remedy": name, "overrides": overrides, "applicable": True,
            "gain": {"throughput_at_target_pct": gain, "operating_concurrency": 40.0,
                     "throughput_at_operating_pct": op_gain, "peak_pct": peak_pct,
                     "ttft_p95_at_operating_pct": -5.0, "itl_p95_at_operating_pct": 1.0,
                     "new_peak_x": new_peak_x, "new_knee_x": 32.0, "new_sustained_end": 64.0,
                     "new_declines": new_declines},
            "cost": {"ttft_p95_change_pct": -44.0, "itl_p95_change_pct": -3.0}}


def test_the_recommendation_names_the_gain_at_the_operating_point_and_the_peak():
    report = {"target_concurrency": 64.0, "baseline": {"ttft_p95_s": 300.0, "itl_p95_s": 0.3},
              "outcomes": [
                  _outcome("scheduler_reserve_full_isl", {"scheduler_reserve_full_isl": True},
                           88.0, 0.4, 0.0, 40.0, False),
                  {"remedy": "lower_max_model_len", "overrides": {"max_model_len": 24576},
                   "applicable": False, "reason": "would refuse the longest sequence"}]}
    rec = recommend(report, {"scheduler_reserve_full_isl": False},
                    {"scheduler_reserve_full_isl": [84.0, 93.0, 88.0]},
                    operating_seed_gains={"scheduler_reserve_full_isl": [-1.0, 1.5, 0.2]})
    text = rec["text"]
    assert "+88% output throughput at concurrency 64 (+84% to +93% over 3 seeds)" in text
    # at today's operating limit the seeds' spread holds zero: no signed gain is claimed
    assert "At today's operating limit, no measurable effect on output throughput at " \
           "concurrency 40" in text
    assert "the peak throughput is unchanged" in text
    assert "run at 32 clients or more" in text
    assert rec["not_run"][0]["why"] == "would refuse the longest sequence"


# --------------------------------------------------------------------------- the curve
def test_levels_that_ran_the_same_schedule_are_named_not_read_as_a_trend():
    curve = pd.DataFrame({"concurrency": [8, 40, 48, 64, 96],
                          "output_throughput": [218.0, 369.0, 200.5, 200.5, 200.5],
                          "preemptions": [0, 0, 569, 569, 569],
                          "itl_p95_s": [0.02, 0.3, 0.31, 0.31, 0.31],
                          "ttft_p95_s": [5.0, 94.0, 122.0, 339.0, 646.0]})
    assert same_schedule_from(curve) == 48.0
    measured = curve.assign(output_throughput=[218.0, 369.0, 200.5, 200.4, 200.5])
    assert same_schedule_from(measured) is None
    knee = SimpleNamespace(knee_x=16, peak_x=40, peak_y=381.0, decline_pct=47.0, declines=True,
                           same_schedule_from=48.0)
    assert "then falls 47% at 48 and stays there up to 96" in knee_sentence(knee, 96)
    assert "Levels 48, 64 and 96 give the same schedule" in same_schedule_sentence(
        [8, 40, 48, 64, 96], 48.0)


def test_a_range_past_the_largest_level_reads_past_it():
    from kvpressure.investigation.stages import shift_table, variant_table
    from kvpressure.stages.results import ComparisonResult, CurvePoint, KneeShift, VariantKnee

    points = [CurvePoint(x=float(x), y=1.0, n=3, sd=0.1) for x in (8, 16, 32, 64, 96)]
    variant = VariantKnee(
        variant="max_num_seqs=40", settings={"max_num_seqs": 40}, knee_x=40.0, peak_x=64.0,
        peak_y=381.3, declines=False, decline_pct=0.0, knee_range=(24.0, 40.0), levels=5,
        points=points, sustained_end=96.0, decline_onset=None, sustained_range=(64.0, 128.0),
        repeats=3, noise_sd=14.4, noise_source="spread of repeated measurements")
    shift = KneeShift(
        variant="max_num_seqs=40", value=40, baseline_value=256, change="lower", knee_x=40.0,
        baseline_knee_x=16.0, shift=24.0, knee_beyond_noise=False, sustained_end=96.0,
        baseline_sustained_end=8.0, decline_onset=None, baseline_decline_onset=16.0,
        sustained_shift=88.0, sustained_beyond_noise=True, moves_right=True,
        moved_right_by=["sustained range"], beyond_noise=True, peak_gain_pct=0.0)
    result = ComparisonResult(available=True, parameter="max_num_seqs", summary="s",
                              variants=[variant], shifts=[shift])
    row = variant_table(result).iloc[0]
    assert row["holds-to range"] == "64 to past 96" and row["knee (clients)"] == "40"
    assert "knee_x" not in variant_table(result).columns
    shifts = shift_table(result)
    assert "peak_gain_pct" not in shifts.columns and shifts.iloc[0]["either beyond noise"] == "yes"


def test_counts_and_levels_are_integers_and_counted_columns_name_their_window():
    frame = pd.DataFrame({"concurrency": [2.0, 16.0], "preemptions": [620.333, 5339487.0],
                          "recompute_ratio_low": [0.1, 0.2]})
    shown = readable(frame, window="whole runs, mean of 3 seeds")
    assert list(shown.iloc[:, 0]) == [2, 16] and str(shown.iloc[:, 0].dtype) == "Int64"
    assert list(shown.columns) == [
        "concurrency (clients)", "preemptions (whole runs, mean of 3 seeds)",
        "recompute ratio, low end (whole runs, mean of 3 seeds)"]
    assert shown.iloc[0, 1] == 620


def test_epoch_windows_read_as_wall_clock():
    assert span_text(30.0, 840.0) == "30–840 s"
    assert span_text(1796155440.09, 1796155457.77) == "20:04:00–20:04:17 UTC, 18 s"


# --------------------------------------------------------------------------- the terminal
def test_terminal_bar_is_labelled_and_forgets_the_last_stages_line():
    out = io.StringIO()
    bar = TerminalProgress(7, file=out)
    assert "starting" in bar.bar.desc
    bar("[1/6] 01_collect ...")
    bar.write("[9/48] baseline concurrency 16 (seed 7): 180 output tok/s\n")
    bar("[1/6] 01_collect done in 6.3 s")
    bar("[2/6] 02_recompute ...")
    assert "180 output tok/s" not in str(bar.bar.postfix or "")
    bar.close()
    assert "stages" in out.getvalue()


def test_remedy_sweeps_show_in_batch(monkeypatch, capsys):
    from kvpressure.folders.run_context import BATCH_ENV
    from kvpressure.report.display import progress_bar

    monkeypatch.setenv(BATCH_ENV, "1")
    bar = progress_bar(desc="remedy what-if sweeps")
    bar.update(1)
    bar.set_postfix_str("watermark=0.05")
    assert "[1] remedy what-if sweeps: watermark=0.05" in capsys.readouterr().err


# --------------------------------------------------------------------------- 01's parameters
def test_a_readme_style_path_in_01_resolves_from_the_project_root(tmp_path, monkeypatch):
    from kvpressure.errors import InputError
    from kvpressure.folders.run_context import choose_run

    monkeypatch.chdir(REPO_ROOT / "notebooks")
    monkeypatch.delenv("KVPRESSURE_RUN_DIR", raising=False)
    ctx = choose_run("data/experiments/ci_small.yaml", "", str(tmp_path / "run"))
    assert Path(ctx.experiment) == REPO_ROOT / "data" / "experiments" / "ci_small.yaml"
    with pytest.raises(InputError, match="'data/experiments/nope.yaml': no such file"):
        choose_run("data/experiments/nope.yaml", "", str(tmp_path / "nope"))
    assert not (tmp_path / "nope").exists()


def test_the_page_check_takes_a_rate_of_one_for_a_rate_and_a_float_count_for_a_defect():
    from kvpressure.report.page_check import _float_counts

    table = ("<table><tr><th>concurrency (clients)</th><th>requests</th><th>requests/s</th>"
             "</tr><tr><td>1</td><td>{n}</td><td>1.00</td></tr></table>")
    assert _float_counts(table.format(n="6")) == []
    assert _float_counts(table.format(n="6.0")) == ["column 'requests': the count 6.0 printed "
                                                     "as a float"]


# --------------------------------------------------------------------------- real CPU vLLM data
@pytest.mark.slow
def test_a_real_servers_report_has_every_number_right(tmp_path):
    """The real falling sweep of the CPU vLLM server (bench results without token gaps, the
    scrape log, the server log): goodput measured, the TPOT panel drawn, the recompute ratio
    as its range, and the page check clean."""
    from kvpressure.investigation.report import make_report
    from kvpressure.report.page_check import page_problems

    res = make_report(tmp_path / "fall", sources=[FALL / "bench", FALL / "metrics.prom.jsonl.gz",
                                                   FALL / "server.log.gz"],
                      progress=lambda _m: None, stream=None)
    page = res.index_path.read_text()
    assert page_problems(page, res.run_dir) == []
    assert "0.00 requests/s (0% of" not in page
    assert "Goodput</strong>: requests per second" in page and "highest at concurrency" in page
    assert "recomputed (estimated range" not in page and "between 8.3% and 89.8%" in page
    assert "twin/twin.md" in page
    assert "served by vLLM 0.32.0" in page and "The data comes from a vLLM 0.32.0 server" in page



def test_the_served_vllm_version_is_read_from_the_data(tmp_path):
    from kvpressure.ingestion.provenance import served_version

    reports = {"r": {"runs": {"a": {"server_log": {"version": "0.32.0"}}}}}
    assert served_version(reports, []) == ("0.32.0", "the server log's start-up lines")
    (tmp_path / "bench").mkdir()
    (tmp_path / "engine.json").write_text(json.dumps({"server": {"version": "0.32.0+cpu"}}))
    assert served_version({}, [str(tmp_path / "bench")])[0] == "0.32.0+cpu"
    assert served_version({}, [str(tmp_path / "bench" / "c8.json")])[0] == "0.32.0+cpu"
    assert served_version({}, []) is None
    from kvpressure.report.sentences import version_warning

    assert "vLLM 0.32.0 server" in version_warning("0.32.0", "0.33.0")
    assert version_warning("0.33.0+cu129", "0.33.0") == "" == version_warning(None, "0.33.0")


def test_a_log_without_max_num_seqs_gets_the_status_under_vllms_default(tmp_path):
    """A V1 server log whose start-up arguments were cut (KV 88-98% full, 18-21 running, 23-43
    waiting): the status under vLLM 0.33's smallest default, the assumption named, and the
    recommendation from it, instead of "not established"."""
    from kvpressure.investigation.analyse import analyse
    from kvpressure.record.io import load_record
    from kvpressure.stages.files import read_stage
    from kvpressure.stages.results import VerdictResult

    log = REPO_ROOT / "tests" / "data" / "logs" / "v1_kv_bound_no_args.log"
    record = load_record(analyse(tmp_path / "run", source=str(log), log_year=2026))
    assert record.status == "bound by KV blocks"
    assert record.scheduler.max_num_seqs is None  # still not measured, and said so
    assert any("assumed: max_num_seqs is not in the data" in r and "256" in r
               and "engine_args={max_num_seqs: N}" in r for r in record.evidence.reasons)
    rec = read_stage(tmp_path / "run", VerdictResult).remedies.recommendation
    assert rec["parameter"] == "max_num_seqs" and "vLLM's default, assumed" in rec["text"]
