"""The recorder contract (simulation/recorder.py): the Prometheus view implements all of it
with signatures the engine's calls fit, and a partial recorder is looked up once."""

from __future__ import annotations

import inspect

from kvpressure.simulation.prom_view import PromRecorder
from kvpressure.simulation.recorder import Recorder, RecorderHooks

HOOKS = [n for n, v in vars(Recorder).items()
         if callable(v) and not n.startswith("_")]


def _positional(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_the_contract_names_every_call_the_engine_makes():
    assert set(HOOKS) == {"on_arrival", "on_scheduled", "on_preempted", "on_output",
                          "on_decode_tokens", "on_decode_leap", "on_step_end", "on_steps_end",
                          "maybe_scrape", "finish"}


def test_prom_recorder_implements_the_whole_contract():
    rec = PromRecorder("m", scrape_interval_s=1.0, max_model_len=64)
    assert isinstance(rec, Recorder)
    assert isinstance(rec.next_scrape_time, float)
    for name in HOOKS:
        want = _positional(getattr(Recorder, name))
        got = _positional(getattr(PromRecorder, name))
        # The engine passes arguments by position: PromRecorder's first parameters must be
        # the contract's, any further ones optional.
        assert got[:len(want)] == want, name
        extra = list(inspect.signature(getattr(PromRecorder, name)).parameters.values())
        assert all(p.default is not p.empty for p in extra[len(want):]), name


class _Partial:
    def __init__(self) -> None:
        self.outputs = 0

    def on_output(self, req, t, new_tokens, finished):
        self.outputs += 1

    @property
    def next_scrape_time(self):
        raise AttributeError  # keeps no scrape clock


def test_partial_recorder_hooks_are_none_where_missing():
    rec = _Partial()
    hooks = RecorderHooks(rec)
    assert hooks.on_output.__self__ is rec
    assert all(getattr(hooks, n) is None for n in HOOKS if n != "on_output")
    assert not hooks.scrape_clock and hooks.next_scrape_time() is None
    assert not isinstance(rec, Recorder)
    full = RecorderHooks(PromRecorder("m", scrape_interval_s=2.0, max_model_len=64,
                                      time_origin_s=1.0))
    assert full.scrape_clock and full.next_scrape_time() == 3.0
