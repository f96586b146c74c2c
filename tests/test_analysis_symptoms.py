"""Symptom checklist and waiting reasons on constructed series and the reference run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.analysis.symptoms import Thresholds, check_symptoms
from kvpressure.analysis.waiting import waiting_from_series, waiting_from_steps
from kvpressure.ingestion.counters import gauge_mean

DATA = Path(__file__).parent / "data" / "analysis"


def gauges(running, capacity, deferred, usage, preemptions=None) -> pd.DataFrame:
    rows = []
    for i, (r, c, d, u) in enumerate(zip(running, capacity, deferred, usage, strict=True)):
        t = float(i)
        rows += [("a", t, "vllm:num_requests_running", "", r),
                 ("a", t, "vllm:num_requests_waiting", "", c + d),
                 ("a", t, "vllm:num_requests_waiting_by_reason", "reason=capacity", c),
                 ("a", t, "vllm:num_requests_waiting_by_reason", "reason=deferred", d),
                 ("a", t, "vllm:kv_cache_usage_perc", "", u)]
        if preemptions is not None:
            rows.append(("a", t, "vllm:num_preemptions_total", "", preemptions[i]))
    return pd.DataFrame(rows, columns=["run", "t", "metric", "labels", "value"])


def test_waiting_reasons_kept_apart_and_silent_form():
    s = gauges(running=[8, 8, 16, 8], capacity=[0, 3, 2, 0], deferred=[2, 0, 0, 0],
               usage=[0.5, 1.0, 1.0, 0.6])
    # Over [0, 4] each sample holds for one second (the last until the window's end).
    w = waiting_from_series(s, 0.0, 4.0, max_num_seqs=16)
    assert w.has_reason_split
    assert w.frac_waiting == pytest.approx(0.75)
    assert w.frac_capacity == pytest.approx(0.5)
    assert w.frac_deferred == pytest.approx(0.25)
    assert w.mean_capacity == pytest.approx(5 / 4) and w.mean_deferred == pytest.approx(0.5)
    # Sample 1: capacity waiting with 8 < 16 running (silent); sample 2: at the limit.
    assert w.frac_silent == pytest.approx(0.25)
    assert w.frac_at_limit == pytest.approx(0.25)
    assert w.states == pytest.approx({"idle": 0.0, "running_no_queue": 0.25,
                                      "queue_at_max_num_seqs": 0.25,
                                      "queue_below_max_num_seqs": 0.25, "deferred_only": 0.25})
    assert sum(w.states.values()) == pytest.approx(1.0)


def test_waiting_without_max_num_seqs_cannot_test_silent_form():
    s = gauges([8, 8], [1, 1], [0, 0], [1.0, 1.0])
    w = waiting_from_series(s)
    assert w.frac_silent is None and any("max_num_seqs" in n for n in w.notes)


def test_waiting_from_steps_time_weighted():
    steps = pd.DataFrame({"step": [0, 1], "num_running_after": [4, 2],
                          "num_waiting_after": [0, 3], "num_waiting_deferred": [0, 1],
                          "time_s": [0.0, 1.0], "step_duration_s": [1.0, 3.0]})
    w = waiting_from_steps(steps, max_num_seqs=4)
    assert w.frac_waiting == pytest.approx(0.75)
    assert w.mean_capacity == pytest.approx(0.75 * 2)
    assert w.frac_silent == pytest.approx(0.75)


def test_kv_bound_series_has_symptoms_2_to_5():
    n = 10
    s = gauges(running=[20] * n, capacity=[5] * n, deferred=[0] * n, usage=[0.99] * n,
               preemptions=list(range(0, 2 * n, 2)))
    extra = []
    for i in range(n):
        extra += [("a", float(i), "vllm:prompt_tokens_total", "", 1000.0 * i),
                  ("a", float(i), "vllm:time_to_first_token_seconds_count", "", float(i)),
                  ("a", float(i), "vllm:generation_tokens_total", "", 2000.0 * i)]
    s = pd.concat([s, pd.DataFrame(extra, columns=s.columns)])
    c = check_symptoms(s, max_num_seqs=64)
    v = {x.id: x.verdict for x in c.symptoms}
    assert v == {"curve_falls": "no data", "waiting_persists": "present",
                 "running_below_max_num_seqs": "present", "kv_usage_near_full": "present",
                 "preemption_recompute": "present", "itl_jitter": "no data"}
    # 18 preemptions counted over the window.
    assert c.by_id("preemption_recompute").evidence["preemptions"] == 18
    json.dumps(c.to_dict())


def test_thresholds_are_parameters():
    s = gauges([8] * 4, [1, 1, 0, 0], [0] * 4, [0.96, 0.96, 0.5, 0.5])
    c = check_symptoms(s, t0=0.0, t1=4.0, max_num_seqs=16)
    assert c.by_id("waiting_persists").verdict == "present"  # 50% >= 50%
    assert c.by_id("kv_usage_near_full").verdict == "present"
    c = check_symptoms(s, t0=0.0, t1=4.0, max_num_seqs=16,
                       thresholds=Thresholds(waiting_frac=0.6, kv_full_usage=0.97))
    assert c.by_id("waiting_persists").verdict == "absent"
    assert c.by_id("kv_usage_near_full").verdict == "absent"


def test_runs_with_two_columns_give_curve_only():
    runs = pd.DataFrame({"concurrency": [16, 24, 32, 40, 48, 56, 64],
                         "output_throughput": [160, 240, 320, 296, 272, 248, 224]})
    c = check_symptoms(None, runs=runs)
    v = {x.id: x.verdict for x in c.symptoms}
    assert v["curve_falls"] == "present"
    assert c.by_id("curve_falls").evidence["peak_x"] == 32
    assert all(v[k] == "no data" for k in v if k != "curve_falls")


def test_silent_form_without_engine_metrics_names_the_metrics_first():
    runs = pd.DataFrame({"concurrency": [16, 32, 64], "output_throughput": [160, 320, 300]})
    silent = check_symptoms(None, runs=runs).by_id("running_below_max_num_seqs")
    assert silent.verdict == "no data"
    assert silent.evidence["missing"] == ("vllm:num_requests_running, vllm:num_requests_waiting, "
                                          "max_num_seqs")
    known = check_symptoms(None, runs=runs, max_num_seqs=256).by_id("running_below_max_num_seqs")
    assert known.evidence["missing"] == "vllm:num_requests_running, vllm:num_requests_waiting"
    # With the gauges, only the setting is missing.
    gauged = check_symptoms(gauges([8, 8], [1, 1], [0, 0], [1.0, 1.0]))
    assert gauged.by_id("running_below_max_num_seqs").evidence["missing"] == "max_num_seqs"


def test_itl_jitter_from_runs():
    runs = pd.DataFrame({"concurrency": [8, 16, 32], "output_throughput": [1, 2, 3],
                         "itl_mean_s": [0.010, 0.011, 0.012],
                         "itl_p95_s": [0.012, 0.020, 0.036]})
    s = check_symptoms(None, runs=runs).by_id("itl_jitter")
    assert s.verdict == "present"
    assert s.evidence["spread_growth"] == pytest.approx((0.036 / 0.012) / (0.012 / 0.010))


def test_itl_jitter_falls_back_to_p99_where_p95_was_not_measured():
    # vllm bench serve writes p99 only by default: its p95 columns are empty.
    runs = pd.DataFrame({"concurrency": [8, 16, 32], "output_throughput": [1, 2, 3],
                         "itl_mean_s": [0.010, 0.011, 0.012],
                         "itl_p95_s": [float("nan")] * 3,
                         "itl_p99_s": [0.011, 0.013, 0.015]})
    s = check_symptoms(None, runs=runs).by_id("itl_jitter")
    assert s.evidence["tail"] == "itl_p99_s" and "p99 stands in for p95" in s.evidence["note"]
    assert s.evidence["spread_growth"] == pytest.approx((0.015 / 0.012) / (0.011 / 0.010))
    assert s.verdict == "absent"  # 1.14 x, below the growth threshold


def test_missing_metric_is_no_data_not_zero():
    s = gauges([8, 8], [1, 1], [0, 0], [1.0, 1.0])
    s = s[s["metric"] != "vllm:kv_cache_usage_perc"]
    c = check_symptoms(s, max_num_seqs=16)
    assert c.by_id("kv_usage_near_full").verdict == "no data"
    assert c.by_id("preemption_recompute").verdict == "no data"


def test_reference_run_series_and_steps_agree():
    series = pd.read_csv(DATA / "heavy_c64.series.csv.gz")
    steps = pd.read_csv(DATA / "heavy_c64.steps.csv.gz")
    a = check_symptoms(series, max_num_seqs=256)
    b = check_symptoms(None, steps=steps, max_num_seqs=256)
    for sid in ("waiting_persists", "running_below_max_num_seqs", "kv_usage_near_full",
                "preemption_recompute"):
        assert a.by_id(sid).verdict == b.by_id(sid).verdict == "present", sid
    # Scrapes every 50 steps see nearly the same waiting share as every step does.
    fa = a.by_id("waiting_persists").evidence["frac_waiting"]
    fb = b.by_id("waiting_persists").evidence["frac_waiting"]
    assert abs(fa - fb) < 0.05
    # A constant step time: ITL p95 sits in the mean's bucket, no jitter claimed.
    assert a.by_id("itl_jitter").verdict == "absent"


def test_symptom_kv_usage_mean_is_the_record_gauge_mean():
    # Uneven scrapes (a missing one at t=3) and a window that starts and ends between scrapes:
    # every rule that differs (sample set, last-sample weight) would give another number.
    ts = [0.0, 1.0, 2.0, 4.0, 5.0, 7.0]
    usage = [0.2, 0.9, 1.0, 0.97, 0.5, 0.1]
    rows = [("a", t, "vllm:kv_cache_usage_perc", "", u) for t, u in zip(ts, usage, strict=True)]
    s = pd.DataFrame(rows, columns=["run", "t", "metric", "labels", "value"])
    t0, t1 = 0.5, 5.5
    c = check_symptoms(s, t0=t0, t1=t1)
    ev = c.by_id("kv_usage_near_full").evidence
    # Held values over [0.5, 5.5]: 0.2 for 0.5 s, 0.9 for 1, 1.0 for 2, 0.97 for 1, 0.5 for 0.5.
    expected = (0.2 * 0.5 + 0.9 * 1 + 1.0 * 2 + 0.97 * 1 + 0.5 * 0.5) / 5
    assert ev["mean_kv_usage"] == pytest.approx(expected)
    assert ev["mean_kv_usage"] == pytest.approx(
        gauge_mean(s, "vllm:kv_cache_usage_perc", t0, t1, run="a"))
    # Time at or above 0.95: 1.0 for 2 s and 0.97 for 1 s out of 5.
    assert ev["frac_near_full"] == pytest.approx(3 / 5)
