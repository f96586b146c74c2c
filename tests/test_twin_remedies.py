"""Remedies on the twin: never on an unfitted one, flagged on one that does not fit, and the
recommendation is the best setting that meets the latency limits."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from kvpressure.analysis.focus import focus_level
from kvpressure.cli import main
from kvpressure.twin.api import TwinNotFitted, build_twin
from twin_helpers import SETTINGS, synthetic_run


def test_a_remedy_on_an_unfitted_twin_is_refused(tmp_path):
    twin = build_twin(synthetic_run(tmp_path / "run", levels=(2, 4, 8)))
    with pytest.raises(TwinNotFitted, match="not fitted"):
        twin.predict_remedies(limits={})
    with pytest.raises(TwinNotFitted, match="not fitted"):
        twin.predict_level(4, {"max_num_seqs": 2})


def test_remedies_on_a_twin_that_does_not_fit_are_flagged(tmp_path):
    run = synthetic_run(tmp_path / "run", levels=(2, 4, 6, 8))
    runs = pd.read_csv(run / "runs.csv")
    # The server measured at concurrency 8 did something the twin cannot: 40% more output.
    runs.loc[runs["concurrency"] == 8, "output_throughput"] *= 1.4
    runs.to_csv(run / "runs.csv", index=False)
    twin = build_twin(run)
    twin.fit(bootstrap=20)
    report = twin.fit_report()
    assert not report.verdict.fits
    assert report.verdict.text.startswith("does not fit: throughput at c=8")
    advice = twin.predict_remedies(limits={})
    assert advice["trusted"] is False
    assert advice["trust"].startswith("UNTRUSTED")
    assert advice["recommendation"]["text"].startswith("UNTRUSTED (twin does not fit)")


def test_cli_twin_recommends_the_best_setting_within_the_limits(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run", levels=(2, 4, 6, 8))
    out = tmp_path / "twin"
    assert main(["twin", str(run), "--out", str(out), "--limits", "itl_p95=5ms",
                 "--bootstrap", "30"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fit"].startswith("twin fits within")
    assert sorted(p.name for p in out.iterdir()) == [".kvpressure.json", "fit_table.csv",
                                                     "twin.json", "twin.md", "twin.png"]
    doc = json.loads((out / "twin.json").read_text())
    rem = doc["remedies"]
    # the report's focus: the first level past the record's knee of the measured curve
    focus, rule = focus_level(pd.read_csv(run / "runs.csv"))
    assert rem["focus_concurrency"] == focus and rem["focus"]["rule"] == rule
    assert rem["trusted"] is True
    cands = {c["setting"]: c for c in rem["candidates"]}
    # max_num_seqs lowered to what the pool holds: 40 blocks / blocks of a mean sequence.
    mean_len = sum(w["prompt_len_mean"] + w["output_len_mean"] for w in doc["workload"]
                   if w["concurrency"] == focus)
    holds = SETTINGS["num_gpu_blocks"] // math.ceil(mean_len / SETTINGS["block_size"])
    assert cands["lower_max_num_seqs"]["overrides"] == {"max_num_seqs": holds}
    settings = {k: v["value"] for k, v in doc["settings"].items()}
    for c in cands.values():
        assert c["meets_limits"] == (c["itl_p95_s"] <= 0.005)
        lo, mid, hi = c["throughput_change_pct_p05_p50_p95"]
        assert lo <= mid <= hi
        # every remedy changes something; its effect is read off its interval with the noise
        low, high = c["throughput_change_pct_with_noise"]
        if c["setting"] != "baseline":
            assert any(settings[k] != v for k, v in c["overrides"].items())
            assert c["effect"] == ("raises" if low > 0 else "lowers" if high < 0
                                   else "no measurable effect")
            assert low <= c["throughput_change_pct"] <= high
    assert "larger_pool" in cands and "admit_by_first_chunk" in cands
    best = rem["recommendation"]["setting"]
    allowed = [c for c in cands.values() if c["meets_limits"] and c["setting"] != "baseline"
               and c["effect"] == "raises" and not c["changes_assumed_settings"]
               and "num_gpu_blocks" not in c["overrides"]]
    top = max(allowed, key=lambda c: c["output_throughput"], default=None)
    # the most throughput within the limits, beyond the noise, when it gains 2% or more
    assert best == (top["setting"] if top and top["throughput_change_pct"] >= 2.0
                    else "baseline")
    assert "UNTRUSTED" not in (out / "twin.md").read_text()
    table = pd.read_csv(out / "fit_table.csv")
    assert table["concurrency"].tolist() == [2, 4, 6, 8]


def test_the_current_settings_measured_again_get_the_band_of_two_runs(tmp_path):
    """A candidate that changes nothing (a restart of the same server) is a change between
    two runs: no effect, with the interval of both runs' noise, never [0, 0]."""
    from scipy.stats import t as student

    run = synthetic_run(tmp_path / "run", levels=(2, 4, 6, 8))
    runs = pd.read_csv(run / "runs.csv")
    # a server that scatters a few percent around its curve, as a real one does
    runs["output_throughput"] *= [1.03, 0.97, 1.04, 0.96]
    runs.to_csv(run / "runs.csv", index=False)
    twin = build_twin(run)
    twin.fit(bootstrap=20)
    rem = twin.predict_remedies(limits={}, candidates={"restarted": {}})
    err = twin.report.table["output_throughput_error_pct"].to_numpy(float)
    # by hand: the scatter of the 4 levels around the twin over the degrees of freedom its
    # fit left (4 less the throughput rows' leverages), t at those, sqrt(2) for the two runs
    # a change is measured between
    spent = sum(twin.fitted.throughput_leverage.values())
    assert 0 < spent < 4
    sd = (sum(e * e for e in err) / (4 - spent)) ** 0.5
    band = float(student.ppf(0.95, 4 - spent)) * 2 ** 0.5 * sd
    assert band > 0.5
    assert rem["noise"]["change_halfwidth_pct"] == pytest.approx(band)
    for name in ("baseline", "restarted"):
        row = next(r for r in rem["candidates"] if r["setting"] == name)
        assert row["throughput_change_pct"] == 0.0
        assert row["throughput_change_pct_with_noise"] == pytest.approx([-band, band])
        assert row["effect"] == "no measurable effect"
