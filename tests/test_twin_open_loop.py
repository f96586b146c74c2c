"""The twin of an open loop (twin/open_loop.py): levels keyed by request rate, arrivals at the
measured send times, the step time fitted on the server's step trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvpressure.errors import InputError
from kvpressure.twin.fit import FitRefused
from kvpressure.twin.workload import LevelWorkload, drawn_arrivals

RATES = (2.0, 4.0, 8.0, 16.0)
# A server slower than twin_helpers.TRUE, so that the higher rates saturate it: an open loop's
# step overhead is read from the seconds in which the engine never idled.
SLOW = dict(t0=8e-3, t_prefill_token=1e-4, t_decode_seq=8e-4, t_decode_ctx=0.0,
            t_prefill_attn=0.0)


def _open_run(folder, *, log: bool = True, rates=RATES):
    """Open-loop levels simulated with known coefficients, written as an ingested bench sweep
    (a detailed result per rate) with the server's step log."""
    from kvpressure.twin.synthetic import synthetic_workloads, write_synthetic_run
    from twin_helpers import SETTINGS, TTFT_OFFSET, write_step_log

    loads = synthetic_workloads(rates, input_len=(32, 400), output_len=(16, 96),
                                requests_per_level=96, open_loop=True)
    runs = write_synthetic_run(folder, SETTINGS, loads, SLOW, ttft_offset=TTFT_OFFSET)
    windows, _ = write_step_log(folder / ("server.log" if log else "elsewhere.log"), SETTINGS,
                                loads, SLOW)
    runs["t_start"] = [a for a, _ in windows]
    runs["t_end"] = [b for _, b in windows]
    runs.to_csv(folder / "runs.csv", index=False)
    return loads, runs


def test_drawn_arrivals_have_the_rate_and_start_at_zero():
    t = np.array(drawn_arrivals(4001, 5.0, seed=1))
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    # 4000 exponential gaps of mean 0.2 s: the mean within 5% (about 3 standard errors).
    assert np.mean(np.diff(t)) == pytest.approx(0.2, rel=0.05)
    # Burstiness 4 (gamma shape 4): the same mean, the gaps' spread halved.
    b = np.diff(drawn_arrivals(4001, 5.0, burstiness=4.0, seed=1))
    assert np.mean(b) == pytest.approx(0.2, rel=0.05)
    assert np.std(b) == pytest.approx(0.1, rel=0.08)
    assert drawn_arrivals(3, float("inf")) == (0.0, 0.0, 0.0)


def test_an_open_level_is_simulated_at_its_arrivals():
    """Two requests far apart never share a step: the second waits for its arrival, and the
    level lasts until it is done (an open loop in time, not the closed loop's next step)."""
    from kvpressure.twin.simulate import simulate_level
    from twin_helpers import SETTINGS

    w = LevelWorkload(0, (100, 100), (10, 10), True, request_rate=0.1,
                      arrival_times_s=(0.0, 10.0))
    got = simulate_level(SETTINGS, w, {"t0": 0.01})
    # Each request: one prefill step and 9 decode steps of 10 ms; the second starts at 10 s.
    assert got["duration_s"] == pytest.approx(10.0 + 10 * 0.01)
    assert got["max_running"] == 1
    assert got["ttft_mean_s"] == pytest.approx(0.01)
    assert got["request_rate"] == 0.1


def test_the_open_twin_fits_on_the_step_trace_and_matches_the_levels(tmp_path):
    from kvpressure.twin.api import build_twin
    from twin_helpers import TTFT_OFFSET

    loads, runs = _open_run(tmp_path)
    twin = build_twin(tmp_path)
    assert twin.open_loop and twin.key == "request_rate"
    assert sorted(twin.workloads) == list(RATES)
    # The arrivals are the bench result's send times, not a new draw.
    for r, w in twin.workloads.items():
        assert w.arrivals_measured
        assert w.arrival_times_s == pytest.approx(loads[r].arrival_times_s, abs=1e-9)
    fit = twin.fit(bootstrap=40)
    for p in ("t0", "t_prefill_token", "t_decode_seq"):
        assert fit.source[p].startswith("step trace")
        # The time outside the logged elapsed time comes from the busy seconds only, fewer in
        # an open loop than in a closed one (the closed-loop test holds 5%).
        assert fit.theta[p] == pytest.approx(SLOW[p], rel=0.1)
    # Queueing makes every level's mean TTFT 0.4 s or more, so the 10 ms offset is within
    # their noise: the fit is held to the TTFTs themselves, and to an offset of the right size.
    assert 0.0 <= fit.theta["ttft_offset"] <= 3 * TTFT_OFFSET
    ttft = fit.rows[fit.rows["stat"] == "ttft_mean_s"]
    assert len(ttft) == len(RATES) and ttft["error_pct"].abs().max() < 2.0
    report = twin.fit_report()
    t = report.table
    assert list(t["request_rate"]) == list(RATES)
    assert t["output_throughput_error_pct"].abs().max() < 3.0
    # The decisions follow the arrivals and the step time: with the step time recovered, the
    # preemptions per rate are the measured ones (rates past the pool's capacity preempt).
    assert (t["preemptions_measured"] > 0).any()
    assert (t["preemptions_twin"] - t["preemptions_measured"]).abs().max() <= 2
    assert report.verdict.fits, report.verdict.text
    # Below saturation an open loop's throughput is its arrival rate's: it grows with it.
    low = t[t["request_rate"] <= 4.0]["output_throughput_measured"].to_numpy()
    assert low[1] > 1.5 * low[0]
    lo, hi = t["output_throughput_twin_p05"], t["output_throughput_twin_p95"]
    assert ((lo <= t["output_throughput_twin"] * 1.001)
            & (t["output_throughput_twin"] * 0.999 <= hi)).all()


@pytest.mark.slow
def test_open_twin_remedies_are_keyed_by_rate_and_written(tmp_path):
    from kvpressure.twin.output import make_twin_folder
    from twin_helpers import SETTINGS

    _open_run(tmp_path / "run")
    summary = make_twin_folder(tmp_path / "run", tmp_path / "twin", bootstrap=20,
                               focus=16)
    doc = json.loads((tmp_path / "twin" / "twin.json").read_text())
    assert doc["load"] == {"key": "request_rate", "open_loop": True}
    rem = doc["remedies"]
    assert rem["focus"]["request_rate"] == 16.0
    assert rem["focus"]["name"] == "request rate 16 req/s"
    by = {c["setting"]: c for c in rem["candidates"]}
    # The pool holds fewer sequences than max_num_seqs: lowering it is priced, and at the
    # focus rate (past saturation) it removes preemptions.
    holds = rem["pool_holds_sequences"]
    assert holds < SETTINGS["max_num_seqs"]
    low = by["lower_max_num_seqs"]
    assert low["overrides"] == {"max_num_seqs": holds}
    assert low["preemptions"] < by["baseline"]["preemptions"]
    assert "request rate 16 req/s" in summary["recommendation"]
    md = (tmp_path / "twin" / "twin.md").read_text()
    assert "| req/s |" in md and "## Remedies at request rate 16 req/s" in md
    assert any("open loop" in a and "send time" in a for a in doc["assumptions"])


def test_an_open_twin_without_a_step_trace_is_refused_saying_what_is_needed(tmp_path):
    from kvpressure.twin.api import build_twin

    _open_run(tmp_path, log=False)
    twin = build_twin(tmp_path)
    assert twin.open_loop and twin.step_trace is None
    with pytest.raises(FitRefused, match="--enable-logging-iteration-details"):
        twin.fit(bootstrap=0)
    with pytest.raises(InputError, match="not fitted"):
        twin.predict_level(4.0)


def test_an_open_loop_without_send_times_draws_its_arrivals_and_says_so(tmp_path):
    from kvpressure.twin.api import build_twin

    _open_run(tmp_path)
    for path in (tmp_path / "bench").glob("*.json"):
        res = json.loads(path.read_text())
        del res["start_times"]
        path.write_text(json.dumps(res))
    twin = build_twin(tmp_path)
    w = twin.workloads[8.0]
    assert not w.arrivals_measured and w.arrival_times_s == drawn_arrivals(96, 8.0)
    said = [a for a in twin.assumptions() if "no send times" in a]
    assert said and "2, 4, 8, 16" in said[0]


def test_a_folder_with_closed_and_open_runs_keeps_the_closed_ones(tmp_path):
    from kvpressure.twin.measured import load_measured

    _, runs = _open_run(tmp_path, rates=(2.0, 4.0))
    runs.loc[0, ["concurrency", "request_rate"]] = [4, float("inf")]
    runs.to_csv(tmp_path / "runs.csv", index=False)
    m = load_measured(tmp_path)
    assert m.key == "concurrency" and m.keys == [4]
    assert any("1 run(s) without a concurrency level left out" in n for n in m.notes)


def test_step_time_scatter_keeps_the_mean_and_follows_its_seed():
    from kvpressure.twin.step_time import TwinStepTime

    work = {"num_prefill_tokens": np.zeros(20000), "num_decode_seqs": np.ones(20000)}
    a = TwinStepTime({"t0": 0.01}, noise=0.3, seed=1).step_time(work)
    # Log-normal of mean 1: 20000 draws of spread 0.3 hold the mean to about 0.2%.
    assert np.mean(a) == pytest.approx(0.01, rel=0.01)
    assert np.std(np.log(a)) == pytest.approx(0.3, rel=0.03)
    assert np.array_equal(a, TwinStepTime({"t0": 0.01}, noise=0.3, seed=1).step_time(work))
    assert not np.array_equal(a, TwinStepTime({"t0": 0.01}, noise=0.3, seed=2).step_time(work))
    assert np.all(TwinStepTime({"t0": 0.01}).step_time(work) == 0.01)
    # An idle step costs nothing, scattered or not.
    assert TwinStepTime({"t0": 0.01}, noise=0.3).step_time(
        {"num_prefill_tokens": 0, "num_decode_seqs": 0}) == 0.0
    with pytest.raises(InputError, match="noise"):
        TwinStepTime({"t0": 0.01}, noise=-1)


def test_scattered_step_times_move_an_open_loop_but_never_a_closed_one():
    from kvpressure.twin.simulate import simulate_level
    from kvpressure.twin.synthetic import synthetic_workloads
    from twin_helpers import SETTINGS

    closed = synthetic_workloads((12,), input_len=(32, 400), output_len=(16, 96),
                                 requests_per_level=64)[12]
    exact = simulate_level(SETTINGS, closed, SLOW)
    for seed in (1, 2, 3):
        got = simulate_level(SETTINGS, closed, SLOW, noise=0.3, seed=seed)
        # A closed loop's decisions do not depend on time (docs/scheduler.md).
        assert (got["preemptions"], got["engine_steps"]) == (exact["preemptions"],
                                                            exact["engine_steps"])
    open_ = synthetic_workloads((4.0,), input_len=(32, 400), output_len=(16, 96),
                                requests_per_level=96, open_loop=True)[4.0]
    runs = {(r["preemptions"], r["engine_steps"]) for r in (
        simulate_level(SETTINGS, open_, SLOW, noise=0.3, seed=s) for s in range(1, 6))}
    assert len(runs) > 1


def test_a_level_whose_replays_disagree_is_a_caveat_not_a_miss():
    import pandas as pd

    from kvpressure.twin.fit_report import comparison_table, verdict

    measured = pd.DataFrame({"request_rate": [2.0, 3.0, 6.0], "output_throughput": [100.0,
                             150.0, 160.0], "preemptions": [0.0, 15.0, 290.0],
                             "recompute_ratio_low": np.nan, "recompute_ratio_high": np.nan})
    twin = {x: {"output_throughput": t, "preemptions": p, "recompute_ratio": 0.0,
                **{k: np.nan for k in ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s",
                                       "mean_running", "tokens_per_step")}}
            for x, t, p in ((2.0, 101.0, 0.0), (3.0, 151.0, 52.0), (6.0, 158.0, 277.0))}
    band = {x: (np.nan, np.nan) for x in twin}

    def judged(ranges):
        table = comparison_table(measured, twin, band, key="request_rate",
                                 preemption_range=ranges)
        return verdict(table, key="request_rate")

    # Replays 29-87 at 3 req/s (more than twice apart): 15 measured is a caveat.
    v = judged({2.0: (0, 0), 3.0: (29, 87), 6.0: (262, 284)})
    assert v.fits and [m["request_rate"] for m in v.preemptions_unstable] == [3.0]
    assert "swing with the steps' timing at rate=3 (the twin's replays 29-87, measured 15)" \
        in v.text
    # Replays 45-60 agree with each other: 15 measured is a miss, named with their range.
    v = judged({2.0: (0, 0), 3.0: (45, 60), 6.0: (262, 284)})
    assert not v.fits and "rate=3 (15 measured, 52 twin, 45-60 over its replays)" in v.text
    # 290 measured at 6 req/s lies within 10% of the replays' 262-284: no miss there.
    assert [m["request_rate"] for m in v.preemption_misses] == [3.0]


def test_runs_capped_at_a_concurrency_and_sent_at_a_rate_are_refused(tmp_path):
    from kvpressure.twin.api import build_twin

    _, runs = _open_run(tmp_path, rates=(2.0, 4.0))
    runs["concurrency"] = 8
    runs.to_csv(tmp_path / "runs.csv", index=False)
    with pytest.raises(InputError, match=r"2 run\(s\) both capped at a concurrency and sent at "
                                         r"a finite request rate \(e\.g\. concurrency 8 at 2 "
                                         r"req/s"):
        build_twin(tmp_path)
    # The same concurrency levels sent as fast as the clients allow are closed loops.
    runs["request_rate"] = float("inf")
    runs.to_csv(tmp_path / "runs.csv", index=False)
    assert not build_twin(tmp_path).open_loop


def test_the_cli_names_the_option_an_open_loop_refuses(tmp_path, capsys):
    from kvpressure.cli import main

    _open_run(tmp_path / "run", rates=(2.0, 4.0))
    assert main(["twin", str(tmp_path / "run"), "--out", str(tmp_path / "t"),
                 "--return-steps", "2"]) == 2
    assert "--return-steps (return_steps): an open loop has no clients" in capsys.readouterr().err
    assert main(["twin", str(tmp_path / "run"), "--out", str(tmp_path / "t"), "--focus",
                 "3"]) == 2
    assert "--focus 3: not a measured level (2, 4)" in capsys.readouterr().err


def test_an_open_twin_is_tuned_by_request_rate(tmp_path):
    from dataclasses import replace

    from kvpressure.tune.targets import TwinTarget
    from kvpressure.twin.api import build_twin

    _open_run(tmp_path, rates=(2.0, 16.0))
    twin = build_twin(tmp_path)
    twin.fit(bootstrap=0)
    target = TwinTarget(twin, "open")
    assert target.level_name == "request_rate" and target.levels == [2.0, 16.0]
    base = target.evaluate({})
    fewer = target.evaluate({"max_num_seqs": 4})
    assert [r["level"] for r in base["levels"]] == [2.0, 16.0]
    # The same levels as the twin predicts them, and a setting changes them.
    assert base["levels"][1]["preemptions"] == twin.predict_level(16.0)["preemptions"] > 0
    assert fewer["levels"][1]["preemptions"] < base["levels"][1]["preemptions"]
    # A change of arrivals is another target: the identity holds them.
    moved = build_twin(tmp_path)
    moved.fit(bootstrap=0)
    w = moved.workloads[2.0]
    moved.workloads[2.0] = replace(w, arrival_times_s=tuple(t * 2 for t in w.arrival_times_s))
    assert TwinTarget(moved, "open").identity() != target.identity()
