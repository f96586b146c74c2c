"""Knee, peak, plateau and decline of throughput-vs-concurrency curves; the ``knee`` command."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis.knee import find_knee, knee_summary, robust_roughness
from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.jsonable import to_jsonable


def rise_then_fall(x: np.ndarray, knee: float, slope: float, fall: float) -> np.ndarray:
    return np.where(x <= knee, slope * x, slope * knee - fall * (x - knee))


def test_clean_curve_with_known_knee_and_decline():
    x = np.array([16, 24, 32, 40, 48, 56, 64.0])
    y = rise_then_fall(x, 32, 10.0, 3.0)  # peak 320 at 32, 224 at 64
    k = find_knee(x, y)
    assert k.knee_x == 32
    assert (k.peak_x, k.peak_y) == (32, 320)
    assert k.declines
    # End of curve = mean of the last two levels (248 and 224) = 236: (320 - 236) / 320.
    assert k.decline_pct == pytest.approx(100 * 84 / 320, abs=1e-3)
    assert k.plateau == (32, 32)


def test_saturating_curve_has_plateau_and_no_decline():
    x = [8, 16, 32, 64, 128]
    y = [80, 160, 320, 320, 320]
    k = find_knee(x, y)
    assert k.knee_x == 32
    assert k.plateau == (32, 128)
    assert not k.declines and k.decline_pct == 0


def test_plateau_tolerance_widens_plateau():
    x = [1, 2, 4, 8, 16, 32]
    y = [10, 20, 40, 76, 80, 77]
    # noise_sd=0: the tolerance alone sets the band (80 * 0.02 = 1.6; 80 * 0.05 = 4).
    assert find_knee(x, y, plateau_tol=0.02, noise_sd=0).plateau == (16, 16)
    assert find_knee(x, y, plateau_tol=0.05, noise_sd=0).plateau == (8, 32)


def test_still_rising_curve_has_no_knee():
    k = find_knee([1, 2, 4, 8, 16, 32], [10, 20, 40, 80, 160, 320])
    assert k.knee_x is None and k.still_rising
    assert k.peak_x == 32


def test_noisy_curves_knee_within_one_level_in_95_of_100():
    """100 seeded noisy versions (3% multiplicative noise) of curves with a known knee."""
    rng = np.random.default_rng(20240601)
    cases = [
        (np.array([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128.0]), 16, 0.0),
        (np.array([8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128.0]), 48, 2.0),
        (np.array([16, 24, 32, 40, 48, 56, 64.0]), 32, 3.0),
    ]
    for x, knee, fall in cases:
        y0 = rise_then_fall(x, knee, 10.0, fall)
        hits = 0
        for _ in range(100):
            y = y0 * (1 + rng.normal(0, 0.03, len(x)))
            found = find_knee(x, y).knee_x
            if found is not None and abs(
                int(np.searchsorted(x, found)) - int(np.searchsorted(x, knee))
            ) <= 1:
                hits += 1
        assert hits >= 95, (knee, hits)


def test_flat_noisy_tail_rarely_called_a_decline():
    rng = np.random.default_rng(7)
    x = np.array([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128.0])
    y0 = np.minimum(x, 16) * 10
    false = sum(find_knee(x, y0 * (1 + rng.normal(0, 0.03, len(x)))).declines for _ in range(100))
    assert false <= 15


def test_repeats_are_averaged_and_their_spread_is_the_noise():
    x = [16, 16, 32, 32, 64, 64]
    y = [100, 104, 180, 176, 150, 154]
    k = find_knee(x, y)
    assert [p.y for p in k.points] == [102, 178, 152]
    assert all(p.n == 2 for p in k.points)
    # Pooled sd of pairs differing by 4: sqrt(8) each.
    assert k.noise_sd == pytest.approx(np.sqrt(8))
    assert k.noise_source.startswith("spread of repeated")
    assert k.declines and k.decline_pct == pytest.approx(100 * 26 / 178, abs=1e-3)


def test_decline_within_repeat_noise_is_not_a_decline():
    x = [16, 16, 32, 32, 64, 64]
    y = [100, 104, 180, 160, 170, 150]  # means 102, 170, 160; sd of repeats ~14
    assert not find_knee(x, y, min_decline_pct=2.0).declines


def test_sustained_range_and_decline_onset():
    x = [8, 16, 24, 32, 40, 48, 64, 96]
    rise = [218, 289, 329, 353, 369]
    k = find_knee(x, rise + [298, 225, 225], noise_sd=0)
    # band = 5% of 369 = 18.45: 298 is out, so the curve holds to 40 and turns at 48.
    assert (k.sustained_end, k.decline_onset) == (40, 48)
    assert k.plateau_band == pytest.approx(0.05 * 369)
    k = find_knee(x, rise + [369, 369, 369], noise_sd=0)
    assert (k.sustained_end, k.decline_onset) == (96, None)
    # A dip that recovers does not end the sustained range.
    k = find_knee(x, rise + [340, 365, 369], noise_sd=0)
    assert (k.sustained_end, k.decline_onset) == (96, None)


def test_robust_roughness_hand_worked_and_unbiased():
    # The largest (|-4|) and its neighbours (1, 0.5) are left out: median |.| of 0.2, 0.3, 0.4.
    r = np.array([0.2, 1.0, -4.0, 0.5, 0.3, 0.4])
    assert robust_roughness(r) == pytest.approx(0.3 / 0.6745)
    # None would remain: every difference counts.
    assert robust_roughness(np.array([1.0, -3.0])) == pytest.approx(2.0 / 0.6745)
    # One remains: it is the estimate (the corner's window is shape, not noise).
    assert robust_roughness(np.array([0.5, -3.0, 1.0, 0.1])) == pytest.approx(0.1 / 0.6745)
    # Normal noise of sd 2 on independent values: close to 2 once the window is left out.
    rng = np.random.default_rng(3)
    z = rng.normal(0, 2.0, size=(4000, 12))
    assert np.median([robust_roughness(v) for v in z]) == pytest.approx(2.0, rel=0.15)


def test_one_noisy_level_does_not_widen_the_plateau_band():
    # A published-style sweep: 40 is 1% below the plateau, 32 is 8% below it; the level at 24
    # reads 8% low. The old scale of all second differences took the three it moves for noise
    # (4.2% of the peak), so the band (2 x noise) reached 32 and the plateau began a level early.
    x = [8, 16, 24, 32, 40, 48, 64, 96, 128]
    y = [250, 500, 740 * 0.92, 930, 1000, 1010, 1015, 1012, 1008]
    k = find_knee(x, y)
    assert k.plateau == (40, 128)
    assert k.knee_x == 40
    assert k.noise_sd / k.peak_y < 0.01
    assert k.plateau_band == pytest.approx(0.05 * 1015)


def test_noisy_plateau_sweep_knee_at_the_bend():
    # Doubling steps to 32, then a plateau with +-1.5% noise on every held level.
    x = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]
    y = [31, 62, 124, 248, 496, 990, 1005, 975, 1002, 985]
    k = find_knee(x, y)
    assert k.knee_x == 32 and k.plateau == (32, 128)
    assert not k.declines


def test_near_linear_negative_control_gets_no_early_knee():
    # Rises almost linearly (x ** 0.97) with 2% noise to the last level: no knee before the
    # second-to-last level in 200 seeded draws, on even and doubling steps.
    rng = np.random.default_rng(5)
    for x in (np.array([8, 16, 24, 32, 40, 48, 56, 64.0]), np.array([1, 2, 4, 8, 16, 32, 64.0])):
        for _ in range(200):
            y = 12.5 * x**0.97 * (1 + rng.normal(0, 0.02, len(x)))
            k = find_knee(x, y)
            assert k.knee_x is None or k.knee_x >= x[-2], (y, k.knee_x)
    k = find_knee([8, 16, 24, 32, 40, 48, 56, 64], [100, 201, 297, 402, 499, 596, 703, 795])
    assert k.knee_x is None and k.still_rising


def test_a_sharp_fall_after_an_early_peak_is_a_decline():
    # Six levels, the peak third: too few held levels, so the noise is read over every level,
    # where the corner at the peak moves three of the four second differences. Left out, the
    # flat tail shows little noise, and a 17% fall is a decline.
    k = find_knee([4, 8, 16, 24, 32, 48], [115.6, 174.7, 239.8, 206.3, 198.6, 198.6])
    assert k.knee_x == 16 and k.declines
    assert k.decline_pct == pytest.approx(100 * (239.8 - 198.6) / 239.8, abs=1e-3)


def test_one_or_two_levels_give_no_knee_and_say_why():
    one = find_knee([32], [900.0])
    assert one.knee_x is None and "a point" in one.notes[0]
    two = find_knee([8, 32], [100, 90])
    assert two.knee_x is None and two.peak_x == 8
    assert "2 levels: a slope" in two.notes[0]
    # Repeats of two levels are still two levels.
    assert find_knee([8, 8, 32, 32], [100, 102, 150, 148]).knee_x is None


def test_roughness_noise_ignores_the_shape_of_the_curve():
    x = np.array([8, 16, 24, 32, 40, 48, 64, 96.0])
    rise = np.array([218, 289, 329, 353, 369.0])
    falls = find_knee(x, np.r_[rise, 298, 225, 225])
    # The fall after the peak does not enter the estimate: it is the rising part's own.
    assert falls.noise_sd == pytest.approx(find_knee(x[:5], rise).noise_sd)
    assert falls.noise_source.startswith("roughness")
    # A straight rise then a hold leaves no roughness at all; the corner is ignored.
    k = find_knee(x, np.minimum(x, 40) * 10)
    assert k.noise_sd == 0 and k.knee_x == 40


def test_roughness_noise_tracks_measurement_noise():
    rng = np.random.default_rng(11)
    x = np.array([4, 8, 16, 24, 32, 48, 64, 96, 128.0])
    y0 = rise_then_fall(x, 64, 10.0, 2.0)
    rel = [find_knee(x, y0 * (1 + rng.normal(0, 0.03, len(x)))).noise_sd / 640 for _ in range(200)]
    assert 0.02 <= float(np.median(rel)) <= 0.05


def test_bad_input():
    with pytest.raises(InputError, match="x has 3 values, y has 2"):
        find_knee([1, 2, 3], [1, 2])
    with pytest.raises(InputError):
        find_knee([np.nan], [1.0])


def test_result_is_jsonable():
    d = to_jsonable(find_knee([1, 2, 4, 8], [1.0, 2.0, 3.0, 3.0]).model_dump())
    json.dumps(d)
    assert set(knee_summary(find_knee([1, 2, 4, 8], [1.0, 2, 3, 3]), "g")) == {
        "group", "knee_x", "peak_x", "peak_y", "plateau", "declines", "decline_pct", "points"}


# ------------------------------------------------------------------ the command


def test_cli_runs_csv_with_two_columns_and_groups(tmp_path, capsys):
    p = tmp_path / "runs.csv"
    x = [16, 24, 32, 40, 48, 56, 64]
    frame = pd.DataFrame({
        "variant": ["a"] * 7 + ["b"] * 7,
        "concurrency": x + x,
        "output_throughput": list(rise_then_fall(np.array(x, float), 32, 10, 3))
        + list(rise_then_fall(np.array(x, float), 48, 10, 0)),
    })
    frame.to_csv(p, index=False)
    assert main(["knee", str(p), "--group", "variant"]) == 0
    lines = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    assert [d["group"] for d in lines] == ["a", "b"]
    assert lines[0]["knee_x"] == 32 and lines[0]["declines"] is True
    assert lines[1]["knee_x"] == 48 and lines[1]["declines"] is False
    assert list(lines[0]) == ["group", "knee_x", "peak_x", "peak_y", "plateau", "declines",
                              "decline_pct", "points"]

    # Without --group a table with variants still gives one curve per variant, never a pool
    assert main(["knee", str(p)]) == 0
    assert [json.loads(s)["group"] for s in capsys.readouterr().out.splitlines()] == ["a", "b"]
    assert main(["knee", str(p), "--group", "none"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert pooled["group"] is None and pooled["points"][0]["n"] == 2

    frame[["concurrency", "output_throughput"]].iloc[:7].to_csv(p, index=False)
    assert main(["knee", str(p)]) == 0
    assert json.loads(capsys.readouterr().out)["group"] is None


def test_cli_missing_column_names_column_and_file(tmp_path, capsys):
    p = tmp_path / "runs.csv"
    pd.DataFrame({"concurrency": [1, 2, 4], "throughput": [1, 2, 3]}).to_csv(p, index=False)
    assert main(["knee", str(p)]) == 2
    err = capsys.readouterr().err
    assert "output_throughput" in err and "runs.csv" in err


def test_cli_bench_folder(tmp_path, capsys):
    for c, tput in [(1, 50.0), (4, 190.0), (16, 600.0), (32, 640.0), (64, 560.0)]:
        (tmp_path / f"bench-c{c}.json").write_text(
            json.dumps({"max_concurrency": c, "output_throughput": tput, "completed": 100,
                        "duration": 10.0}))
    assert main(["knee", str(tmp_path)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["peak_x"] == 32 and d["peak_y"] == 640
    assert [p["x"] for p in d["points"]] == [1, 4, 16, 32, 64]
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["knee", str(tmp_path)]) == 2


def test_short_sweep_from_near_zero_keeps_a_plateau_near_the_peak():
    # Four levels without repeats: too few to read noise from roughness, so the plateau is the
    # tolerance band around the peak, not a "noise" as large as the peak itself.
    res = find_knee([1, 8, 16, 32], [1.4, 300.0, 700.0, 1024.0])
    assert res.noise_sd is None and res.plateau == (32.0, 32.0)
