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


def _scrapes(sc, recorder_cls, event_driven):
    rec = recorder_cls.for_step_clock(sc, scrape_every_steps=7)
    simulate(sc, recorder=rec, event_driven=event_driven)
    rec.finish()
    return rec.to_jsonl()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_bulk_paths_equal_per_output_path(data):
    sc = load_scenario(data)
    plain = _scrapes(sc, PlainRecorder, False)
    assert _scrapes(sc, PromRecorder, True) == plain
    assert _scrapes(sc, PromRecorder, False) == plain


def test_plain_recorder_hides_the_bulk_hooks():
    rec = PlainRecorder()
    assert getattr(rec, "on_decode_tokens", None) is None
    assert getattr(rec, "next_scrape_time", None) is None
    assert callable(rec.on_output)
