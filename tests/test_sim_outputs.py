"""The weighted inverted-CDF percentile of summary.json's time statistics."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from kvpressure.simulation.outputs import percentile


def test_percentile_hand_worked():
    # Sorted with weights: 1 (x1), 2 (x2), 3 (x1); total 4.
    assert percentile([3.0, 1.0, 2.0], [1, 1, 2], 0.5) == 2.0  # target 2: 1 -> 3 >= 2
    assert percentile([3.0, 1.0, 2.0], [1, 1, 2], 0.25) == 1.0  # target 1: reached at 1
    assert percentile([3.0, 1.0, 2.0], [1, 1, 2], 0.76) == 3.0  # target 3.04 > 3
    assert percentile([3.0, 1.0, 2.0], None, 1.0) == 3.0
    assert percentile([], None, 0.95) == 0.0
    # One gap shared by 99 requests, one long gap: p95 is the shared one, p99.5 the long.
    assert percentile([0.01, 0.5], [99, 1], 0.95) == 0.01
    assert percentile([0.01, 0.5], [99, 1], 0.995) == 0.5


values = st.lists(st.sampled_from([0.0, 0.125, 0.5, 1.0, 2.5]) | st.floats(0, 10),
                  min_size=1, max_size=30)


@given(values, st.data(), st.sampled_from([0.0, 0.05, 0.5, 0.95, 0.99, 1.0]))
def test_percentile_equals_expanded_sample(vals, data, q):
    """Against the definition on the sample with each value repeated by its weight."""
    weights = data.draw(st.none() | st.lists(st.integers(1, 6), min_size=len(vals),
                                             max_size=len(vals)))
    expanded = sorted(v for v, w in zip(vals, weights or [1] * len(vals), strict=True)
                      for _ in range(w))
    k = max(math.ceil(q * len(expanded)), 1)
    assert percentile(vals, weights, q) == expanded[k - 1]
