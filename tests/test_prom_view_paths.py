"""The Prometheus view's bulk paths (decode tokens in bulk, leapt steps, the decode stream that
lets per-request fields lag) give exactly the scrapes of the plain per-output path."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from kvpressure.simulation.engine import simulate
from kvpressure.simulation.prom_view import PromRecorder
from kvpressure.simulation.scenario import load_scenario
from sim_helpers import workloads


class PlainRecorder(PromRecorder):
    """The same recorder seen through its per-output hooks only: the engine then calls
    ``on_output`` for every token and ``on_step_end`` for every step."""

    on_decode_tokens = None
    on_decode_leap = None
    on_steps_end = None
    next_scrape_time = None

    def __getattribute__(self, name):
        if name in ("on_decode_tokens", "on_decode_leap", "on_steps_end", "next_scrape_time"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def _scrapes(sc, recorder_cls, fast_path):
    rec = recorder_cls.for_step_clock(sc, scrape_every_steps=7)
    simulate(sc, recorder=rec, fast_path=fast_path)
    rec.finish()
    return rec.to_jsonl()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_bulk_paths_equal_per_output_path(data):
    sc = load_scenario(data)
    plain = _scrapes(sc, PlainRecorder, "off")
    for fast_path in ("leap", "lazy", "off"):
        assert _scrapes(sc, PromRecorder, fast_path) == plain, fast_path


def test_plain_recorder_hides_the_bulk_hooks():
    rec = PlainRecorder()
    assert getattr(rec, "on_decode_tokens", None) is None
    assert getattr(rec, "next_scrape_time", None) is None
    assert callable(rec.on_output)


class _Req:
    """A hashable request double (identity hash, like the engine's requests)."""

    def __init__(self, rid: str) -> None:
        self.request_id = rid
        self.num_prompt_tokens = 10
        self.max_tokens = 100
        self.num_tokens = 10
        self.num_preemptions = 0
        self.prefix_hit_tokens_at_admission = 0
        self.arrival_time_s = None


def _drive(make_req, bulk: bool) -> str:
    """Twenty requests decoding; some miss a step (leave the batch) and come back, alone, in
    pairs or by half, one is preempted and one finishes; told through the bulk hook or one
    ``on_output`` per token."""
    rec = PromRecorder("m", scrape_interval_s=0.05, max_model_len=256)
    reqs = [make_req(f"r{i}") for i in range(20)]
    for r in reqs:
        rec.on_arrival(r, 0.0)
        rec.on_scheduled(r, 0.0)
    every = list(range(20))
    batches = [every, every, every, [i for i in every if i != 7], every,
               [i for i in every if i not in (3, 15)], [15, *(i for i in range(15) if i != 3), 3, *range(16, 20)],
               every[10:], every[::-1], every, [i for i in every if i != 0], every[1:],
               every[1:]]
    t = 0.0
    emitted: set[int] = set()
    for step, batch in enumerate(batches):
        t += 0.01 * (1 + step % 3)
        if step == 9:
            rec.on_preempted(reqs[0], t)
        first = [i for i in batch if i not in emitted]
        for i in first:
            rec.on_output(reqs[i], t, 1, False)
            emitted.add(i)
        rest = [reqs[i] for i in batch if i not in first]
        if bulk:
            rec.on_decode_tokens(rest, t)
        else:
            for r in rest:
                rec.on_output(r, t, 1, False)
        if step == 10:
            rec.on_output(reqs[0], t + 0.001, 1, True)
        rec.on_step_end(t, len(batch), 0, 0, 0.5)
        rec.maybe_scrape(t)
    rec.finish(t)
    return rec.to_jsonl()


def test_bulk_decode_hook_with_hashable_and_unhashable_requests():
    """The decode stream gives the per-output scrapes whether the requests can be dict keys
    (the engine's) or not (SimpleNamespace doubles: the stream then holds their states)."""
    from types import SimpleNamespace

    def unhashable(rid):
        return SimpleNamespace(**vars(_Req(rid)))

    plain = _drive(_Req, bulk=False)
    assert "vllm:inter_token_latency_seconds_count" in plain
    assert _drive(_Req, bulk=True) == plain
    assert _drive(unhashable, bulk=True) == _drive(unhashable, bulk=False) == plain
