"""The investigation on the request-rate axis: the knee of throughput and of latency against
offered load, the focus level, the record's level axis, ingested and simulated sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvpressure.analysis.focus import focus_level
from kvpressure.analysis.knee import knee_of_runs, latency_knee
from kvpressure.investigation.analyse import analyse
from kvpressure.report.sentences import knee_sentence, latency_knee_sentence

DATA = Path(__file__).parent / "data" / "rates"
REPO = Path(__file__).resolve().parents[1]


def test_latency_knee_is_the_last_level_within_twice_the_unloaded_latency():
    # Unloaded latency 1.0 s, so the band ends at 2.0 s: 1.1 and 1.5 are inside, 4.0 is past.
    k = latency_knee([1, 2, 3, 4, 5], [1.0, 1.1, 1.5, 4.0, 9.0])
    assert (k.knee_x, k.turn_x, k.limit) == (3.0, 4.0, 2.0)
    # Repeats of a level are averaged first: 3 -> (1.2 + 2.6) / 2 = 1.9, still inside.
    k = latency_knee([1, 2, 3, 3, 4], [1.0, 1.1, 1.2, 2.6, 4.0])
    assert (k.knee_x, k.turn_x) == (3.0, 4.0)
    # Never past the band: no turn inside the range; past it at once: no knee.
    assert latency_knee([1, 2, 3], [1.0, 1.5, 1.9]).turn_x is None
    assert latency_knee([1, 2, 3], [1.0, 2.5, 3.0]).knee_x is None
    assert latency_knee([1, 2], [1.0, 5.0]) is None


def test_throughput_knee_and_focus_on_the_rate_axis():
    # 200 tok/s per request/s up to 1.5 requests/s (300 tok/s), then flat: a broken stick
    # through these points bends exactly at 1.5; the focus is the first rate past it.
    runs = pd.read_csv(DATA / "capped_sweep.csv")
    assert knee_of_runs(runs, x="request_rate").knee_x == 1.5
    level, why = focus_level(runs, None, "request_rate")
    assert level == 2.0
    assert why == "the first level past the knee at request rate 1.5"
    with pytest.raises(Exception, match="focus_request_rate 4: not a swept level"):
        focus_level(runs, 4.0, "request_rate")


def test_ingested_rate_sweep_gets_the_investigation(tmp_path: Path):
    # A CSV of runs at five request rates under one concurrency cap (16): a rate sweep.
    record_path = analyse(tmp_path / "run", source=str(DATA / "capped_sweep.csv"))
    record = yaml.safe_load(record_path.read_text())
    w, perf = record["workload"], record["perf"]
    assert w["level_axis"] == "request_rate"
    assert w["request_rates"] == [0.5, 1.0, 1.5, 2.0, 3.0]
    assert (w["max_concurrency"], w["request_rate"], w["concurrency"]) == (16, 2.0, None)
    assert record["counters"]["window"]["request_rate"] == 2.0
    assert perf["knee"]["knee_x"] == 1.5
    assert [p["request_rate"] for p in perf["throughput_by_request_rate"]] == w["request_rates"]
    assert perf["throughput_by_concurrency"] is None
    check = record["evidence"]["checks"][0]
    assert check["name"].endswith("with offered load")
    assert check["metric"] == "output_throughput by request rate"
    # A concurrency sweep's nulls would need a reason; on this axis they are by design.
    assert not any(k.startswith(("workload.concurrency", "perf.throughput_by_concurrency"))
                   for k in record.get("missing", {}))
    knee = json.loads((tmp_path / "run" / "analysis" / "knee.json").read_text())
    assert knee["x"] == "request_rate" and knee["focus_request_rate"] == 2.0
    # TTFT p95 0.20 s at the lightest load: within 0.40 s up to 1.5 (0.30 s), 1.50 s at 2.
    ttft = knee["latency_knees"]["ttft_p95_s"]
    assert (ttft["knee_x"], ttft["turn_x"]) == (1.5, 2.0)
    text = knee_sentence(perf["knee"], 3.0, "request_rate")
    assert "request rate **1.5** req/s" in text and "concurrency" not in text


def test_closed_loop_wording_is_unchanged():
    knee = {"knee_x": 16, "peak_x": 40, "peak_y": 381, "declines": True, "decline_pct": 47,
            "same_schedule_from": 48}
    assert knee_sentence(knee, 64) == knee_sentence(knee, 64, "concurrency")
    assert "concurrency **40**" in knee_sentence(knee, 64)
    assert "more clients lower throughput" in knee_sentence(knee, 64)


@pytest.mark.slow
def test_simulated_rate_experiment_through_the_report(tmp_path: Path):
    exp = REPO / "data" / "experiments" / "rate_small.yaml"
    record = yaml.safe_load(analyse(tmp_path / "run", experiment=str(exp)).read_text())
    w, perf = record["workload"], record["perf"]
    assert w["level_axis"] == "request_rate" and w["max_concurrency"] is None
    assert w["request_rates"] == [0.1, 0.2, 0.3, 0.5, 1.0, 2.0]
    runs = pd.read_csv(tmp_path / "run" / "runs.csv")
    assert runs["concurrency"].isna().all()
    curve = {p["request_rate"]: p["output_throughput"] for p in perf["throughput_by_request_rate"]}
    knee = perf["knee"]["knee_x"]
    assert knee in curve
    # Below saturation an open loop delivers what is offered: rate x mean output length
    # (the seeds' request sets differ a little, hence the tolerance); past the knee it cannot.
    out_len = w["output_len_distribution"]["mean"]
    for rate, tput in curve.items():
        if rate < knee:
            assert tput == pytest.approx(rate * out_len, rel=0.2), rate
    assert curve[max(curve)] < 0.5 * max(curve) * out_len
    assert (tmp_path / "run" / "points" / "baseline" / f"r{w['request_rate']:g}").is_dir()


def test_the_focus_rate_can_be_given(tmp_path: Path):
    record_path = analyse(tmp_path / "run", source=str(DATA / "capped_sweep.csv"),
                          focus_request_rate=1.0)
    record = yaml.safe_load(record_path.read_text())
    assert record["workload"]["request_rate"] == 1.0
    collect = json.loads((tmp_path / "run" / "analysis" / "collect.json").read_text())
    assert collect["focus"]["why"] == "given as a parameter"


@pytest.mark.slow
def test_remedies_on_the_rate_axis_are_simulated_at_the_focus_rate(tmp_path: Path):
    from kvpressure.analysis.recommendation import recommend
    from kvpressure.analysis.remedies import evaluate_remedies
    from kvpressure.investigation.collect import load_tables
    from kvpressure.investigation.verdict import _remedy_rows, _simulate_levels

    exp = REPO / "data" / "experiments" / "rate_small.yaml"
    analyse(tmp_path / "run", experiment=str(exp))
    tables = load_tables(tmp_path / "run")
    info = tables.info
    report = evaluate_remedies(
        tables.baseline_runs, _simulate_levels(str(exp), info.levels),
        settings=info.settings, target_concurrency=info.focus.level, x="request_rate",
        remedies={"scheduler_reserve_full_isl": {"scheduler_reserve_full_isl": True}},
    ).to_dict()
    assert report["target_concurrency"] == 1.0
    rows = _remedy_rows(report, info.settings, tables.repeats, "request_rate")
    assert rows and all("at request rate 1 req/s" in r["effect"] for r in rows)
    rec = recommend(report, info.settings, axis="request_rate")
    assert "concurrency" not in rec["text"] and "request rate 1 req/s" in rec["text"]


def test_the_latency_knee_sentence_names_its_latencies():
    # The columns' names, not their keys (a later table of the module's once took the name).
    knees = {"ttft_p95_s": {"factor": 2, "base": 0.05, "turn_x": None},
             "itl_p95_s": {"factor": 2, "base": 0.01, "turn_x": 2.0, "knee_x": 1.5}}
    text = latency_knee_sentence(knees, 4.0)
    assert "TTFT p95 stays within" in text and "ITL p95 holds within" in text
    assert "_p95_s" not in text
