"""A simulated report says how far its latencies held against real vLLM servers: the card's own
held-out errors where real servers on it were checked (benchmarks/bench_sim_to_real.py), else
that none were and what the checked cards gave."""

from __future__ import annotations

import json

import pytest

from kvpressure.paths import data_dir
from kvpressure.profiles.fidelity import FIDELITY_FILE, METRICS, latency_fidelity, summarise
from kvpressure.report.sentences import latency_fidelity_sentence


def _row(run, hardware, split, real, pred, overload=False):
    metrics = dict.fromkeys(METRICS, None)
    return {"run": run, "hardware": hardware, "split": split, "overload": overload,
            "measured": {**metrics, "ttft_mean": real[0], "itl_mean": real[1]},
            "after": {**metrics, "ttft_mean": pred[0], "itl_mean": pred[1]}}


def test_the_summary_is_the_mean_error_over_scored_held_out_stages():
    rows = [
        _row("a", "h100-80g", "held-out", (0.100, 0.010), (0.110, 0.009)),  # +10%, -10%
        _row("a", "h100-80g", "held-out", (0.200, 0.020), (0.140, 0.021)),  # -30%, +5%
        _row("b", "h100-80g", "calibration", (0.100, 0.010), (0.500, 0.050)),  # not scored
        _row("c", "h100-80g", "held-out", (0.100, 0.010), (9.0, 9.0), overload=True),
        _row("d", "l40s", "held-out", (0.050, 0.010), (0.040, 0.012)),  # -20%, +20%
    ]
    got = summarise(rows)
    assert got["h100-80g"] == {"held_out_stages": 2, "held_out_runs": 1,
                               "calibration_stages": 1,
                               "mape_pct": {"ttft_mean": 20.0, "itl_mean": 7.5},
                               "below_real": {}}  # no tail measured in these rows
    assert got["l40s"]["mape_pct"] == {"ttft_mean": 20.0, "itl_mean": 20.0}
    assert got["l40s"]["calibration_stages"] == 0


def _tails(run, real, pred):
    metrics = dict.fromkeys(METRICS, None)
    return {"run": run, "hardware": "h100-80g", "split": "held-out", "overload": False,
            "measured": {**metrics, "ttft_p99": real[0], "e2e_p99": real[1]},
            "after": {**metrics, "ttft_p99": pred[0], "e2e_p99": pred[1]}}


def test_the_summary_counts_the_stages_a_tail_came_out_below_the_real_one():
    rows = [_tails("a", (0.050, 2.0), (0.040, 2.1)),  # TTFT p99 below, E2E p99 above
            _tails("b", (0.050, 2.0), (0.030, 1.9)),  # both below
            _tails("c", (0.050, 2.0), (0.050, 2.0))]  # equal: not below
    got = summarise(rows)["h100-80g"]
    assert got["below_real"] == {"ttft_p99": 2, "e2e_p99": 1}
    assert got["mape_pct"]["ttft_p99"] == pytest.approx((20 + 40 + 0) / 3, abs=0.05)


def _checked(below):
    return {"hardware": "x", "checked": True, "held_out_stages": 9, "held_out_runs": 3,
            "calibrated": True, "mape_pct": {"ttft_p99": 20.0, "e2e_p99": 10.0},
            "checked_cards": {}, "tail_stages": 9, "tail_below_real": below, "source": ""}


def test_the_sentence_says_the_tails_read_low_only_when_they_mostly_did():
    text = latency_fidelity_sentence(_checked({"ttft_p99": 9, "e2e_p99": 6}))
    assert "The tails read low: the simulated TTFT p99 was below the real servers' in 9 " \
           "of those 9 stages and the E2E p99 in 6" in text
    # Five of nine is no side: the mean error stays the statement, as before.
    text = latency_fidelity_sentence(_checked({"ttft_p99": 5, "e2e_p99": 4}))
    assert "read low" not in text and "TTFT p99 20.0%" in text
    text = latency_fidelity_sentence(_checked({"ttft_p99": 4, "e2e_p99": 8}))
    assert "the simulated E2E p99 was below the real servers' in 8 of those 9" in text
    assert "TTFT p99 was below" not in text


def test_the_shipped_tails_side_is_the_cards_own_or_every_checked_cards():
    doc = json.loads(data_dir().joinpath(*FIDELITY_FILE).read_text())
    h100 = latency_fidelity("h100-80g")
    assert h100["tail_stages"] == h100["held_out_stages"]
    assert h100["tail_below_real"] == doc["cards"]["h100-80g"]["below_real"]
    ascend = latency_fidelity("ascend-910b-64g")
    assert ascend["tail_stages"] == sum(c["held_out_stages"] for c in doc["cards"].values())
    for m, k in ascend["tail_below_real"].items():
        assert k == sum(c["below_real"][m] for c in doc["cards"].values())
        if k >= 2 / 3 * ascend["tail_stages"]:
            assert f"in {k}" in latency_fidelity_sentence(ascend)


def test_the_shipped_table_covers_the_benchmarks_cards():
    doc = json.loads(data_dir().joinpath(*FIDELITY_FILE).read_text())
    assert set(doc["cards"]) == {"h100-80g", "a100-80g", "l40s"}
    h100 = latency_fidelity("h100-80g")
    assert h100["checked"] and h100["calibrated"] and h100["held_out_stages"] >= 50
    assert set(h100["mape_pct"]) == set(METRICS)
    # One A100 run fixes that card's profile (the benchmark's CALIBRATION_RUNS); no L40S run
    # fixes anything.
    a100 = latency_fidelity("a100-80g")
    assert a100["checked"] and a100["calibrated"]
    l40s = latency_fidelity("l40s")
    assert l40s["checked"] and not l40s["calibrated"]


def test_a_checked_card_gets_its_own_errors_and_an_unchecked_one_says_so():
    h100 = latency_fidelity("h100-80g")
    text = latency_fidelity_sentence(h100)
    itl = h100["mape_pct"]["itl_mean"]
    assert f"ITL {itl:.1f}%" in text and f"{h100['held_out_stages']} load stages" in text
    assert "published starting values" not in text
    assert "published starting values" in latency_fidelity_sentence(latency_fidelity("l40s"))
    ascend = latency_fidelity("ascend-910b-64g")
    assert not ascend["checked"] and ascend["mape_pct"] == {}
    text = latency_fidelity_sentence(ascend)
    assert "roofline estimates" in text and "no real vLLM server on this card" in text
    worst = max(c["ttft_p99"] for c in ascend["checked_cards"].values())
    assert f"to {worst:.1f}%" in text


@pytest.mark.parametrize("hardware", ["h100-80g", "ascend-910b-64g"])
def test_the_record_of_a_simulation_carries_it(hardware):
    from kvpressure.investigation.collect_simulated import _latency_fidelity
    from kvpressure.record.schema import LatencyFidelity

    got = LatencyFidelity.model_validate(_latency_fidelity(hardware))
    assert got.hardware == hardware and got.statement.startswith("Latencies are simulated")
