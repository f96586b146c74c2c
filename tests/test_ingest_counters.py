"""Counter increase, gauge means and histogram quantiles over windows, worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpressure.ingestion.counters import (
    bucket_quantile,
    gauge_mean,
    gauge_window,
    histogram_mean,
    histogram_quantile,
    increase,
    window_increase,
)


def frame(rows: list[tuple[float, str, str, float]], run: str = "r") -> pd.DataFrame:
    return pd.DataFrame(
        [(run, t, m, labels, v) for t, m, labels, v in rows],
        columns=["run", "t", "metric", "labels", "value"],
    )


def counter(values: list[float], name: str = "vllm:num_preemptions_total") -> pd.DataFrame:
    return frame([(float(t), name, "", float(v)) for t, v in enumerate(values)])


def test_reset_counts_like_prometheus_increase() -> None:
    s = counter([0, 5, 10, 2, 6])  # restart between t=2 and t=3
    assert window_increase(s, "vllm:num_preemptions_total") == 5 + 5 + 2 + 4
    # (1, 3]: baseline is the sample at t=1 (5): 10-5, then the reset's 2.
    assert window_increase(s, "vllm:num_preemptions_total", 1, 3) == 7


def test_origin_zero_counts_what_happened_before_the_first_scrape() -> None:
    s = counter([4, 6, 9])
    assert window_increase(s, "vllm:num_preemptions_total") == 5
    assert window_increase(s, "vllm:num_preemptions_total", origin="zero") == 9
    # A window that starts after the first sample is not affected by the origin: the baseline
    # is the sample at t=0 (4).
    assert window_increase(s, "vllm:num_preemptions_total", 0.5, None, origin="zero") == 9 - 4


def test_missing_metric_is_nan_not_zero() -> None:
    s = counter([1, 2])
    assert math.isnan(window_increase(s, "vllm:generation_tokens_total"))
    assert math.isnan(gauge_mean(s, "vllm:num_requests_running"))
    assert math.isnan(histogram_quantile(s, "vllm:time_to_first_token_seconds", 0.5))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=2, max_size=30),
    st.floats(min_value=-1, max_value=31, allow_nan=False),
)
def test_consecutive_windows_add_up(values: list[int], split: float) -> None:
    t = np.arange(len(values), dtype=float)
    v = np.array(values, dtype=float)
    whole = increase(t, v, None, None)
    assert whole >= 0
    assert math.isclose(increase(t, v, None, split) + increase(t, v, split, None), whole)


def test_gauge_mean_holds_values_over_a_missing_scrape() -> None:
    # Scrapes at 0, 1, 3, 4 (the one at 2 is missing): 6 stands for two seconds.
    s = frame(
        [(0.0, "g", "", 2.0), (1.0, "g", "", 6.0), (3.0, "g", "", 10.0), (4.0, "g", "", 0.0)]
    )
    # Open window: from the first to the last sample; the last one holds for no time.
    assert gauge_mean(s, "g") == (2 * 1 + 6 * 2 + 10 * 1) / 4
    assert gauge_mean(s, "g", how="samples") == 18 / 4
    assert gauge_mean(s, "g", 1.0, 3.0) == (6 * 2 + 10 * 0) / 2
    # The window starts with the sample before it (2 from 0.5 to 1) and ends holding the last
    # one (0 from 4 to 5).
    assert gauge_mean(s, "g", 0.5, 5.0) == (2 * 0.5 + 6 * 2 + 10 * 1 + 0 * 1) / 4.5
    # Inside one scrape interval the held value is the whole answer.
    assert gauge_mean(s, "g", 1.5, 2.5) == 6.0


def test_gauge_window_picks_the_held_samples_and_their_hold_times() -> None:
    s = pd.Series([2.0, 6.0, 10.0, 0.0], index=[0.0, 1.0, 3.0, 4.0])
    held, w = gauge_window(s, 0.5, 3.0)
    assert list(held) == [2.0, 6.0, 10.0]
    assert list(w) == [0.5, 2.0, 0.0]
    held, w = gauge_window(s, 5.0, 6.0)  # after the last scrape the last value holds
    assert list(held) == [0.0] and list(w) == [1.0]
    assert gauge_window(s, -2.0, -1.0)[0].empty  # before the first scrape nothing is known


def _histogram(counts: dict[str, float]) -> pd.DataFrame:
    base = "vllm:time_to_first_token_seconds"
    rows = []
    for le, c in counts.items():
        rows += [(0.0, f"{base}_bucket", f"le={le}", 0.0), (1.0, f"{base}_bucket", f"le={le}", c)]
    rows += [(0.0, f"{base}_sum", "", 0.0), (1.0, f"{base}_sum", "", 12.0)]
    rows += [(0.0, f"{base}_count", "", 0.0), (1.0, f"{base}_count", "", counts["+Inf"])]
    return frame(rows)


def test_histogram_quantile_interpolates_within_buckets() -> None:
    s = _histogram({"0.1": 10, "0.5": 30, "1.0": 40, "+Inf": 40})
    base = "vllm:time_to_first_token_seconds"
    # rank 20 falls in (0.1, 0.5], 10 of its 20 observations below it: 0.1 + 0.4 * 10/20
    assert math.isclose(histogram_quantile(s, base, 0.5), 0.3)
    # rank 38 in (0.5, 1.0]: 0.5 + 0.5 * 8/10
    assert math.isclose(histogram_quantile(s, base, 0.95), 0.9)
    assert histogram_quantile(s, base, 1.0) == 1.0
    assert histogram_mean(s, base) == 12.0 / 40


def test_histogram_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    buckets = pd.Series([0.0, 5.0], index=[0.1, math.inf])
    assert bucket_quantile(0.5, buckets) == 0.1
    assert math.isnan(bucket_quantile(0.5, pd.Series([0.0, 0.0], index=[0.1, math.inf])))
    assert bucket_quantile(-0.1, buckets) == -math.inf


def test_histogram_of_two_engines_is_summed_by_le() -> None:
    base = "vllm:inter_token_latency_seconds"
    rows = []
    for engine, (low, total) in {"0": (2.0, 4.0), "1": (0.0, 4.0)}.items():
        for le, c in (("0.01", low), ("0.02", total), ("+Inf", total)):
            labels = f"engine={engine},le={le}"
            rows += [(0.0, f"{base}_bucket", labels, 0.0), (1.0, f"{base}_bucket", labels, c)]
    s = frame(rows)
    # 8 observations: 2 below 0.01, all 8 below 0.02. Median rank 4: 0.01 + 0.01 * 2/6.
    assert math.isclose(histogram_quantile(s, base, 0.5), 0.01 + 0.01 * 2 / 6)
    assert math.isclose(histogram_quantile(s, base, 0.5, labels="engine=0"), 0.01)


def test_unlabelled_series_read_back_from_csv_keeps_its_values(tmp_path) -> None:
    # pandas reads an empty labels field as NaN; the metric must not vanish on the round trip
    counter([0, 3, 7, 7, 12]).to_csv(tmp_path / "series.csv", index=False)
    back = pd.read_csv(tmp_path / "series.csv")
    assert back["labels"].isna().all()
    assert window_increase(back, "vllm:num_preemptions_total", 0.0, 4.0) == 12.0
