"""The twin replays a level's requests in the order the clients sent them."""

from __future__ import annotations

import pytest

from kvpressure.twin.measured import _lens


def test_lengths_follow_the_start_times_not_the_finish_order():
    # kvpressure collect lists outcomes as they finish: here request 2 (sent last) finished
    # first and request 0 (sent first) finished last.
    res = {"input_lens": [300, 200, 100], "output_lens": [30, 20, 10],
           "start_times": [1000.30, 1000.20, 1000.10], "errors": ["", "", ""]}
    ins, outs, sent = _lens(res)
    assert (ins, outs) == ([100, 200, 300], [10, 20, 30])
    # An open loop replays them at these send times, from the first one's.
    assert sent == pytest.approx([0.0, 0.1, 0.2])


def test_failed_requests_are_left_out_after_ordering():
    res = {"input_lens": [300, 200, 100, 400], "output_lens": [30, 20, 10, 0],
           "start_times": [3.0, 2.0, 1.0, 0.5], "errors": ["", "HTTP 500: x", "", "timeout"]}
    # The first kept request (sent at 1.0) starts the clock: the failed one sent before it
    # never reached the engine's schedule.
    assert _lens(res) == ([100, 300], [10, 30], [0.0, 2.0])


def test_without_start_times_the_listed_order_is_kept():
    res = {"input_lens": [300, 200], "output_lens": [30, 20]}
    assert _lens(res) == ([300, 200], [30, 20], None)
