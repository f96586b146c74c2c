"""Lazy decode progress (simulation/lazy_decode.py) decides exactly what the exact scheduler
decides: on random workloads with preemptions (FCFS and PRIORITY), in steps and in time,
with and without leaps (``fast_path`` "off", "lazy", "leap"), with and without a per-token
recorder, and its members' derived state stays consistent after every step."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpressure.simulation.engine import Simulation
from kvpressure.simulation.lazy_decode import LazyDecode
from kvpressure.simulation.scenario import load_scenario
from kvpressure.simulation.scheduler import Scheduler
from sim_helpers import LinearCost, ManualLoop, RecordingRecorder, workloads
from sim_helpers import settings as sched_settings


class _StepRecorder:
    """A recorder without ``on_output`` (no per-token updates of the members) that keeps what
    it is told, per step and per request, and checks the lazy head after every step."""

    def __init__(self) -> None:
        self.scheduled = defaultdict(list)
        self.preempted = defaultdict(list)
        self.step_ends = []
        self.sim = None
        self.max_members = 0

    def on_scheduled(self, req, t):
        self.scheduled[req.request_id].append(t)

    def on_preempted(self, req, t):
        self.preempted[req.request_id].append((t, req.num_output_tokens, req.scheduled_tokens))

    def on_step_end(self, t, *rest):
        self.step_ends.append((t, *rest))
        sim = self.sim
        if sim is None or sim.lazy is None:
            return
        lz = sim.lazy
        sched = sim.scheduler
        B = sched.block_size
        n = lz.num_members
        members = sched.running[:n]
        self.max_members = max(self.max_members, n)
        assert all(r.lz_d0 >= 0 for r in members)
        assert all(r.lz_d0 < 0 for r in sched.running[n:])
        assert sum(len(b) for b in lz.buckets) == n
        total_c = 0
        for r in members:
            c = lz.computed(r, lz.clock)
            total_c += c
            assert not r.is_prefill_chunk
            # Blocks popped exactly when a position starts one.
            assert len(r.blocks) == -(-c // B)
            assert r in lz.buckets[(lz.clock - c) % B]
            assert r.num_output_tokens + lz.clock - r.lz_d0 < r.max_tokens
        assert total_c == lz.sum_off + n * lz.clock


def _run(sc, fast_path, cost=None):
    rec = _StepRecorder()
    sim = Simulation(sc, cost, rec, fast_path)
    rec.sim = sim
    return sim.run(), rec


def _three_ways(sc):
    """Exact, lazy without leaps and lazy with leaps must agree; returns the exact and the
    lazy-without-leaps runs (result, recorder) for further checks."""
    eager, rec_e = _run(sc, "off")
    lazy, rec_l = _run(sc, "lazy")
    leap, rec_j = _run(sc, "leap")
    _assert_same(eager, lazy, rec_e, rec_l)
    _assert_same(eager, leap, rec_e, rec_j)
    return eager, rec_e, lazy, rec_l


def _assert_same(a, b, rec_a, rec_b, exact=True):
    assert a.steps_csv() == b.steps_csv()
    assert a.requests_csv() == b.requests_csv()
    for k, v in a.summary.items():
        if k == "timing":
            continue
        if isinstance(v, float) and not exact:
            assert abs(v - b.summary[k]) <= 1e-9 * max(1.0, abs(v)), k
        else:
            assert v == b.summary[k], k
    assert rec_a.scheduled == rec_b.scheduled
    assert rec_a.preempted == rec_b.preempted
    assert rec_a.step_ends == rec_b.step_ends


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_lazy_decode_equals_eager_in_steps(data):
    sc = load_scenario(data)
    eager, rec_e, lazy, rec_l = _three_ways(sc)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_lazy_decode_equals_eager_in_time(data):
    if data["mode"]["type"] == "open":
        for r in data["requests"]:
            r["arrival_time_s"] = r.pop("arrival_step") * 0.01
    sc = load_scenario(data)
    eager, rec_e = _run(sc, "off", LinearCost())
    lazy, rec_l = _run(sc, "lazy", LinearCost())
    leap, rec_j = _run(sc, "leap", LinearCost())
    _assert_same(eager, lazy, rec_e, rec_l, exact=False)
    _assert_same(eager, leap, rec_e, rec_j, exact=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([None, 0.05]))
def test_lazy_decode_with_a_per_token_recorder(data, scrape):
    """With ``on_output`` the members are brought up to date for each call: same calls,
    same times, same results as the eager path, in time, without leaps."""
    if data["mode"]["type"] == "open":
        for r in data["requests"]:
            r["arrival_time_s"] = r.pop("arrival_step") * 0.01
    sc = load_scenario(data)
    rec_a, rec_b = RecordingRecorder(scrape), RecordingRecorder(scrape)
    a = Simulation(sc, LinearCost(), rec_a, "off").run()
    sim = Simulation(sc, LinearCost(), rec_b, "lazy")
    assert sim.lazy is not None
    b = sim.run()
    assert a.steps_csv() == b.steps_csv()
    assert a.requests_csv() == b.requests_csv()
    assert rec_a.aggregate() == rec_b.aggregate()


def test_lazy_decode_is_used_and_preempts():
    """Hand-worked: 3 requests of 8 prompt tokens and 40 outputs, 15 usable blocks of 4
    tokens. Step 0 admits all three (2 blocks each, 9 free); members then pop a block at
    c = 8, 12, 16 (steps 1, 5, 9: 6, 3, 0 free). At step 13 (c = 20) r0 finds no free block
    and preempts the tail, r2, after r2's 13 tokens (8 prompt + 12 decode scheduled)."""
    data = {"name": "lazy", "mode": {"type": "closed", "concurrency": 3},
            "settings": {"num_gpu_blocks": 16, "block_size": 4, "max_num_seqs": 3,
                         "max_num_batched_tokens": 64, "enable_prefix_caching": False,
                         "max_model_len": 64},
            "requests": [{"id": f"r{i}", "prompt_len": 8, "output_len": 40}
                         for i in range(3)]}
    sc = load_scenario(data)
    eager, rec_e, lazy, rec_l = _three_ways(sc)
    assert rec_l.preempted["r2"][0] == (1.0 + 13 * 0.015625, 13, 20)
    assert "r0" not in rec_l.preempted
    assert rec_l.max_members == 3 and rec_e.max_members == 0
    c = lazy.steps.columns
    assert list(c["preemptions"]).index(1) == 13
    assert all(r.num_output_tokens == 40 and r.lz_d0 == -1 for r in lazy.requests)


class _CountingLazy(LazyDecode):
    __slots__ = ("flushes",)

    def flush(self, running):
        self.flushes += 1
        super().flush(running)


def test_lazy_head_larger_than_budget_runs_eagerly():
    """Defensive path: a lazy head larger than the budget (scenario validation keeps the
    budget >= max_num_seqs, so only a budget lowered mid-run gets there) is flushed and the
    step runs eagerly. 3 requests of 5 prompt tokens and 12 outputs, budget 2: from step 7
    r0 and r1 both decode (2 members); the budget then drops to 1, so only r0 is served
    each step, exactly as the eager scheduler decides."""
    s = sched_settings(num_gpu_blocks=20, block_size=4, max_num_seqs=8,
                       max_num_batched_tokens=2, enable_prefix_caching=False)
    eager, lazy = ManualLoop(s), ManualLoop(s)
    lz = _CountingLazy(s.block_size, s.max_model_len, False)
    lz.flushes = 0
    lazy.sched = Scheduler(s, lz)
    reqs_a = [eager.add(f"r{i}", 5, 12) for i in range(3)]
    reqs_b = [lazy.add(f"r{i}", 5, 12) for i in range(3)]
    while eager.sched.has_requests():
        if eager.step == 9:
            assert lz.num_members == 2
            eager.sched.max_num_scheduled_tokens = lazy.sched.max_num_scheduled_tokens = 1
        a, b = eager.run_step(), lazy.run_step()
        assert a.num_scheduled_tokens == b.num_scheduled_tokens
        if 9 <= eager.step - 1 <= 12:
            assert [r.request_id for r in a.scheduled] == ["r0"]
        assert len(a.scheduled) == len(b.scheduled) + b.num_lazy
        assert [r.request_id for r in a.finished] == [r.request_id for r in b.finished]
        assert eager.free_queue == lazy.free_queue
    assert eager.step == lazy.step
    assert lz.flushes > 0
    for ra, rb in zip(reqs_a, reqs_b, strict=True):
        assert (ra.num_output_tokens, ra.scheduled_tokens, ra.finish_step, rb.lz_d0) == (
            rb.num_output_tokens, rb.scheduled_tokens, rb.finish_step, -1)


def test_priority_preempts_a_member_served_earlier_in_the_step():
    """PRIORITY may preempt a member that pass 1 already served. rA (priority 5, prompt 7)
    arrives at step 0, rB (priority 0, prompt 8) at step 1: running is [rA, rB], both
    decoding with c = 8 at step 2, where both start a block. 4 of the 5 usable blocks are
    held; rA takes the last one, rB finds none and preempts the worst-priority request,
    rA (2 outputs, 8 tokens scheduled), whose token of step 2 is not counted."""
    data = {"name": "prio", "mode": {"type": "open"},
            "settings": {"num_gpu_blocks": 6, "block_size": 4, "max_num_seqs": 4,
                         "max_num_batched_tokens": 64, "enable_prefix_caching": False,
                         "policy": "priority", "max_model_len": 64},
            "requests": [{"id": "rA", "prompt_len": 7, "output_len": 12, "priority": 5,
                          "arrival_step": 0},
                         {"id": "rB", "prompt_len": 8, "output_len": 12, "priority": 0,
                          "arrival_step": 1}]}
    sc = load_scenario(data)
    eager, rec_e, lazy, rec_l = _three_ways(sc)
    assert rec_l.preempted["rA"][0] == (1.0 + 2 * 0.015625, 2, 8)
    c = lazy.steps.columns
    # num_running is read after schedule(): rB alone.
    assert (c["preemptions"][2], c["num_scheduled_tokens"][2], c["num_running"][2]) == (1, 1, 1)
    assert rec_l.max_members == 2
