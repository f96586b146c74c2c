"""Request lengths without per-request arrays (twin/lengths.py): vllm bench serve's random
draw, a uniform range recovered from vLLM's coarse length histograms, dataset arguments
checked against the measured totals, the means named as such."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.twin.lengths import (
    DATASET_ARGS,
    HISTOGRAMS,
    MEANS,
    _uniform_fit,
    from_dataset_args,
    from_histograms,
    from_means,
    random_dataset_lengths,
)
from kvpressure.twin.noise import NO_EFFECT, RAISES, RunNoise, change_interval

# vLLM's 1-2-5 buckets of vllm:request_prompt_tokens up to a max_model_len of 1024.
EDGES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, np.inf]


def _buckets(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values)
    edges = np.asarray(EDGES, float)
    cum = np.array([(v <= e).sum() for e in edges], float)
    return edges, np.diff(np.concatenate([[0.0], cum]))


def test_random_dataset_ranges_are_vllm_benchs():
    # --random-input-len 257 with one special token: 256 sampled, floor(192)..ceil(320), the
    # special token added back by the server's tokenizer; outputs floor(96)..ceil(160).
    ins, outs = random_dataset_lengths(5000, 257, 128, 0.25, seed=3, num_special=1)
    assert min(ins) == 193 and max(ins) == 321
    assert min(outs) == 96 and max(outs) == 160
    # every prompt length is drawn before the first output length: fewer requests, the same
    # first prompts, other outputs
    few_ins, few_outs = random_dataset_lengths(7, 257, 128, 0.25, seed=3, num_special=1)
    assert few_ins == ins[:7] and few_outs != outs[:7]
    assert random_dataset_lengths(3, 100, 10, 0.0) == ([100] * 3, [10] * 3)
    ins, outs = random_dataset_lengths(2000, 100, 10, {"input": 0.5, "output": 0.0},
                                       prefix_len=20)
    assert (min(ins), max(ins), set(outs)) == (70, 170, {10})


def test_a_uniform_range_is_recovered_from_two_coarse_buckets():
    # 256 +- 25% puts ~1/16 of the prompts in (100, 200], the rest in (200, 500]: the split
    # and the mean pin the range.
    values = random_dataset_lengths(400, 256, 128, 0.25, seed=1)[0]
    edges, counts = _buckets(values)
    a, b, pinned = _uniform_fit(edges, counts, float(np.mean(values)))
    assert pinned and abs(a - 192) <= 6 and abs(b - 320) <= 6
    # all in one bucket: any width up to its edges explains the counts; not pinned
    edges, counts = _buckets(list(range(250, 300)))
    a, b, pinned = _uniform_fit(edges, counts, 274.5)
    assert not pinned and 200 <= a <= 274 <= b <= 349
    # a shape no uniform explains (two far-apart groups around the mean)
    edges, counts = _buckets([20] * 50 + [800] * 50)
    assert _uniform_fit(edges, counts, 410.0) is None


def _series(prompts: list[int], outputs: list[int]) -> pd.DataFrame:
    """Two scrapes (before and after the requests) of both length histograms."""
    rows = []
    for family, values in (("vllm:request_prompt_tokens", prompts),
                           ("vllm:request_generation_tokens", outputs)):
        edges, counts = _buckets(values)
        for t, scale in ((0.0, 0), (10.0, 1)):
            for e, c in zip(edges, np.cumsum(counts), strict=True):
                le = "+Inf" if not np.isfinite(e) else f"{e:.1f}"
                rows.append(("log", t, f"{family}_bucket", f"le={le}", scale * float(c)))
            rows.append(("log", t, f"{family}_count", "", scale * float(len(values))))
            rows.append(("log", t, f"{family}_sum", "", scale * float(sum(values))))
    return pd.DataFrame(rows, columns=["run", "t", "metric", "labels", "value"])


def test_lengths_from_the_window_histograms_keep_the_mean_and_the_spread():
    prompts, outputs = random_dataset_lengths(64, 256, 128, 0.25, seed=2)
    got = from_histograms(_series(prompts, outputs), 0.0, 10.0, 64, seed=0)
    assert got.source == HISTOGRAMS and got.spread_known and got.drawn
    assert np.mean(got.prompt_lens) == pytest.approx(np.mean(prompts), abs=0.5)
    assert np.mean(got.output_lens) == pytest.approx(np.mean(outputs), abs=0.5)
    assert 180 <= min(got.prompt_lens) < 215 and 300 < max(got.prompt_lens) <= 335
    assert "uniform on [" in got.detail and "64 observations" in got.detail
    again = got.redrawn(5)
    assert again.prompt_lens != got.prompt_lens and again.source == HISTOGRAMS
    assert np.mean(again.prompt_lens) == pytest.approx(np.mean(prompts), abs=0.5)
    # no observation in the window: nothing to draw from
    assert from_histograms(_series(prompts, outputs), 0.0, 0.0, 64) is None


def test_dataset_arguments_are_checked_against_the_measured_totals():
    res = {"dataset_name": "random", "random_input_len": "257", "random_output_len": "128",
           "random_range_ratio": "0.25", "seed": "4"}
    ins, outs = random_dataset_lengths(32, 257, 128, 0.25, seed=4, num_special=1)
    got, adds_up = from_dataset_args(res, 32, (sum(ins), sum(outs)))
    assert adds_up and got.source == DATASET_ARGS
    assert (list(got.prompt_lens), list(got.output_lens)) == (ins, outs)
    assert "1 special token" in got.detail and "add up" in got.detail
    # outputs ended early (no --ignore-eos): the arguments give the spread, not the lengths
    got, adds_up = from_dataset_args(res, 32, (sum(ins), 0.8 * sum(outs)))
    assert not adds_up and "not the requests' own lengths" in got.detail
    # the seed not recorded: vllm bench serve's default, said
    res.pop("seed")
    got, _ = from_dataset_args(res, 32, (sum(ins), sum(outs)))
    assert "--seed 0 (the seed not recorded" in got.detail
    assert from_dataset_args({"dataset_name": "sharegpt", "random_input_len": 5,
                              "random_output_len": 5}, 4, (20, 20)) is None


def test_means_say_the_spread_is_unknown():
    got = from_means(3, 255.6, 127.2)
    assert got.prompt_lens == (256,) * 3 and got.output_lens == (127,) * 3
    assert got.source == MEANS and not got.spread_known and "not in the data" in got.detail


def test_a_change_inside_the_noise_is_no_measurable_effect():
    noise = RunNoise(2.0, "measured", True)  # a paired change moves by +-4.65%
    assert noise.change_halfwidth_pct == pytest.approx(1.645 * 2 ** 0.5 * 2.0)
    lo, hi, effect = change_interval(3.0, 2.5, 3.5, None, noise, True)
    assert effect == NO_EFFECT and lo < 0 < hi
    lo, hi, effect = change_interval(12.0, 10.0, 14.0, np.array([10.0, 12.0, 14.0]), noise,
                                     True)
    assert effect == RAISES and lo == pytest.approx(
        12 - (2 ** 2 + (1.645 * 2) ** 2 + noise.change_halfwidth_pct ** 2) ** 0.5)
    # the same change with the spread of lengths unknown: its sign cannot be told
    lo, hi, effect = change_interval(12.0, 10.0, 14.0, None, noise, False)
    assert effect == NO_EFFECT and lo == 0.0


def test_a_noise_measured_on_few_values_takes_students_t():
    import pandas as pd

    from kvpressure.twin.noise import run_to_run_noise

    # t(0.95) at 5 degrees of freedom, from the tables: 2.015
    assert RunNoise(2.0, "measured", True, 5).change_halfwidth_pct == pytest.approx(
        2.015 * 2 ** 0.5 * 2.0, rel=1e-3)
    # six levels around the fitted twin: errors 3, -3, 4, -4, 0, 0 % -> rms sqrt(50/6), dof 5
    fit = pd.DataFrame({"output_throughput_error_pct": [3.0, -3.0, 4.0, -4.0, 0.0, 0.0]})
    got = run_to_run_noise(pd.DataFrame(), "concurrency", fit)
    assert got.dof == 5 and got.throughput_sd_pct == pytest.approx((50 / 6) ** 0.5)
    # two repeats at each of two levels: (100, 110) and (200, 180): relative deviations
    # +-1/21 and +-1/19, one degree of freedom each; t(0.95, 2) = 2.920
    runs = pd.DataFrame({"concurrency": [4, 4, 8, 8],
                         "output_throughput": [100.0, 110.0, 200.0, 180.0]})
    got = run_to_run_noise(runs, "concurrency", None)
    sd = 100 * ((2 / 21 ** 2 + 2 / 19 ** 2) / 2) ** 0.5
    assert got.dof == 2 and got.throughput_sd_pct == pytest.approx(sd)
    assert got.change_halfwidth_pct == pytest.approx(2.920 * 2 ** 0.5 * sd, rel=1e-3)
    # an estimate (no data to measure it on) keeps the normal quantile
    assert run_to_run_noise(pd.DataFrame(), "concurrency", None).quantile == pytest.approx(1.645)


def test_the_scatter_around_a_fitted_twin_counts_the_degrees_of_freedom_its_fit_spent():
    import pandas as pd

    from kvpressure.twin.noise import run_to_run_noise

    # errors 3, -3, 4, -4, 0, 0 % at six levels; the fit's throughput rows have leverages
    # 0.5, 0.2, 0.1, 0.1, 0.05, 0.05 (they took up 1 level's worth): sum of squares 50 over
    # 6 - 1 = 5 degrees of freedom, sd sqrt(10); t(0.95, 5) = 2.015
    fit = pd.DataFrame({"concurrency": [2, 4, 6, 8, 12, 16],
                        "output_throughput_error_pct": [3.0, -3.0, 4.0, -4.0, 0.0, 0.0]})
    leverage = {2: 0.5, 4: 0.2, 6: 0.1, 8: 0.1, 12: 0.05, 16: 0.05}
    got = run_to_run_noise(pd.DataFrame(), "concurrency", fit, leverage)
    assert got.dof == pytest.approx(5.0) and got.throughput_sd_pct == pytest.approx(10 ** 0.5)
    assert got.change_halfwidth_pct == pytest.approx(2.015 * 2 ** 0.5 * 10 ** 0.5, rel=1e-3)
    # leverages summing to 2.5 leave 3.5 degrees of freedom: sd sqrt(50 / 3.5)
    got = run_to_run_noise(pd.DataFrame(), "concurrency", fit,
                           {c: v * 2.5 for c, v in leverage.items()})
    assert got.dof == pytest.approx(3.5)
    assert got.throughput_sd_pct == pytest.approx((50 / 3.5) ** 0.5)
    # a level the fit did not see (left out: a prediction) spends nothing
    got = run_to_run_noise(pd.DataFrame(), "concurrency", fit, {2: 0.6, 4: 0.4})
    assert got.dof == pytest.approx(5.0)
