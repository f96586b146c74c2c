"""The twin in the report: built on measured data before stage 06 recommends, its fit shown
before its prediction, a refusal shown as a refusal, none for a simulation; the client
turnaround and the validation's comparisons on hand-worked examples.

The real data is a sweep of a real vLLM 0.32.0 CPU server cut small (``tests/data/twin_real``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvpressure.investigation.analyse import analyse
from kvpressure.paths import REPO_ROOT
from kvpressure.report.html import recommendation_html
from kvpressure.stages.files import read_stage
from kvpressure.stages.results import VerdictResult
from kvpressure.twin.in_report import read_report_twin, show_report_twin
from kvpressure.twin.turnaround import client_gaps, engine_gap_s
from kvpressure.twin.validation import (
    paired_change,
    past_knee_change,
    preemption_errors,
    run_to_run,
)

DATA = REPO_ROOT / "tests" / "data" / "twin_real"
LOG = DATA / "metrics.prom.jsonl.gz"
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 1024,
          "scheduler_reserve_full_isl": True}


def _bench(c: int) -> dict:
    return json.loads((DATA / "bench" / f"c{c}.json").read_text())


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("real") / "run"
    analyse(run, source=[str(DATA / "bench"), str(LOG)], engine_args=ENGINE,
            simulate_remedies=True)
    return run


@pytest.fixture(scope="module")
def one_level_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("one") / "run"
    analyse(run, source=[str(DATA / "bench" / "c8.json"), str(LOG)], engine_args=ENGINE,
            simulate_remedies=True)
    return run


def _shown(monkeypatch, view) -> list[tuple[str, str]]:
    """What ``show_report_twin`` displays, in order: (kind, text)."""
    import IPython.display

    import kvpressure.report.display as display

    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(display, "say", lambda text: shown.append(("text", text)))
    monkeypatch.setattr(display, "show_table",
                        lambda frame, **_kw: shown.append(("table", frame.to_string())))
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, **_kw: shown.append(("image", obj["text/plain"])))
    show_report_twin(view)
    return shown


def test_the_twin_of_a_real_sweep_is_built_and_recommends(real_run):
    doc = json.loads((real_run / "twin" / "twin.json").read_text())
    assert "refused" not in doc
    levels = doc["fit"]["levels"]
    assert [r["concurrency"] for r in levels] == [2, 4, 8, 16]
    for r in levels:  # the measured side is the bench files' own numbers
        assert r["output_throughput_measured"] == pytest.approx(
            _bench(r["concurrency"])["output_throughput"], rel=1e-9)
    # the pool the server reported in vllm:cache_config_info, not a default
    assert doc["settings"]["num_gpu_blocks"]["value"] == 64
    assert doc["settings"]["block_size"]["value"] == 32
    assert doc["step_time"]["fitted_on_levels"] == [2, 4, 8, 16]
    rec = read_stage(real_run, VerdictResult).remedies.recommendation
    assert rec["source"] == "twin"
    assert rec["twin_fit"] == doc["fit"]["verdict"]
    assert rec["text"].startswith("Do this (the fitted twin's what-if)" if doc["fit"]["fits"]
                                  else "Twin's what-if, not trusted")
    # No limits given: the report's rule, the twin's own p95 at the focus level +10%.
    rem = doc["remedies"]
    base = next(c for c in rem["candidates"] if c["setting"] == "baseline")
    assert rem["limits"] == pytest.approx({"ttft_p95_s": 1.1 * base["ttft_p95_s"],
                                           "itl_p95_s": 1.1 * base["itl_p95_s"]})
    for c in rem["candidates"]:
        assert c["meets_limits"] == (c["ttft_p95_s"] <= rem["limits"]["ttft_p95_s"]
                                     and c["itl_p95_s"] <= rem["limits"]["itl_p95_s"])


def test_the_report_shows_the_fit_before_the_prediction(real_run, monkeypatch):
    view = read_report_twin(real_run)
    assert view is not None and view.refused is None
    shown = _shown(monkeypatch, view)
    texts = [t for _, t in shown]
    fit_at = next(i for i, t in enumerate(texts) if t.startswith(f"**Fit: {view.verdict}"))
    table_at = next(i for i, (k, _) in enumerate(shown) if k == "table")
    image_at = next(i for i, (k, _) in enumerate(shown) if k == "image")
    trust_at = next(i for i, t in enumerate(texts) if t.startswith("**How far to trust it"))
    predict_at = next(i for i, t in enumerate(texts) if view.recommendation in t)
    assert fit_at < table_at < image_at < trust_at < predict_at
    assert view.trust in texts[trust_at]
    # The page's first screen: the fit's verdict, then what to do.
    rec = read_stage(real_run, VerdictResult).remedies.recommendation
    page = recommendation_html(rec)
    assert page.index("fitted to its curve") < page.index(rec["text"][:20])
    # The measured client turnaround is among what the twin assumes.
    turn = next(a for a in view.assumptions if a.startswith("closed loop"))
    assert "measured, a real client's slot stays empty" in turn


def test_a_refused_twin_is_shown_as_refused(one_level_run, monkeypatch):
    view = read_report_twin(one_level_run)
    assert view is not None and view.refused is not None
    assert "level" in view.refused
    rec = read_stage(one_level_run, VerdictResult).remedies.recommendation
    assert rec["source"] == "symptoms"
    assert "no twin of it: " + view.refused in rec["why_not_simulated"]
    shown = _shown(monkeypatch, view)
    assert shown[1][1].startswith(f"**No twin: {view.refused}")
    assert not [k for k, _ in shown if k in ("table", "image")]


def test_a_simulated_run_gets_no_twin(ci_small_report, monkeypatch):
    assert not (ci_small_report.run_dir / "twin").exists()
    assert read_report_twin(ci_small_report.run_dir) is None
    assert _shown(monkeypatch, None) == []


def test_the_client_turnaround_on_a_hand_worked_closed_loop():
    # Two clients. Finishes at 1.0, 2.0, 2.2, 2.9; the third request starts at 1.2 (0.2 s
    # after the first finish), the fourth at 2.5 (0.5 s after the second).
    gaps = client_gaps([0.0, 0.0, 1.2, 2.5], [1.0, 2.0, 1.0, 0.4], 2)
    assert gaps.tolist() == pytest.approx([0.2, 0.5])
    assert client_gaps([0.0, 0.0], [1.0, 1.0], 2).size == 0  # no request after the first C
    assert client_gaps([0.0, 0.0, 1.0], [1.0, math.nan, 1.0], 2).size == 0  # a failed one
    # 2 clients, 1.5 requests in the engine on average, 2 requests/s: 0.25 s empty a cycle.
    assert engine_gap_s(1.5, 2, 2.0) == pytest.approx(0.25)
    assert engine_gap_s(2.3, 2, 2.0) == 0.0
    assert math.isnan(engine_gap_s(math.nan, 2, 2.0))


def test_the_client_turnaround_of_the_real_sweep(real_run):
    from kvpressure.twin.api import build_twin

    twin = build_twin(real_run)
    got = twin.turnaround()
    for c, level in got["per_level"].items():
        bench = _bench(c)
        starts, lat = np.array(bench["start_times"]), np.array(bench["latencies"])
        # every request after the first C started after some earlier one had finished
        assert level["client_gap_s"] == pytest.approx(
            np.mean(np.sort(starts)[c:] - np.sort(starts + lat)[:-c]))
        assert level["client_gap_s"] > 0
        assert 0 < level["mean_in_engine"] <= c + 1e-9
        assert level["engine_gap_s"] >= 0


def test_the_past_knee_change_on_a_hand_worked_example():
    base = {2: 100.0, 4: 180.0, 8: 200.0, 16: 190.0}
    remedy = {2: 100.0, 4: 170.0, 8: 230.0, 16: 228.0}
    got = past_knee_change(base, remedy, knee=8)
    assert got["levels"] == [8, 16]
    assert got["change_of_mean_pct"] == pytest.approx(100 * (229 / 195 - 1))  # +17.4%
    assert got["per_level_pct"] == pytest.approx({8: 15.0, 16: 20.0})
    assert got["spread_pct"]["min"] == pytest.approx(15.0)
    assert got["spread_pct"]["max"] == pytest.approx(20.0)
    assert got["spread_pct"]["std"] == pytest.approx(math.sqrt(12.5))
    # a level the remedy was not measured at is left out, not read as zero
    assert past_knee_change(base, {8: 230.0}, knee=4)["levels"] == [8]
    assert past_knee_change(base, remedy, knee=None)["levels"] == [2, 4, 8, 16]


def test_run_to_run_and_preemptions_past_the_knee_on_hand_worked_examples():
    first = {4: {"output_throughput": 200.0, "preemptions": 10},
             8: {"output_throughput": 250.0, "preemptions": 20}}
    second = {4: {"output_throughput": 210.0, "preemptions": 13},
              8: {"output_throughput": 225.0, "preemptions": 19}}
    got = run_to_run(first, second)
    assert [r["throughput_diff_pct"] for r in got["per_level"]] == pytest.approx([5.0, -10.0])
    assert got["throughput_mean_abs_diff_pct"] == pytest.approx(7.5)
    assert got["throughput_max_abs_diff_pct"] == pytest.approx(10.0)
    assert got["preemptions_max_abs_diff"] == 3
    pre = preemption_errors({2: 0, 4: 10, 8: 20}, {2: 0, 4: 14, 8: 18}, knee=4)
    assert pre["past_knee_levels"] == [4, 8]
    assert (pre["past_knee_measured"], pre["past_knee_twin"]) == (30, 32)
    assert pre["past_knee_error_pct"] == pytest.approx(100 * (32 / 30 - 1))
    assert pre["per_level"][4]["error_pct"] == pytest.approx(40.0)
    assert math.isnan(pre["per_level"][2]["error_pct"])


def test_the_paired_change_cancels_the_drift_between_pairs_on_a_hand_worked_example():
    # the machine doubles its speed between the first pair and the second: each pair's own
    # change (+10, +10, +5%) is what is averaged, not the arms' means
    got = paired_change([100.0, 200.0, 100.0], [110.0, 220.0, 105.0])
    assert got["per_pair_pct"] == pytest.approx([10.0, 10.0, 5.0])
    assert got["mean_pct"] == pytest.approx(25 / 3)
    # std (ddof=1) sqrt(25/3), standard error 5/3, t(0.975, 2 degrees of freedom) 4.3027
    half = 4.302653 * 5 / 3
    assert got["interval_pct"] == pytest.approx([25 / 3 - half, 25 / 3 + half], rel=1e-5)
    assert got["sign"] == 1
    # one pair up, one down: the interval holds 0 and no sign is claimed
    assert paired_change([100.0, 100.0], [110.0, 95.0])["sign"] is None
    # -20, -15, -18%: mean -17.7, standard error 1.45, half-width 4.30 x 1.45 = 6.3
    assert paired_change([100.0, 100.0, 100.0], [80.0, 85.0, 82.0])["sign"] == -1
    # two pairs alone (t with 1 degree of freedom is 12.7) cannot claim it
    assert paired_change([100.0, 100.0], [80.0, 85.0])["sign"] is None
    one = paired_change([100.0], [120.0])
    assert one["mean_pct"] == pytest.approx(20.0) and one["sign"] is None
    with pytest.raises(ValueError, match="same number"):
        paired_change([100.0], [1.0, 2.0])
