"""The twin's step-time fit: the linearity it rests on, recovery of known coefficients, and
refusal of what the data cannot support."""

from __future__ import annotations

import numpy as np
import pytest

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.twin.api import build_twin
from kvpressure.twin.basis import simulate_basis
from kvpressure.twin.fit import PARAMETERS, FitRefused
from kvpressure.twin.simulate import simulate_level
from kvpressure.twin.step_time import COEFFICIENTS
from kvpressure.twin.synthetic import synthetic_workloads
from twin_helpers import LEVELS, SETTINGS, TRUE, TTFT_OFFSET, synthetic_run


def test_closed_loop_times_are_linear_in_the_coefficients():
    # The fit rests on this: one simulation per coefficient predicts a simulation with any
    # coefficients, request by request.
    w = synthetic_workloads([6], input_len=(32, 400), output_len=(16, 96),
                            requests_per_level=24)[6]
    basis = simulate_basis(SETTINGS, w)
    theta = np.array([2e-3, 5e-5, 1e-4, 3e-7, 2e-9])
    sim = simulate_level(SETTINGS, w, dict(zip(COEFFICIENTS, theta, strict=True)))
    assert basis.preemptions > 0  # the pool is too small for 6: decisions are not trivial
    assert basis.duration @ theta == pytest.approx(sim["duration_s"], rel=1e-9)
    assert basis.itl_mean @ theta == pytest.approx(sim["itl_mean_s"], rel=1e-9)
    assert (basis.ttft @ theta).mean() == pytest.approx(sim["ttft_mean_s"], rel=1e-9)


def test_noise_free_sweep_recovers_the_coefficients_exactly(tmp_path):
    twin = build_twin(synthetic_run(tmp_path / "run"))
    fit = twin.fit(bootstrap=20)
    for name in ("t0", "t_prefill_token", "t_decode_seq"):
        assert fit.source[name] == "fitted"
        assert fit.theta[name] == pytest.approx(TRUE[name], rel=1e-3)
    assert fit.theta["ttft_offset"] == pytest.approx(TTFT_OFFSET, rel=1e-3)
    # The workload gives the attention terms too little leverage: they are fixed, and say so.
    for name in ("t_decode_ctx", "t_prefill_attn"):
        assert fit.source[name].startswith("default 0 (not identifiable")


def test_noisy_sweep_recovers_the_coefficients_within_their_intervals(tmp_path):
    # 1% run-to-run noise on every level's times: each fitted coefficient's bootstrap 90%
    # interval holds the true value, the main per-step cost is within 10%, and the twin's
    # throughput is within 3% at every level.
    twin = build_twin(synthetic_run(tmp_path / "run", noise=0.01))
    fit = twin.fit(bootstrap=100, seed=1)
    truth = {**TRUE, "ttft_offset": TTFT_OFFSET}
    for name in fit.free:
        lo, hi = fit.interval[name]
        assert lo <= truth[name] <= hi, (name, lo, truth[name], hi)
    assert fit.theta["t0"] == pytest.approx(TRUE["t0"], rel=0.10)
    assert fit.theta["t_prefill_token"] == pytest.approx(TRUE["t_prefill_token"], rel=0.25)
    report = twin.fit_report()
    assert report.table["output_throughput_error_pct"].abs().max() < 3.0
    assert report.verdict.fits
    assert (report.table["preemptions_twin"] == report.table["preemptions_measured"]).all()


def test_a_profile_supplies_what_the_data_cannot_identify(tmp_path):
    twin = build_twin(synthetic_run(tmp_path / "run"))
    twin.priors = {p: 1e-9 for p in COEFFICIENTS}
    twin.prior_source = "profile roofline (test)"
    fit = twin.fit(bootstrap=0)
    fixed = [p for p in PARAMETERS if fit.source[p] != "fitted"]
    assert fixed  # the attention terms
    for p in fixed:
        assert fit.theta[p] == 1e-9
        assert fit.source[p].startswith("profile roofline (test) (not identifiable")


def test_one_level_is_refused(tmp_path):
    twin = build_twin(synthetic_run(tmp_path / "run", levels=(8,)))
    with pytest.raises(FitRefused, match=r"1 level\(s\).*concurrency 8.*at least 3"):
        twin.fit()
    assert isinstance(FitRefused("x"), InputError)


def test_cli_refuses_one_level_with_exit_2(tmp_path, capsys):
    run = synthetic_run(tmp_path / "run", levels=(8,))
    assert main(["twin", str(run), "--out", str(tmp_path / "out")]) == 2
    assert "at least 3" in capsys.readouterr().err
    assert not (tmp_path / "out" / "twin.json").exists()


def test_leave_levels_out_predicts_the_held_out_levels(tmp_path):
    twin = build_twin(synthetic_run(tmp_path / "run", noise=0.01))
    fit = twin.fit(levels=list(LEVELS[::2]), bootstrap=50)
    assert fit.levels == list(LEVELS[::2])
    held = [c for c in LEVELS if c not in LEVELS[::2]]
    report = twin.fit_report(levels=held)
    assert report.table["concurrency"].tolist() == held
    assert report.table["output_throughput_error_pct"].abs().max() < 5.0


def test_a_report_stage_gets_the_refusal_written_down(tmp_path):
    from kvpressure.twin.output import make_twin_folder

    run = synthetic_run(tmp_path / "run", levels=(8,))
    got = make_twin_folder(run, tmp_path / "twin", refusal_ok=True)
    assert "at least 3" in got["refused"]
    assert "No twin: the twin's step time cannot be fitted from 1 level(s)" in (
        tmp_path / "twin" / "twin.md").read_text()


def test_a_steps_time_in_plain_floats_is_the_array_paths_bits():
    """The engine prices one step at a time with plain numbers; a leap prices arrays. Both
    give the same float for the same step, an empty step costs nothing."""
    import random

    from kvpressure.simulation.step_features import StepFeatures
    from kvpressure.twin.step_time import TwinStepTime

    model = TwinStepTime({"t0": 0.0031, "t_prefill_token": 1.7e-5, "t_decode_seq": 2.3e-4,
                          "t_decode_ctx": 3.1e-8, "t_prefill_attn": 1.1e-10})
    rng = random.Random(0)
    for _ in range(2000):
        f = StepFeatures(rng.choice([0, rng.randint(1, 2048)]),
                         rng.choice([0, rng.randint(1, 256)]), rng.randint(0, 4),
                         rng.randint(0, 10 ** 6), rng.random() * 1e7, rng.randint(0, 5000))
        one = model.step_time(f)
        arrays = StepFeatures(*(np.array([v]) for v in (
            f.num_prefill_tokens, f.num_decode_seqs, f.num_prefill_seqs, f.sum_decode_ctx,
            f.sum_prefill_attn, f.sum_prefill_ctx)))
        assert type(one) is float and one == model.step_time(arrays)[0]
        if not (f.num_prefill_tokens or f.num_decode_seqs):
            assert one == 0.0


def test_row_leverage_is_the_hat_matrix_diagonal():
    from kvpressure.twin.fit import row_leverage

    # one column (1, 1, 2): h_i = x_i^2 / sum x^2 = 1/6, 1/6, 4/6
    assert row_leverage(np.array([[1.0], [1.0], [2.0]])) == pytest.approx([1 / 6, 1 / 6, 4 / 6])
    # as many independent columns as rows: every row fitted exactly, leverage 1
    assert row_leverage(np.array([[1.0, 0.0], [1.0, 1.0]])) == pytest.approx([1.0, 1.0])
    # a constant and a slope over x = 0, 1, 2, 3: 1/n + (x - 1.5)^2 / 5
    a = np.column_stack([np.ones(4), np.arange(4.0)])
    assert row_leverage(a) == pytest.approx([0.7, 0.3, 0.3, 0.7])
    assert row_leverage(np.zeros((3, 0))) == pytest.approx([0.0, 0.0, 0.0])


def test_the_fit_says_how_much_of_each_levels_throughput_it_took_up(tmp_path):
    """Each fitted level's throughput row has a leverage in [0, 1]; over every row of the
    fit they sum to the coefficients it moved off 0, so the throughput rows' share is less."""
    from twin_helpers import synthetic_run

    twin = build_twin(synthetic_run(tmp_path / "run", levels=(2, 4, 6, 8)))
    fit = twin.fit(bootstrap=5)
    lev = fit.throughput_leverage
    assert sorted(lev) == [2, 4, 6, 8]
    assert all(0.0 <= v <= 1.0 + 1e-9 for v in lev.values())
    active = sum(fit.theta[p] > 0 for p in fit.free)
    assert 0 < sum(lev.values()) <= active + 1e-9
