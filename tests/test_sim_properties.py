"""Invariants of the scheduler model on random small workloads, and the fast path
(``fast_path="leap"``) giving exactly the exact path's results (rows, requests, summary,
recorder calls)."""

from __future__ import annotations

from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpressure.simulation.engine import Simulation, simulate
from kvpressure.simulation.request import PREEMPTED, RUNNING, WAITING
from kvpressure.simulation.scenario import load_scenario
from sim_helpers import LinearCost, RecordingRecorder, workloads


class _Checker(RecordingRecorder):
    """Checks the scheduler state after every step of the step-by-step path."""

    def on_step_end(self, t, num_running, num_waiting, *rest):
        super().on_step_end(t, num_running, num_waiting, *rest)
        sched = self.sched
        pool = sched.kv.pool
        free = pool.free_queue()
        assert len(free) == pool.num_free_blocks
        held: dict[int, int] = {}
        for r in sched.running:
            assert r.status == RUNNING
            assert len(r.blocks) == -(-r.num_computed_tokens // sched.block_size)
            for b in r.blocks:
                held[b] = held.get(b, 0) + 1
        assert not set(free) & set(held)
        assert 0 not in held and 0 not in free
        for b, refs in held.items():
            assert pool.ref_cnt[b] == refs
        # Free (cached ones included) + held + the null block = N.
        assert len(free) + len(held) + 1 == pool.num_gpu_blocks
        waiting = sched.waiting.requests()
        assert not set(waiting) & set(sched.running)
        for r in waiting:
            assert r.status in (WAITING, PREEMPTED) and not r.blocks
        assert len(sched.running) <= sched.settings.max_num_seqs
        for key, entry in pool.cached.items():
            for b in (entry if isinstance(entry, dict) else (entry,)):
                assert pool.block_hash[b] == key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_invariants_on_random_workloads(data):
    sc = load_scenario(data)
    rec = _Checker()
    sim = Simulation(sc, recorder=rec, fast_path="off")
    rec.sched = sim.scheduler
    res = sim.run()
    c = res.steps.columns
    budget = sc.settings.max_num_batched_tokens
    assert all(n <= budget for n in c["num_scheduled_tokens"])
    assert all(n <= sc.settings.max_num_seqs for n in c["num_running"])
    for r in res.requests:
        assert r.num_output_tokens == r.max_tokens
        assert r.is_finished()
        assert r.recomputed_tokens <= r.scheduled_tokens
        whole = (r.num_prompt_tokens + r.max_tokens - 1 - r.prefix_hit_tokens_at_admission
                 + r.recomputed_tokens)
        # A resumed request may hit blocks it never computed itself (another request of its
        # prefix group cached them meanwhile): those tokens are neither scheduled nor recomputed.
        assert r.scheduled_tokens == whole if not r.num_preemptions else \
            r.scheduled_tokens <= whole
        assert r.submit_step <= r.first_sched_step <= r.first_token_step <= r.finish_step
        assert len(rec.token_times[r.request_id]) == r.max_tokens
    assert sum(c["preemptions"]) == sum(r.num_preemptions for r in res.requests)
    assert sum(c["finished"]) == len(res.requests)


def _same(a, b):
    assert a.steps_csv() == b.steps_csv()
    assert a.requests_csv() == b.requests_csv()
    sa = {k: v for k, v in a.summary.items() if k != "timing"}
    sb = {k: v for k, v in b.summary.items() if k != "timing"}
    assert sa == sb


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_fast_path_equals_exact_path(data):
    sc = load_scenario(data)
    rec_a, rec_b = RecordingRecorder(), RecordingRecorder()
    a = simulate(sc, recorder=rec_a, fast_path="off")
    b = simulate(sc, recorder=rec_b, fast_path="leap")
    _same(a, b)
    assert rec_a.aggregate() == rec_b.aggregate()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([None, 0.05, 0.3]))
def test_fast_path_equals_exact_path_in_time(data, scrape):
    # Time arrivals for the open loop: arrival_step as a time in units of 10 ms.
    if data["mode"]["type"] == "open":
        for r in data["requests"]:
            r["arrival_time_s"] = r.pop("arrival_step") * 0.01
    sc = load_scenario(data)
    rec_a, rec_b = RecordingRecorder(scrape), RecordingRecorder(scrape)
    a = simulate(sc, cost_model=LinearCost(), recorder=rec_a, fast_path="off")
    b = simulate(sc, cost_model=LinearCost(), recorder=rec_b, fast_path="leap")
    assert a.steps_csv() == b.steps_csv()
    assert a.requests_csv() == b.requests_csv()
    for k, v in a.summary.items():
        if k in ("timing",):
            continue
        if isinstance(v, float):
            assert abs(v - b.summary[k]) <= 1e-9 * max(1.0, abs(v)), k
        else:
            assert v == b.summary[k], k
    assert rec_a.aggregate() == rec_b.aggregate()


def _closed_with_lag(data: dict, k: int, first_alone: bool) -> dict:
    data["mode"] = {**data["mode"], "return_steps": k, "first_alone": first_alone}
    return data


def _returns_follow_the_rule(res) -> None:
    """The i-th request submitted (i >= concurrency) is submitted exactly before step
    f + 1 + return_steps, f the step of the (i - concurrency)-th finish: clients come back
    first finished, first back, and the loop never passes a return."""
    sc = res.scenario
    conc, k = sc.concurrency, sc.return_steps
    by_submit = sorted(res.requests, key=lambda r: r.arrival_time)
    finishes = sorted(r.finish_step for r in res.requests)
    first = [0] + [1 if sc.first_alone else 0] * (conc - 1)
    for i, r in enumerate(by_submit):
        expected = first[i] if i < conc else finishes[i - conc] + 1 + k
        assert r.submit_step == expected, (r.request_id, i)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(0, 6), st.booleans(), st.booleans())
def test_late_clients_same_on_every_fast_path(data, k, first_alone, timed):
    if data["mode"]["type"] != "closed":
        data["mode"] = {"type": "closed", "concurrency": 3}
    sc = load_scenario(_closed_with_lag(data, k, first_alone))
    cost = LinearCost if timed else (lambda: None)
    runs = [simulate(sc, cost_model=cost(), recorder=RecordingRecorder(0.05 if timed else None),
                     fast_path=fp) for fp in ("off", "lazy", "leap")]
    for other in runs[1:]:
        assert other.steps_csv() == runs[0].steps_csv()
        assert other.requests_csv() == runs[0].requests_csv()
        assert other.recorder.aggregate() == runs[0].recorder.aggregate()
    _returns_follow_the_rule(runs[0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_client_return_queue_without_lag_is_the_plain_closed_loop(data):
    # The queue of client returns, forced on with no lag, gives the plain loop's bytes.
    if data["mode"]["type"] != "closed":
        data["mode"] = {"type": "closed", "concurrency": 3}
    sc = load_scenario(data)
    plain = simulate(sc, fast_path="leap")
    sim = Simulation(sc, fast_path="leap")
    sim.client_returns = deque([0] * sc.concurrency)
    queued = sim.run()
    _same(plain, queued)
    _returns_follow_the_rule(plain)


def test_leaps_of_every_length_give_the_exact_rows(monkeypatch):
    # A leap's rows go into the steps table row by row, as one run of rows, or by column,
    # by its length (steps_table._ROWS_MAX, _RUN_MAX): each way, the exact path's bytes.
    from kvpressure.simulation import steps_table

    lengths: list[int] = []
    add = steps_table.StepsTable.add_decode_steps

    def spy(self, *args):
        lengths.append(len(args[7]))  # usage: one entry a leapt step
        return add(self, *args)

    monkeypatch.setattr(steps_table.StepsTable, "add_decode_steps", spy)
    for output_len in (12, 3000, 20000):
        sc = load_scenario({
            "name": f"leap_{output_len}", "mode": {"type": "open"},
            "settings": {"num_gpu_blocks": 3000, "block_size": 16, "max_num_seqs": 4,
                         "max_model_len": 20100},
            "requests": [{"id": f"r{i}", "prompt_len": 40 + i, "output_len": output_len - i,
                          "arrival_step": 0} for i in range(2)]})
        for cost in (None, LinearCost()):
            lengths.clear()
            exact = simulate(sc, cost_model=cost, fast_path="off")
            leapt = simulate(sc, cost_model=cost, fast_path="leap")
            assert leapt.steps_csv() == exact.steps_csv()
            assert leapt.requests_csv() == exact.requests_csv()
            longest = max(lengths)
            if output_len == 12:
                assert longest <= steps_table._ROWS_MAX
            elif output_len == 3000:
                assert steps_table._ROWS_MAX < longest <= steps_table._RUN_MAX
            else:
                assert longest > steps_table._RUN_MAX
