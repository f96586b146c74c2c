"""The worked examples of docs/scheduler.md (section 9), step by step, including Example 1's
free-queue states. Steps are numbered from 0, like the reference runs and the document.
"""

from __future__ import annotations

import pytest

from kvpressure.errors import InputError
from kvpressure.simulation.engine import FAST_PATHS, simulate
from kvpressure.simulation.request import PREEMPTED, RUNNING
from kvpressure.simulation.scenario import load_scenario
from sim_helpers import LinearCost, ManualLoop, settings


def _names(out) -> dict[str, int]:
    return {r.request_id: n for r, n in out.scheduled.items()}


def test_example_1_admission_chunking_preemption_eviction_self_preemption():
    loop = ManualLoop(settings())
    A = loop.add("A", 40, 30)
    B = loop.add("B", 40, 30)
    C = loop.add("C", 30, 10)

    # Spec step 1: A whole prompt (3 blocks, 2 hashed), B a 24-token chunk; C waits.
    out = loop.run_step()
    assert _names(out) == {"A": 40, "B": 24}
    assert A.blocks == [1, 2, 3] and B.blocks == [4, 5]
    assert loop.free_queue == [6, 7, 8, 9]
    assert A.num_tokens == 41 and B.num_tokens == 40  # B's chunk samples nothing
    assert len(loop.sched.waiting) == 1

    # Spec step 2: A decodes, B finishes its prompt in block 6, C admitted into 7, 8.
    out = loop.run_step()
    assert _names(out) == {"A": 1, "B": 16, "C": 30}
    assert B.blocks == [4, 5, 6] and C.blocks == [7, 8]
    assert loop.free_queue == [9]

    # Spec steps 3-5: C writes position 32 at step 5 and takes block 9; usage 1.0.
    for _ in range(3):
        loop.run_step()
    assert C.blocks == [7, 8, 9]
    assert loop.outs[-1][1] == 1.0

    # Spec steps 6-9: decoding, no new block.
    for _ in range(4):
        loop.run_step()
    assert C.num_tokens == 38

    # Spec step 10: A needs a block -> C (running[-1]) preempted, freed 9 to the head, 8*, 7*
    # to the tail; A takes 9; no admission this step.
    out = loop.run_step()
    assert [r.request_id for r in out.preempted] == ["C"]
    assert C.status == PREEMPTED and C.num_computed_tokens == 0 and C.num_preemptions == 1
    assert A.blocks[-1] == 9
    assert loop.free_queue == [8, 7]
    assert loop.sched.kv.pool.block_hash[8] is not None
    assert abs(loop.outs[-1][1] - (1 - 2 / 9)) < 1e-12
    assert _names(out) == {"A": 1, "B": 1}

    # Spec step 11: B pops 8 (evicting C's second block); C's lookup hits 16 tokens but
    # the full-sequence gate (3 > 1 free) refuses it.
    out = loop.run_step()
    assert B.blocks[-1] == 8 and loop.free_queue == [7]
    hit, h = loop.sched.kv.get_computed_blocks(C)
    assert (hit, h) == ([7], 16)
    assert out.admitted == [] and C.status == PREEMPTED

    # Spec steps 12-26: A pops 7 at step 26.
    for _ in range(15):
        loop.run_step()
    assert A.blocks[-1] == 7 and loop.free_queue == []

    # Spec step 27: B needs a block with none free -> B preempts itself; pass 1 ends.
    out = loop.run_step()
    assert [r.request_id for r in out.preempted] == ["B"]
    assert B.num_tokens == 65
    assert loop.free_queue == [8, 6, 5, 4]
    assert [r.request_id for r in loop.sched.waiting.requests()] == ["B", "C"]
    assert _names(out) == {"A": 1}

    # Spec steps 28-30: B (h=64, n=1) blocked by the gate (5 > 4), C never examined.
    for _ in range(3):
        out = loop.run_step()
        assert out.admitted == []
        assert loop.sched.kv.get_computed_blocks(B)[1] == 64
    # Spec step 30's update: A finishes and frees 7 to the head, 9*, 3*, 2*, 1* to the tail.
    assert A.num_output_tokens == 30 and A.finish_step == 29
    assert loop.free_queue == [7, 8, 6, 5, 4, 9, 3, 2, 1]

    # Spec step 31: B resumed with 1 token (touching 4,5,6,8, popping 7), C from scratch.
    out = loop.run_step()
    assert _names(out) == {"B": 1, "C": 38}
    assert out.resumed == 2 and out.admitted_new == 0
    assert B.blocks == [4, 5, 6, 8, 7]
    assert C.blocks == [9, 3, 2]
    assert out.prefix_cache_queries == 103 and out.prefix_cache_hits == 64
    assert C.recomputed_tokens == 37 and B.recomputed_tokens == 0
    assert B.status == RUNNING and C.status == RUNNING


def test_example_1_through_the_engine_matches_the_reference_step_numbers():
    sc = load_scenario({
        "settings": {"num_gpu_blocks": 10, "block_size": 16, "max_num_seqs": 8,
                     "max_num_batched_tokens": 64},
        "requests": [{"id": "A", "prompt_len": 40, "output_len": 30},
                     {"id": "B", "prompt_len": 40, "output_len": 30},
                     {"id": "C", "prompt_len": 30, "output_len": 10}]})
    for fast_path in FAST_PATHS:
        res = simulate(sc, fast_path=fast_path)
        c = res.steps.columns
        preempt_steps = [s for s, p in zip(c["step"], c["preemptions"], strict=True) if p]
        assert preempt_steps == [9, 26]
        resumed = [s for s, r in zip(c["step"], c["resumed"], strict=True) if r]
        assert resumed == [30] and c["resumed"][30] == 2
        assert c["finished"][29] == 1
        assert c["prefix_cache_queries"][30] == 103 and c["prefix_cache_hits"][30] == 64
        assert res.summary["recomputed_tokens"] == 37


def _two_step_priority(policy: str, n_blocks: int, first: list[dict], second: list[dict]):
    loop = ManualLoop(settings(num_gpu_blocks=n_blocks, max_num_batched_tokens=128,
                               policy=policy))
    reqs = {}
    for r in first:
        reqs[r["id"]] = loop.add(r["id"], r["prompt"], 100, priority=r["p"])
    loop.run_step()
    for r in second:
        reqs[r["id"]] = loop.add(r["id"], r["prompt"], 100, priority=r["p"])
    loop.run_step()
    out = loop.run_step()
    return out, reqs


def test_example_2a_priority_self_preemption_lets_pass_1_continue():
    out, reqs = _two_step_priority(
        "priority", 8, [{"id": "X", "prompt": 40, "p": 0}, {"id": "Y", "prompt": 31, "p": 5}],
        [{"id": "Z", "prompt": 32, "p": 1}])
    assert _names(out) == {"X": 1, "Z": 1}
    assert [r.request_id for r in out.preempted] == ["Y"]


def test_example_2b_priority_victim_already_granted_is_refunded():
    out, reqs = _two_step_priority(
        "priority", 6, [{"id": "Z", "prompt": 40, "p": 3}], [{"id": "X", "prompt": 32, "p": 0}])
    assert _names(out) == {"X": 1}
    assert [r.request_id for r in out.preempted] == ["Z"]
    assert out.num_scheduled_tokens == 1  # Z's granted token went back to the budget


def test_example_2b_under_fcfs_the_tail_preempts_itself():
    out, reqs = _two_step_priority(
        "fcfs", 6, [{"id": "Z", "prompt": 40, "p": 3}], [{"id": "X", "prompt": 32, "p": 0}])
    assert _names(out) == {"Z": 1}
    assert [r.request_id for r in out.preempted] == ["X"]


def _example_3(n_blocks: int, budget: int, chunked: bool, waiting: list[tuple[str, int]]):
    loop = ManualLoop(settings(num_gpu_blocks=n_blocks, max_num_batched_tokens=budget,
                               enable_chunked_prefill=chunked, max_model_len=budget
                               if not chunked else 8192))
    for i in range(3):
        loop.add(f"d{i}", 20, 100)
    loop.run_step()
    reqs = {rid: loop.add(rid, plen, 10) for rid, plen in waiting}
    free_before = loop.sched.kv.pool.num_free_blocks
    out = loop.run_step()
    return out, reqs, free_before


def test_example_3_chunk_admitted_then_budget_stops_admission():
    out, reqs, free = _example_3(27, 64, True, [("P", 200), ("Q", 10)])
    assert free == 20
    assert _names(out) == {"d0": 1, "d1": 1, "d2": 1, "P": 61}
    assert reqs["P"].blocks and len(reqs["P"].blocks) == 4
    assert reqs["Q"].status != RUNNING


def test_example_3_gate_failure_blocks_the_queue_head_of_line():
    out, reqs, free = _example_3(19, 64, True, [("P", 200), ("Q", 10)])
    assert free == 12
    assert _names(out) == {"d0": 1, "d1": 1, "d2": 1}
    assert out.admitted == []  # Q would fit in one block but is never tried


def test_example_3_chunked_prefill_off_breaks_on_a_prompt_over_the_budget():
    out, reqs, free = _example_3(100, 256, False, [("S", 60), ("P", 200), ("Q", 10)])
    assert _names(out) == {"d0": 1, "d1": 1, "d2": 1, "S": 60}
    assert reqs["P"].status != RUNNING and reqs["Q"].status != RUNNING


def test_idle_gap_jump_records_one_empty_step_after_the_drain():
    sc = load_scenario({"settings": {"num_gpu_blocks": 100},
                        "requests": [{"id": "A", "prompt_len": 10, "output_len": 2},
                                     {"id": "B", "prompt_len": 10, "output_len": 1,
                                      "arrival_step": 10}]})
    for fast_path in FAST_PATHS:
        res = simulate(sc, fast_path=fast_path)
        assert list(res.steps.columns["step"]) == [0, 1, 2, 10]
        assert res.steps.columns["num_scheduled_tokens"][2] == 0


def test_an_unknown_fast_path_is_refused_by_name():
    sc = load_scenario({"settings": {"num_gpu_blocks": 100},
                        "requests": [{"id": "A", "prompt_len": 10, "output_len": 2}]})
    with pytest.raises(InputError, match="fast_path: 'fast' is not one of off, lazy, leap"):
        simulate(sc, fast_path="fast")


def _closed(concurrency: int, reqs: list[tuple[str, int, int]], **mode) -> dict:
    return {"mode": {"type": "closed", "concurrency": concurrency, **mode},
            "settings": {"num_gpu_blocks": 100},
            "requests": [{"id": i, "prompt_len": p, "output_len": o} for i, p, o in reqs]}


def test_closed_loop_client_back_two_steps_late_leaves_the_engine_idle():
    # One client, return_steps 2. A (3 tokens) is submitted and scheduled at step 0 and samples
    # its tokens in steps 0, 1, 2: it finishes in step 2. Its client submits B before step
    # 2 + 1 + 2 = 5. Step 3 is the empty step after the drain (the finished id is still to be
    # reported, as in the open loop's idle gap); step 4 does not exist (nothing to run). B runs
    # its prompt at step 5 and its last token at step 6.
    sc = load_scenario(_closed(1, [("A", 10, 3), ("B", 10, 2)], return_steps=2))
    for fast_path in FAST_PATHS:
        res = simulate(sc, fast_path=fast_path)
        A, B = res.requests
        assert (A.submit_step, A.first_sched_step, A.finish_step) == (0, 0, 2)
        assert (B.submit_step, B.first_sched_step, B.finish_step) == (5, 5, 6)
        c = res.steps.columns
        assert list(c["step"]) == [0, 1, 2, 3, 5, 6]
        assert list(c["arrivals"]) == [1, 0, 0, 0, 1, 0]
        assert c["num_scheduled_tokens"][3] == 0
    # Without the lag, B is submitted right after A's finish (before step 3).
    res = simulate(load_scenario(_closed(1, [("A", 10, 3), ("B", 10, 2)])))
    assert [r.submit_step for r in res.requests] == [0, 3]


def test_closed_loop_idle_steps_waiting_for_a_client_take_no_time():
    sc = load_scenario(_closed(1, [("A", 10, 3), ("B", 10, 2)], return_steps=2))
    for fast_path in FAST_PATHS:
        res = simulate(sc, cost_model=LinearCost(), fast_path=fast_path)
        A, B = res.requests
        c = res.steps.columns
        # The client comes back at the start of step 5, which is when the last step before it
        # (the empty step 3, of no duration) ended: A's finish time.
        assert B.submit_time_s == A.finish_time_s == c["time_s"][3]
        assert c["step_duration_s"][3] == 0.0
        assert c["time_s"][4] == B.submit_time_s


def test_closed_loop_late_client_overlaps_the_other_clients_request():
    # Two clients, return_steps 2: A (3 tokens) and B (6 tokens) start at step 0; A finishes in
    # step 2, so C is submitted before step 5, the step of B's last token. With no lag C would
    # be submitted before step 3.
    reqs = [("A", 10, 3), ("B", 10, 6), ("C", 10, 2)]
    for k, c_submit in ((0, 3), (2, 5)):
        sc = load_scenario(_closed(2, reqs, return_steps=k))
        for fast_path in FAST_PATHS:
            res = simulate(sc, fast_path=fast_path)
            A, B, C = res.requests
            assert (A.finish_step, B.finish_step) == (2, 5)
            assert (C.submit_step, C.first_sched_step, C.finish_step) == \
                (c_submit, c_submit, c_submit + 1)
            assert list(res.steps.columns["step"]) == list(range(max(6, c_submit + 2)))
            # Steps 3 and 4 run B alone while C's client is away.
            assert [res.steps.columns["num_scheduled_reqs"][s] for s in (3, 4)] == \
                ([2, 2] if k == 0 else [1, 1])


def test_closed_loop_first_request_alone():
    # first_alone: the first client submits before step 0, the others before step 1.
    sc = load_scenario(_closed(3, [("A", 10, 4), ("B", 10, 4), ("C", 10, 4), ("D", 10, 2)],
                               first_alone=True))
    for fast_path in FAST_PATHS:
        res = simulate(sc, fast_path=fast_path)
        assert [r.submit_step for r in res.requests] == [0, 1, 1, 4]
        assert list(res.steps.columns["arrivals"][:2]) == [1, 2]
        assert res.summary["mode"] == {"type": "closed", "concurrency": 3, "first_alone": True}


@pytest.mark.parametrize("mode, message", [
    ({"type": "closed", "concurrency": 2, "return_steps": -1}, "mode.return_steps must be >= 0"),
    ({"type": "closed", "concurrency": 2, "return_steps": 1.5},
     "mode.return_steps must be an integer"),
    ({"type": "closed", "concurrency": 2, "first_alone": "yes"},
     "mode.first_alone must be true or false"),
    ({"type": "open", "return_steps": 1}, "mode.return_steps applies to a closed loop only"),
])
def test_closed_loop_lag_settings_refused_by_name(mode, message):
    with pytest.raises(InputError, match=message):
        load_scenario({"mode": mode, "settings": {"num_gpu_blocks": 100},
                       "requests": [{"id": "A", "prompt_len": 10, "output_len": 2}]})
