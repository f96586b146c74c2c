"""One set of latency-limit names for the report, the twin and tune: the same parser, each
source refusing a limit it does not price (naming those it does), and the twin pricing the
tail and the end-to-end latency its SLOs are written in."""

from __future__ import annotations

import json

import pytest

from kvpressure.analysis.limits import LIMIT_NAMES, broken, parse_limits, require_priced
from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.tune.targets import load_target
from kvpressure.twin.api import build_twin
from kvpressure.twin.remedies import PRICED_LATENCIES
from twin_helpers import synthetic_run

CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"


def test_the_names_and_units():
    assert parse_limits("ttft_p99=1.5s, e2e_p99=20s,itl_p50=800us") == {
        "ttft_p99_s": 1.5, "e2e_p99_s": 20.0, "itl_p50_s": pytest.approx(8e-4)}
    assert parse_limits("") == {}
    for bad in ("ttft_p42=2s", "tpot=2s", "ttft_p95=fast", "itl_p95=0ms", "ttft_p95"):
        with pytest.raises(InputError, match="--limits"):
            parse_limits(bad)
    assert broken({"ttft_p95_s": 0.31, "itl_p95_s": 0.05},
                  {"ttft_p95_s": 0.3, "itl_p95_s": 0.08}) == ["ttft_p95 310 ms > 300 ms"]


def test_a_source_refuses_a_latency_it_does_not_price_naming_those_it_does():
    require_priced({"ttft_p95_s": 1.0}, ("ttft_p95_s",), "the twin")
    with pytest.raises(InputError, match=r"--limits e2e_p99: not priced by an experiment, "
                                         r"which prices ttft_mean, ttft_p95$"):
        require_priced({"e2e_p99_s": 1.0}, ("ttft_mean_s", "ttft_p95_s"), "an experiment")


def test_the_twin_prices_every_name_and_its_tails_are_ordered(tmp_path):
    assert set(PRICED_LATENCIES) == set(LIMIT_NAMES)
    twin = build_twin(synthetic_run(tmp_path / "run", levels=(2, 4, 8)))
    twin.fit(bootstrap=10)
    for c in (2, 8):
        p = twin.predict_level(c)
        assert set(PRICED_LATENCIES) <= set(p)
        assert p["ttft_p50_s"] <= p["ttft_p95_s"] <= p["ttft_p99_s"]
        assert p["itl_p50_s"] <= p["itl_p95_s"] <= p["itl_p99_s"]
        # a request's end-to-end latency holds its first token and every gap after it
        assert p["ttft_mean_s"] < p["e2e_mean_s"] <= p["e2e_p99_s"]
        assert 0 < p["tpot_mean_s"] <= p["tpot_p99_s"]
    # the tune target of a twin prices the same names as the twin
    assert set(load_target(str(tmp_path / "run")).latencies) == set(PRICED_LATENCIES)


def test_an_e2e_limit_decides_the_twins_recommendation(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run", levels=(2, 4, 6, 8))
    assert main(["twin", str(run), "--out", str(tmp_path / "t"), "--limits", "e2e_p99=1ms",
                 "--bootstrap", "20"]) == 0
    rem = json.loads((tmp_path / "t" / "twin.json").read_text())["remedies"]
    assert rem["limits"] == {"e2e_p99_s": 0.001}
    assert not any(c["meets_limits"] for c in rem["candidates"])
    assert rem["recommendation"]["text"].startswith("no setting tried meets the limits")


def test_tune_on_an_experiment_refuses_a_tail_it_does_not_price(tmp_path, capsys):
    assert main(["tune", str(CI_SMALL), "--param", "max_num_seqs=8,16", "--limits",
                 "e2e_p99=5s", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "--limits e2e_p99: not priced by a" in err and "prices ttft_p50" in err
    assert not (tmp_path / "t").exists()


def test_the_simulated_remedies_refuse_a_limit_they_do_not_price():
    from kvpressure.analysis.recommendation import PRICED_LATENCIES, recommend

    assert PRICED_LATENCIES == ("ttft_p95_s", "itl_p95_s")
    with pytest.raises(InputError, match="limits itl_p99: not priced by the simulated remedies"):
        recommend({"baseline": {}, "outcomes": []}, {}, limits={"itl_p99_s": 0.1})


def test_goodput_in_vllm_bench_serves_words():
    from kvpressure.analysis.limits import parse_goodput

    assert parse_goodput(["ttft:500", "tpot:50"]) == {
        "ttft_limit_s": 0.5, "tpot_limit_s": 0.05, "e2el_limit_s": None}
    assert parse_goodput(["e2el:12000"])["e2el_limit_s"] == 12.0
    for bad in (["ttft=500"], ["itl:5"], ["ttft:0"], ["ttft:500ms"], []):
        with pytest.raises(InputError, match="--goodput"):
            parse_goodput(bad)


def test_goodput_counts_a_request_within_every_limit_given():
    import numpy as np
    import pandas as pd

    from kvpressure.investigation.latency import within_limits

    reqs = pd.DataFrame({"ttft_s": [0.2, 0.4, 0.2, 0.2], "tpot_s": [0.01, 0.01, 0.03, np.nan],
                         "e2e_s": [2.0, 2.0, 2.0, 9.0]})
    assert within_limits(reqs, 0.3, 0.02) == 0.5  # the second and third fail; the last has no TPOT
    assert within_limits(reqs, 0.3, 0.02, 5.0) == 0.25  # the last also fails E2E
    assert within_limits(reqs, None, None, 5.0) == 0.75
    assert within_limits(reqs, 0.3, None) == 0.75
    assert np.isnan(within_limits(reqs.assign(e2e_s=np.nan), 0.3, None, 5.0))


def test_report_takes_goodput_and_limits_in_their_own_words(tmp_path, capsys):
    import argparse

    from kvpressure.commands.report import _params, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--experiment", "ci_small", "--out", "x", "--goodput", "ttft:500",
                              "e2el:9000", "--limits", "itl_p95=80ms"])
    assert _params(args) == {"ttft_limit_s": 0.5, "tpot_limit_s": None, "e2el_limit_s": 9.0,
                             "limits": "itl_p95=80ms"}
    args = parser.parse_args(["--experiment", "ci_small", "--out", "x", "--goodput", "ttft:500",
                              "--param", "ttft_limit_s=2"])
    with pytest.raises(InputError, match="--goodput and --param ttft_limit_s: give one"):
        _params(args)
    assert main(["report", "--experiment", "ci_small", "--out", str(tmp_path / "r"),
                 "--limits", "tpot_p95=1s"]) == 2
    assert "--limits 'tpot_p95=1s'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
