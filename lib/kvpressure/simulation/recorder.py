"""What the engine tells a recorder (the Prometheus view, ``prom_view.PromRecorder``, or a
test double), as a typed contract.

Times are engine-clock seconds. ``Recorder`` is the whole contract, which ``PromRecorder``
implements. A recorder may implement only part of it (a test double, the twin's token-gap
collector): ``RecorderHooks`` looks its methods up once when a run starts, so the loop
never probes per step, and the engine falls back where the contract says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from kvpressure.simulation.request import Request

__all__ = ["Recorder", "RecorderHooks"]


@runtime_checkable
class Recorder(Protocol):
    """The engine's calls, in the order they happen within one step."""

    def on_arrival(self, req: Request, t: float) -> None:
        """Submission. Open loop in time: ``t`` is the request's ``arrival_time_s``;
        otherwise the start of the step it is submitted before."""

    def on_scheduled(self, req: Request, t: float) -> None:
        """Each admission (new or resumed), inside ``schedule()``; ``t`` = start of the
        step."""

    def on_preempted(self, req: Request, t: float) -> None:
        """Each preemption, inside ``schedule()``; ``t`` = start of the step."""

    def on_output(self, req: Request, t: float, new_tokens: int, finished: bool) -> None:
        """One output of one request; ``t`` = end of the step (the next step's start). The
        request's counters are up to date."""

    def on_decode_tokens(self, reqs: Sequence[Request], t: float) -> None:
        """Bulk form of ``on_output`` for plain decode tokens: in one step, every request
        of ``reqs`` emitted one token that is neither its first nor its last, stamped
        ``t``; it replaces their ``on_output`` calls of that step. Only the requests'
        identity may be read (their counters may lag). Without it: ``on_output``."""

    def on_decode_leap(self, reqs: Sequence[Request], times: Sequence[float]) -> None:
        """A leap (several decode-only steps at once): every request of ``reqs`` emitted one
        token at each time of ``times`` (one per step); none finished in these steps. Only
        the requests' identity may be read."""

    def on_step_end(self, t: float, num_running: int, num_waiting: int,
                    num_waiting_deferred: int, kv_usage: float, prefix_queries: int,
                    prefix_hits: int) -> None:
        """After ``update_from_output`` of a step; ``t`` = end of the step; ``prefix_*`` are
        that step's prefix-cache query/hit tokens (successful admissions)."""

    def on_steps_end(self, times: Sequence[float], num_running: Sequence[int],
                     num_waiting: Sequence[int], num_waiting_deferred: Sequence[int],
                     kv_usage: Sequence[float], prefix_queries: Sequence[int],
                     prefix_hits: Sequence[int]) -> None:
        """``on_step_end`` for a leap's steps, one entry per step in each sequence (numpy
        arrays in time mode, lists otherwise). Without it: ``on_step_end`` per step."""

    def maybe_scrape(self, t: float) -> None:
        """After each step's ``on_step_end`` and after each leap's ``on_steps_end`` (with the
        last step's end time)."""

    def finish(self, t: float) -> None:
        """Once, after the last step (not called for a run of no step): ``t`` = its end."""

    @property
    def next_scrape_time(self) -> float:
        """Engine-clock time of the next scrape: a leap ends with the step whose outputs
        reach it, so that the scrape sees what the step-by-step path shows it."""


_HOOKS = ("on_arrival", "on_scheduled", "on_preempted", "on_output", "on_decode_tokens",
          "on_decode_leap", "on_step_end", "on_steps_end", "maybe_scrape", "finish")


class RecorderHooks:
    """A recorder's methods looked up once (``None`` where it has none); ``scrape_clock``
    tells whether it has ``next_scrape_time`` (read at each leap, as it moves)."""

    __slots__ = (*_HOOKS, "recorder", "scrape_clock")

    # Set from the recorder by name (``_HOOKS``); declared for the type checker.
    on_arrival: Callable[..., Any] | None
    on_scheduled: Callable[..., Any] | None
    on_preempted: Callable[..., Any] | None
    on_output: Callable[..., Any] | None
    on_decode_tokens: Callable[..., Any] | None
    on_decode_leap: Callable[..., Any] | None
    on_step_end: Callable[..., Any] | None
    on_steps_end: Callable[..., Any] | None
    maybe_scrape: Callable[..., Any] | None
    finish: Callable[..., Any] | None

    def __init__(self, recorder: Recorder | Any | None) -> None:
        self.recorder = recorder
        for name in _HOOKS:
            setattr(self, name, getattr(recorder, name, None))
        # A property may refuse (AttributeError) when the recorder keeps no scrape clock.
        self.scrape_clock = getattr(recorder, "next_scrape_time", None) is not None

    def next_scrape_time(self) -> float | None:
        recorder = self.recorder
        return recorder.next_scrape_time if self.scrape_clock and recorder is not None else None
