"""The request path in time (docs/scheduler.md#time-path), on hand-worked examples: a fixed
10 ms step, so every time below is counted by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvpressure.errors import InputError
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.request_path import RequestPath
from kvpressure.simulation.scenario import load_scenario

DT = 0.010


class FixedStep:
    """Every step with tokens lasts DT (elementwise, as the leap asks)."""

    def __init__(self, path: RequestPath | None = None) -> None:
        self.request_path = path

    def step_time(self, f):
        return np.zeros_like(np.asarray(f.num_decode_seqs, dtype=float)) + DT


def _open(requests, asynchronous=False):
    return load_scenario({"settings": {"num_gpu_blocks": 200, "async_scheduling": asynchronous},
                          "mode": {"type": "open"}, "requests": requests})


TWO = [{"id": "a", "prompt_len": 32, "output_len": 3, "arrival_time_s": 0.0},
       {"id": "b", "prompt_len": 32, "output_len": 3, "arrival_time_s": 0.005}]


def _by_id(result):
    return {r.request_id: r for r in result.requests}


@pytest.mark.parametrize("fast_path", ["off", "leap"])
def test_sync_path_hand_worked(fast_path):
    # a reaches the engine core at 2 ms (API server), runs at once: prefill [2, 12] ms, the
    # client reads its first token at 13 ms; decodes [12, 22], [22, 32]: finish read at 33.
    # b is sent at 5 ms, reaches the core at 7 ms during a's prefill; the synchronous loop
    # schedules the next step when a's prefill ends (12 ms): b's prefill [12, 22], first token
    # read at 23 ms (TTFT 18 ms); its decodes end at 32 and 42, read at 43 (E2E 38 ms).
    path = RequestPath(api_server_s=0.002, output_s=0.001)
    res = simulate(_open(TWO), FixedStep(path), fast_path=fast_path)
    a, b = _by_id(res)["a"], _by_id(res)["b"]
    assert a.first_token_time_s - a.submit_time_s == pytest.approx(0.013)
    assert a.finish_time_s - a.submit_time_s == pytest.approx(0.033)
    assert b.submit_time_s == pytest.approx(0.005)
    assert b.first_token_time_s - b.submit_time_s == pytest.approx(0.018)
    assert b.finish_time_s - b.submit_time_s == pytest.approx(0.038)
    s = res.summary
    assert s["ttft_mean_s"] == pytest.approx((0.013 + 0.018) / 2)
    assert s["itl_mean_s"] == pytest.approx(DT)  # the path moves tokens, not their gaps


@pytest.mark.parametrize("fast_path", ["off", "leap"])
def test_async_scheduling_costs_one_step_of_queueing(fast_path):
    # With two steps in flight, step 1 was scheduled when step 0 started (2 ms), before b
    # reached the core (7 ms): b waits for step 2, scheduled at 12 ms, run [22, 32] ms; its
    # first token is read at 33 ms (TTFT 28 ms, one step more than the synchronous 18 ms).
    path = RequestPath(api_server_s=0.002, output_s=0.001)
    res = simulate(_open(TWO, asynchronous=True), FixedStep(path), fast_path=fast_path)
    a, b = _by_id(res)["a"], _by_id(res)["b"]
    assert a.first_token_time_s - a.submit_time_s == pytest.approx(0.013)
    assert b.first_token_time_s - b.submit_time_s == pytest.approx(0.028)
    steps = res.steps_frame()
    assert steps["admitted_new"].tolist()[:3] == [1, 0, 1]


def test_tokenising_is_priced_per_prompt_token():
    # 1000 prompt tokens at 4 us each: the request reaches the core 4 ms after its send.
    path = RequestPath(tokenize_s_per_token=4e-6)
    res = simulate(_open([{"id": "a", "prompt_len": 1000, "output_len": 2,
                           "arrival_time_s": 0.0}]), FixedStep(path))
    a = res.requests[0]
    assert a.first_token_time_s - a.submit_time_s == pytest.approx(0.004 + DT)


def test_async_closed_loop_clients_come_back_one_step_later():
    # Concurrency 2: x (output 2) finishes in step 1; its client's next request z is taken
    # in step 2 by the synchronous loop, in step 3 with async scheduling (step 2 was
    # scheduled before x's last token was processed). y keeps the engine busy throughout.
    reqs = [{"id": "x", "prompt_len": 16, "output_len": 2},
            {"id": "y", "prompt_len": 16, "output_len": 8},
            {"id": "z", "prompt_len": 16, "output_len": 2}]

    def admitted(asynchronous):
        sc = load_scenario({"settings": {"num_gpu_blocks": 200,
                                         "async_scheduling": asynchronous},
                            "mode": {"type": "closed", "concurrency": 2}, "requests": reqs})
        res = simulate(sc, FixedStep())
        return res.steps_frame()["admitted_new"].tolist()[:4], _by_id(res)["z"]

    sync_steps, z_sync = admitted(False)
    async_steps, z_async = admitted(True)
    assert sync_steps == [2, 0, 1, 0]
    assert async_steps == [2, 0, 0, 1]
    assert z_async.submit_time_s - z_sync.submit_time_s == pytest.approx(DT)


def test_async_scheduling_and_a_path_need_time():
    sc = _open([{"id": "a", "prompt_len": 8, "output_len": 2, "arrival_step": 0}],
               asynchronous=True)
    with pytest.raises(InputError, match="async_scheduling"):
        simulate(sc)


def test_a_negative_path_value_is_refused():
    with pytest.raises(InputError, match="output_s"):
        RequestPath(output_s=-1e-3)
