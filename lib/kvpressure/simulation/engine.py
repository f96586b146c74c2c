"""The driving loop (docs/scheduler.md section 4): arrivals, ``schedule()``, the fake model output,
``update_from_output()``, one row per iteration; in steps, or in time with a cost model.

Fast paths (docs/scheduler.md section 8), chosen by ``simulate(..., fast_path=...)``; each gives
the bytes of the exact path:

* ``"off"``: the exact scheduler step alone, every request keeping its own counters;
* ``"lazy"``: the decoding head of ``running`` kept as a shared clock (``lazy_decode.py``), so
  a step costs work proportional to what it decides (block crossings, finishes, admissions,
  preemptions) rather than to the number of running requests;
* ``"leap"`` (default): lazy, plus many decode-only steps advanced at once up to the next event
  (``leap.py``).

A request handed to a recorder hook is always up to date (with a per-token recorder, that costs
one update per member and step); the counters of other running requests may lag until they
are next touched. What the recorder receives, and when, is the ``Recorder`` protocol
(``recorder.py``).

Clock: without a cost model, step ``k`` starts at ``clock.t0 + k * clock.dt`` (the reference
harness: 1.0 + k * 0.015625 s) and its outputs are stamped one step later. With a cost model,
step ``k`` starts at ``time_s`` (0 at the start), lasts ``cost_model.step_time(features)``
seconds (0 for a step that schedules no token), and the next step starts when it ends.
A closed loop's late clients (``mode.return_steps``, docs/scheduler.md#loop-closed-return) are
counted in steps in both clocks: an engine with nothing to run jumps to the step of the next
return, which with a cost model starts when the last step that ran ended.

Request path (``request_path.py``, docs/scheduler.md#time-path): with a cost model, an open-loop
request reaches the engine core ``request_path.input_s(prompt_len)`` after its client sent it,
and joins the waiting queue before the first step scheduled at or after that time. A step is
scheduled when the previous one ends, or, with ``async_scheduling``, when the previous one
starts (the engine core keeps two steps in flight); after an idle wait, at once. With
``async_scheduling`` a closed loop's clients come back one step later. The client reads every
token ``request_path.output_s`` after the step that computed it ended: requests carry the
client's times (send, first token, last token, finish), the recorder the engine core's.
"""

from __future__ import annotations

import time as _time
from collections import deque
from typing import Any

from kvpressure.errors import InputError
from kvpressure.simulation.lazy_decode import DecodeProgress, LazyDecode
from kvpressure.simulation.leap import try_leap
from kvpressure.simulation.outputs import SimResult, percentile
from kvpressure.simulation.recorder import Recorder, RecorderHooks
from kvpressure.simulation.request import PREEMPTED, Request
from kvpressure.simulation.request_path import NO_PATH, RequestPath
from kvpressure.simulation.scenario import Scenario
from kvpressure.simulation.scheduler import Scheduler, SchedulerOutput, decode_step_output
from kvpressure.simulation.step_clock import StepClock
from kvpressure.simulation.step_features import StepFeatures
from kvpressure.simulation.steps_table import StepsTable

__all__ = ["FAST_PATHS", "Simulation", "SimulationStalled", "StepClock", "StepFeatures",
           "simulate"]

FAST_PATHS = ("off", "lazy", "leap")


class SimulationStalled(InputError):
    """The workload cannot make progress (a request can never be admitted)."""


def simulate(scenario: Scenario, cost_model: Any = None, recorder: Recorder | Any = None,
             fast_path: str = "leap", clock: StepClock | None = None,
             request_path: RequestPath | None = None) -> SimResult:
    """Run the scenario through vLLM 0.33.0's scheduler model; see the module docstring.
    ``request_path`` defaults to the cost model's own (``cost_model.request_path``), if any."""
    return Simulation(scenario, cost_model, recorder, fast_path, clock, request_path).run()


class Simulation:
    """One run: ``Simulation(...).run()`` is ``simulate(...)``. Between steps (from a
    recorder hook) ``scheduler`` and ``decode`` may be read, not changed; ``lazy`` is
    ``decode`` when a fast path is on, else None. A leap (``leap.py``) asks the engine only
    through the four methods of the section below that names it."""

    def __init__(self, scenario: Scenario, cost_model: Any = None,
                 recorder: Recorder | Any = None, fast_path: str = "leap",
                 clock: StepClock | None = None,
                 request_path: RequestPath | None = None) -> None:
        t_setup = _time.perf_counter()
        if fast_path not in FAST_PATHS:
            raise InputError(f"fast_path: {fast_path!r} is not one of {', '.join(FAST_PATHS)}")
        self.scenario = scenario
        self.settings = s = scenario.settings
        self.cost_model = cost_model
        self.recorder = recorder
        self.clock = clock or StepClock()
        # Read at every step: kept as plain floats (the clock is a Python dataclass).
        self.clock_t0: float = self.clock.t0
        self.clock_dt: float = self.clock.dt
        self.timed = cost_model is not None
        if request_path is None:
            request_path = getattr(cost_model, "request_path", None) or NO_PATH
        self.path: RequestPath = request_path
        self.async_scheduling = bool(s.async_scheduling)
        if self.async_scheduling and not self.timed:
            raise InputError(f"{scenario.source}: settings.async_scheduling: true is modelled "
                             "in time (when steps are scheduled): give a cost model")
        if not self.timed and not request_path.is_zero:
            raise InputError(f"{scenario.source}: a request path needs a cost model (time)")
        groups = {g: i for i, g in enumerate(scenario.prefix_groups)}
        self.requests = [
            Request(r.id, r.prompt_len, r.output_len, position=i, priority=r.priority,
                    prefix_group=r.prefix_group, prefix_len=r.prefix_len,
                    group_index=groups.get(r.prefix_group, -1) if r.prefix_group else -1,
                    block_size=s.block_size, arrival_step=r.arrival_step,
                    arrival_time_s=r.arrival_time_s, keyed=s.enable_prefix_caching)
            for i, r in enumerate(scenario.requests)]
        # Looked up once (recorder.py): a recorder may implement only part of the contract.
        self.hooks = hooks = RecorderHooks(recorder)
        # The hooks object is plain Python: a step without any of its per-step hooks does
        # not read them (a native flag instead).
        self.step_hooks = (hooks.on_output is not None or hooks.on_step_end is not None
                           or hooks.maybe_scrape is not None)
        self.lazy = LazyDecode(int(s.block_size), int(s.max_model_len), self.timed) \
            if fast_path != "off" else None
        self.decode: DecodeProgress = self.lazy or DecodeProgress()
        # A per-token recorder without the leap's bulk hook would miss the leapt tokens.
        self.leaps = fast_path == "leap" and (hooks.on_output is None
                                              or hooks.on_decode_leap is not None)
        self.scheduler = Scheduler(s, self.decode)
        self.scheduler.record_chunks = self.timed
        # Admissions and preemptions happen inside schedule(): stamped with the step's start.
        self.step_start = 0.0
        if hooks.on_scheduled is not None:
            on_scheduled = hooks.on_scheduled
            self.scheduler.on_admit = lambda r: on_scheduled(r, self.step_start)
        if hooks.on_preempted is not None:
            on_preempted = hooks.on_preempted
            self.scheduler.on_preempt = lambda r: on_preempted(r, self.step_start)
        self.steps = StepsTable(self.timed)
        self.closed = scenario.mode == "closed"
        # Read at every step of a closed loop (the scenario is a Python dataclass).
        self.concurrency: int = scenario.concurrency or 0  # set in every closed loop
        # A closed loop whose clients come back late (docs/scheduler.md#loop-closed): the step
        # before which each idle client submits, oldest first. Finishes come in step order and
        # the lag is the same for all, so the queue stays sorted. Without a lag the loop keeps
        # its plain count (``unfinished < concurrency``), which is the same rule.
        self.client_returns: deque[int] | None = None
        # Async scheduling: the step after a finish was scheduled before it (one step later).
        self.return_steps = scenario.return_steps + (1 if self.async_scheduling else 0)
        if self.closed and (self.return_steps or scenario.first_alone):
            c = scenario.concurrency or 0
            self.client_returns = deque([0] + [1 if scenario.first_alone else 0] * (c - 1))
        self.time_arrivals = (not self.closed
                              and any(r.arrival_time_s is not None for r in self.requests))
        if self.time_arrivals and not self.timed:
            raise InputError(f"{scenario.source}: requests give arrival_time_s but no cost "
                             "model gives steps a duration; use arrival_step")
        # When each open-loop request reaches the engine core (its client's send plus the
        # request path), in the order of self.order.
        self.engine_arrivals: list[float] = []
        if self.closed:
            self.order = list(self.requests)
        elif self.time_arrivals:
            path = self.path
            self.order = sorted(self.requests, key=lambda r: (
                (r.arrival_time_s or 0.0) + path.input_s(r.num_prompt_tokens), r.position))
            self.engine_arrivals = [(r.arrival_time_s or 0.0) + path.input_s(r.num_prompt_tokens)
                                    for r in self.order]
        else:
            self.order = sorted(self.requests, key=lambda r: (r.arrival_step, r.position))
        self.next_idx = 0
        self.num_submitted = 0
        self.unfinished = 0
        self.step = 0
        self.t = 0.0
        # When the next step is scheduled: arrivals up to then join it (time mode).
        self.schedule_t = 0.0
        # Inter-token gaps (value, how many tokens had it), for the ITL percentiles.
        self.itl_values: list[float] = []
        self.itl_weights: list[int] = []
        self.recompute_time_s = 0.0
        self.setup_s = _time.perf_counter() - t_setup

    # -- time -----------------------------------------------------------------------------
    def _step_start(self) -> float:
        if self.timed:
            return self.t
        return self.clock_t0 + self.step * self.clock_dt

    def _price(self, out: SchedulerOutput) -> float:
        if out.num_scheduled_tokens == 0:
            return 0.0
        f = StepFeatures(out.num_prefill_tokens, out.num_decode_seqs, out.num_prefill_seqs,
                         out.sum_decode_ctx, out.sum_prefill_attn, out.sum_prefill_ctx)
        duration = float(self.cost_model.step_time(f))
        if out.recomputed_tokens:
            # The same step had the recomputed KV been kept: each chunk loses its recomputed
            # head and starts that much later.
            attn = 0.0
            seqs = 0
            for start, chunk, recomputed in out.chunks:
                kept = chunk - recomputed
                if kept > 0:
                    seqs += 1
                    attn += kept * (start + recomputed + kept / 2)
            f2 = StepFeatures(out.num_prefill_tokens - out.recomputed_tokens,
                              out.num_decode_seqs, seqs, out.sum_decode_ctx, attn,
                              out.sum_prefill_ctx)
            without = float(self.cost_model.step_time(f2)) if (
                f2.num_prefill_tokens or f2.num_decode_seqs) else 0.0
            self.recompute_time_s += max(0.0, duration - without)
        return duration

    # -- arrivals -------------------------------------------------------------------------
    def _submit(self, req: Request, t: float) -> None:
        req.arrival_time = self.num_submitted
        self.num_submitted += 1
        req.submit_step = self.step
        req.submit_time_s = t
        self.unfinished += 1
        self.scheduler.add_request(req)
        if self.hooks.on_arrival is not None:
            self.hooks.on_arrival(req, t)

    def _submit_arrivals(self) -> int:
        order = self.order
        n0 = self.num_submitted
        if self.client_returns is not None:
            returns = self.client_returns
            if not returns or returns[0] > self.step:
                return 0
            t = self._step_start()
            while returns and returns[0] <= self.step and self.next_idx < len(order):
                returns.popleft()
                self._submit(order[self.next_idx], t)
                self.next_idx += 1
        elif self.closed:
            concurrency = self.concurrency
            if self.unfinished >= concurrency:
                return 0
            t = self._step_start()
            while self.unfinished < concurrency and self.next_idx < len(order):
                self._submit(order[self.next_idx], t)
                self.next_idx += 1
        elif self.time_arrivals:
            arrivals = self.engine_arrivals
            cut = self.schedule_t
            while self.next_idx < len(order) and arrivals[self.next_idx] <= cut:
                r = order[self.next_idx]
                self._submit(r, r.arrival_time_s or 0.0)
                self.next_idx += 1
        else:
            t = self._step_start()
            while self.next_idx < len(order) and order[self.next_idx].arrival_step <= self.step:
                self._submit(order[self.next_idx], t)
                self.next_idx += 1
        return self.num_submitted - n0

    def client_finished(self, num_finished: int, step: int) -> None:
        """Requests finished in ``step``: their clients submit again before step
        ``step + 1 + return_steps``."""
        self.unfinished -= num_finished
        if self.client_returns is not None and num_finished:
            self.client_returns.extend([step + 1 + self.return_steps] * num_finished)

    def next_return_step(self) -> int | None:
        """The step before which a client comes back with a request still to send, if any."""
        returns = self.client_returns
        if returns and self.next_idx < len(self.order):
            return returns[0]
        return None

    def _jump_to_next_arrival(self) -> bool:
        if self.closed:
            # An idle engine waits for the next client; its idle steps take no time (timed
            # runs) or only their clock ticks (step runs).
            nxt = self.next_return_step()
            if nxt is None:
                return False
            self.step = max(self.step, nxt)
            return True
        if self.next_idx >= len(self.order):
            return False
        head = self.order[self.next_idx]
        if self.time_arrivals:
            # An idle engine core schedules as soon as the request reaches it.
            self.t = self.schedule_t = max(self.t, self.engine_arrivals[self.next_idx])
        else:
            self.step = max(self.step, head.arrival_step)
        return True

    # -- what a leap asks of the engine (leap.py calls these, and nothing else of it) -------
    def steps_before_submission(self) -> int | None:
        """Steps that may run from this one before a client's return or a step-level arrival
        submits a request; None when none is due (arrivals in time are cut by
        ``decode_step_times``)."""
        if self.client_returns is not None:
            back = self.next_return_step()
            return back - self.step if back is not None else None
        if not self.closed and not self.time_arrivals and self.next_idx < len(self.order):
            return self.order[self.next_idx].arrival_step - self.step
        return None

    def decode_step_times(self, num_steps: int, num_running: int, sum_ctx: int
                          ) -> tuple[float, Any, Any, int]:
        """``(start, durations, ends, n)`` of the next ``num_steps`` steps if each decodes
        one token of ``num_running`` requests (``sum_ctx``: their Σ context in the first,
        one more a request each step after): the first step's start, each step's duration
        and end priced at once (None untimed), and ``n``, how many of them are scheduled
        before the next request reaches the engine core (``num_steps`` when none does)."""
        t_start = self._step_start()
        if not self.timed:
            return t_start, None, None, num_steps
        # Here, not with the module: a run on the step clock never needs numpy (its import
        # would be most of a short run's process); a cost model has imported it already.
        import numpy as np

        js = np.arange(num_steps)
        f = StepFeatures(np.zeros(num_steps, dtype=np.int64),
                         np.full(num_steps, num_running, dtype=np.int64),
                         np.zeros(num_steps, dtype=np.int64), sum_ctx + num_running * js,
                         np.zeros(num_steps), np.zeros(num_steps, dtype=np.int64))
        durations = np.broadcast_to(
            np.asarray(self.cost_model.step_time(f), dtype=float), (num_steps,))
        # Sequential sums, so that every time equals the step-by-step path's bit for bit.
        ends = np.cumsum(np.concatenate(([t_start], durations)))[1:]
        if self.time_arrivals and self.next_idx < len(self.order):
            nxt = self.engine_arrivals[self.next_idx]
            # Step j is scheduled at ends[j-1] (async: ends[j-2], when step j-1 started);
            # it must be scheduled before the next request reaches the engine core.
            if self.async_scheduling:
                cuts = np.concatenate(([self.schedule_t, t_start], ends[:-2]))[:num_steps]
            else:
                cuts = np.concatenate(([t_start], ends[:-1]))
            num_steps = min(num_steps, int(np.searchsorted(cuts, nxt, side="left")))
        return t_start, durations, ends, num_steps

    def steps_before_scrape(self, ends: Any, num_steps: int) -> int:
        """How many of ``num_steps`` leapt steps (ending at ``ends``, None on the step clock)
        may run: up to the one whose outputs reach the recorder's next scrape, so that the
        scrape sees exactly what the step-by-step path shows it."""
        scrape_at = self.hooks.next_scrape_time()
        if scrape_at is None:
            return num_steps
        return min(num_steps, self._first_step_reaching(ends, num_steps, scrape_at) + 1)

    def _first_step_reaching(self, ends: Any, num_steps: int, t: float) -> int:
        """The first of ``num_steps`` leapt steps whose end reaches ``t`` (at most
        ``num_steps - 1``)."""
        if ends is not None:
            import numpy as np

            return int(np.searchsorted(ends, t, side="left"))
        dt, t0, step0 = self.clock.dt, self.clock.t0, self.step

        def before(k: int) -> bool:
            return t0 + (step0 + k + 1) * dt < t

        # Estimated, then settled by the clock's own expression, so no walk over the leap.
        k = min(max(int((t - t0) / dt) - step0 - 1, 0), num_steps - 1)
        while k > 0 and not before(k - 1):
            k -= 1
        while k < num_steps - 1 and before(k):
            k += 1
        return k

    def end_leap(self, arrivals: int, finished: list[Request], usage: list[float],
                 t_start: float, durations: Any, ends: Any) -> None:
        """A leap of ``len(usage)`` steps (``usage``: the KV usage after each), whose
        scheduling leap.py has applied, from the engine's side: the clock and the decoding
        head's step times, the last step's update (``finished``, in running order), the
        rows, the recorder's calls. ``t_start``, ``durations``, ``ends``: as
        ``decode_step_times`` gave them, cut to the leap."""
        sched = self.scheduler
        lazy = self.lazy
        assert lazy is not None  # a leap needs the decoding head
        hooks = self.hooks
        num_steps = len(usage)
        running = sched.running
        num_running = len(running)
        # The batch as it was, for the recorder (the finishes leave running).
        members = list(running) if hooks.recorder is not None else running
        if ends is not None:
            # Every member's tokens: the first follows the previous step's end, so all gaps
            # are step durations, shared by the members (their own counters follow from the
            # head's step times when they are next synced, so these come before the
            # finishes).
            import numpy as np

            gaps = np.diff(ends, prepend=t_start).tolist()
            lazy.record_steps(gaps, ends.tolist())
            self.itl_values.extend(gaps)
            self.itl_weights.extend([num_running] * num_steps)
            times: Any = ends
            self.t = t_end = float(ends[-1])
            self.schedule_t = (float(ends[-2]) if num_steps > 1 else t_start) \
                if self.async_scheduling else t_end
        else:
            t0, dt, step0 = self.clock_t0, self.clock_dt, self.step
            # Each step's end, for the recorder only; the last one by the same expression.
            times = [t0 + (step0 + j + 1) * dt for j in range(num_steps)] \
                if hooks.recorder is not None else None
            t_end = t0 + (step0 + num_steps) * dt
        num_finished = len(finished)
        if finished:
            # The last step's update_from_output.
            sched.finish_requests(finished, self.step + num_steps - 1)
            self.client_finished(num_finished, self.step + num_steps - 1)
            for r in finished:
                r.finish_time_s = t_end
        usage_last = sched.kv.usage() if finished else usage[-1]
        waiting = sched.waiting
        self.steps.add_decode_steps(self.step, arrivals, num_running, len(waiting),
                                    waiting.num_preempted, len(sched.deferred_waiting),
                                    decode_step_output(num_running), usage, num_finished,
                                    usage_last, t_start, durations, ends)
        if hooks.recorder is not None:
            self._report_leap(members, times, usage, num_finished, usage_last)
        self.step += num_steps

    def _report_leap(self, members: list[Request], times: Any, usage: list[float],
                     num_finished: int, usage_last: float) -> None:
        """The leapt steps to the recorder in aggregate (tokens, per-step gauges, the scrapes
        due); a last step with finishes as a plain step."""
        hooks = self.hooks
        sched = self.scheduler
        num_running = len(members)
        num_waiting = len(sched.waiting)
        num_deferred = len(sched.deferred_waiting)
        num_leapt = len(usage) - 1 if num_finished else len(usage)
        if num_leapt:
            if hooks.on_decode_leap is not None:
                hooks.on_decode_leap(members, times[:num_leapt])
            if hooks.on_steps_end is not None:
                zeros = [0] * num_leapt
                hooks.on_steps_end(times[:num_leapt], [num_running] * num_leapt,
                                   [num_waiting] * num_leapt, [num_deferred] * num_leapt,
                                   usage[:num_leapt], zeros, zeros)
            elif hooks.on_step_end is not None:
                for j in range(num_leapt):
                    hooks.on_step_end(float(times[j]), num_running, num_waiting,
                                      num_deferred, usage[j], 0, 0)
            if hooks.maybe_scrape is not None:
                hooks.maybe_scrape(float(times[num_leapt - 1]))
        if num_finished:
            t_end = float(times[-1])
            if hooks.on_output is not None:
                self.report_head_tokens(members, num_finished, t_end)
            if hooks.on_step_end is not None:
                hooks.on_step_end(t_end, num_running - num_finished, num_waiting,
                                  num_deferred, usage_last, 0, 0)
            if hooks.maybe_scrape is not None:
                hooks.maybe_scrape(t_end)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> SimResult:
        t_wall = _time.perf_counter()
        sched = self.scheduler
        leaps = self.leaps
        lazy = self.lazy
        num_requests = len(self.order)
        idle_steps = 0
        while True:
            arrivals = self._submit_arrivals()
            if self.unfinished == 0 and self.next_idx >= num_requests:
                # The reference harness stops once every request has finished; the empty step after
                # a drain (docs/scheduler.md#loop-drain) is recorded only when more arrivals follow.
                break
            if not sched.has_requests():
                if self._jump_to_next_arrival():
                    continue
                break
            # A leap needs every running request in the decoding head (checked first here:
            # most steps of a busy run fail there).
            if leaps and lazy is not None and lazy.num_members == len(sched.running) \
                    and try_leap(self, sched, lazy, arrivals):
                idle_steps = 0
                continue
            num_tokens = self._step(arrivals)
            if num_tokens == 0 and not sched.running and arrivals == 0:
                idle_steps += 1
                if idle_steps > 2:
                    head = sched.waiting.peek() if len(sched.waiting) else None
                    raise SimulationStalled(
                        f"{self.scenario.source}: no progress at step {self.step}: request "
                        f"{head.request_id if head else '?'} can never be admitted")
            else:
                idle_steps = 0
        t_finish = _time.perf_counter()
        loop_wall = t_finish - t_wall
        if self.timed and not self.path.is_zero:
            self._to_client_times()
        if self.hooks.finish is not None and len(self.steps):
            self.hooks.finish(self.t if self.timed
                              else self.clock.t0 + self.step * self.clock.dt)
        num_steps = len(self.steps)
        stats = self._time_stats() if self.timed else None
        # The loop alone: imports, set-up and what follows the loop (client times, the
        # recorder's last samples, the time statistics) are timed apart, so that the figure
        # compares with another scheduler's loop (benchmarks/bench_kinds.py) and the three
        # add up to the call (benchmarks/bench_cli.py).
        timing = {"loop_wall_s": round(loop_wall, 6),
                  "steps_per_second": round(num_steps / loop_wall, 1) if loop_wall > 0
                  else 0.0,
                  "setup_s": round(self.setup_s, 6),
                  "finish_s": round(_time.perf_counter() - t_finish, 6)}
        return SimResult(self.scenario, self.steps, self.requests, timing, stats,
                         self.recorder)

    def _step(self, arrivals: int) -> int:
        """One ``schedule()`` and ``update_from_output()``: its row and its recorder calls."""
        sched = self.scheduler
        hooks = self.hooks
        step_hooks = self.step_hooks
        on_output = hooks.on_output if step_hooks else None
        step = self.step
        clock_t0 = self.clock_t0
        clock_dt = self.clock_dt
        t0 = self.step_start = self.t if self.timed else clock_t0 + step * clock_dt
        out = sched.schedule(step)
        num_lazy = out.num_lazy
        # The members served this step, for the per-token recorder (before finishes leave).
        members = sched.running[:num_lazy] if num_lazy and on_output is not None else ()
        waiting = sched.waiting
        num_running = len(sched.running)
        num_waiting = len(waiting)
        num_waiting_preempted = waiting.num_preempted
        kv = sched.kv
        usage = kv.usage()
        if self.timed:
            duration = self._price(out)
            t1 = t0 + duration
        else:
            duration = 0.0
            t1 = clock_t0 + (step + 1) * clock_dt
        lazy = self.lazy
        if num_lazy and self.timed and lazy is not None:
            # Every lazy member's token: its gap is this step's (its last one ended at t0).
            lazy.record(t1 - t0, t1)
            self.itl_values.append(t1 - t0)
            self.itl_weights.append(num_lazy)
        emitted = sched.update_from_output(out, step)
        num_finished = len(out.finished)
        if members:
            # Members come first in scheduling order.
            self.report_head_tokens(members, num_finished, t1)
        if self.timed:
            self._stamp_tokens(out, emitted, t1)
        if on_output is not None:
            for r in emitted:
                on_output(r, t1, 1, r.status > PREEMPTED)
        if num_finished:
            self.client_finished(num_finished, step)
        num_waiting_after = len(waiting)
        num_running_after = len(sched.running)
        num_deferred = len(sched.deferred_waiting)
        usage_after = kv.usage()
        self.steps.add_step(step, arrivals, num_running, num_waiting, num_waiting_preempted,
                            num_deferred, usage, out, num_finished, num_running_after,
                            num_waiting_after, usage_after, t0, duration)
        if step_hooks:
            if hooks.on_step_end is not None:
                hooks.on_step_end(t1, num_running_after, num_waiting_after, num_deferred,
                                  usage_after, out.prefix_cache_queries, out.prefix_cache_hits)
            if hooks.maybe_scrape is not None:
                hooks.maybe_scrape(t1)
        self.step = step + 1
        self.t = t1
        self.schedule_t = t0 if self.async_scheduling else t1
        return out.num_scheduled_tokens

    def report_head_tokens(self, members: list[Request], num_finished: int, t1: float
                           ) -> None:
        """The per-token recorder's calls for the decoding head's tokens of one step (stamped
        ``t1``); ``num_finished``: how many of the step's requests finished."""
        hooks = self.hooks
        if hooks.on_decode_tokens is not None:
            # The bulk hook takes the plain decode tokens (its contract needs only the
            # requests' identity); a member that finished still gets its own output.
            if num_finished:
                hooks.on_decode_tokens([r for r in members if r.status <= PREEMPTED], t1)
                members = [r for r in members if r.status > PREEMPTED]
            else:
                hooks.on_decode_tokens(members, t1)
                return
        lazy = self.lazy
        on_output = hooks.on_output
        if on_output is None or lazy is None:
            return  # not called without a per-token recorder, nor without a decoding head
        for r in members:
            if r.lz_d0 >= 0:  # brought up to date (a finished member left up to date)
                lazy.sync(r)
            on_output(r, t1, 1, r.status > PREEMPTED)

    def _stamp_tokens(self, out: SchedulerOutput, emitted: list[Request], t1: float) -> None:
        """Time mode: token times and inter-token gaps of the requests that emitted one
        outside the lazy head."""
        for r in emitted:
            if r.num_output_tokens == 1:
                r.first_token_time_s = t1
            else:
                gap = t1 - r.last_token_time_s
                r.num_itl += 1
                if gap > r.itl_max_s:
                    r.itl_max_s = gap
                self.itl_values.append(gap)
                self.itl_weights.append(1)
            r.last_token_time_s = t1
        for r in out.finished:
            r.finish_time_s = t1

    def _to_client_times(self) -> None:
        """The client's view of each request: tokens read ``output_s`` after their step
        ended; a closed-loop request sent ``input_s`` before it reached the engine core (an
        open-loop one carries its client's send time already)."""
        path = self.path
        out = path.output_s
        for r in self.requests:
            r.first_token_time_s += out
            r.last_token_time_s += out
            r.finish_time_s += out
            if self.closed:
                r.submit_time_s -= path.input_s(r.num_prompt_tokens)

    # -- time summary ---------------------------------------------------------------------
    def _time_stats(self) -> dict[str, Any]:
        reqs = self.requests
        duration = self.t
        n_out = sum(r.num_output_tokens for r in reqs)
        n_in = sum(r.num_prompt_tokens for r in reqs)
        ttfts = [r.first_token_time_s - r.submit_time_s for r in reqs]
        e2e = [r.finish_time_s - r.submit_time_s for r in reqs]
        vals, wts = self.itl_values, self.itl_weights
        # A request's gaps sum to (last token - first token): exact on both engine paths.
        n_itl = sum(r.num_itl for r in reqs)
        itl_mean = (sum(r.last_token_time_s - r.first_token_time_s for r in reqs if r.num_itl)
                    / n_itl if n_itl else 0.0)
        return {
            "duration_s": duration,
            "output_throughput": n_out / duration if duration > 0 else 0.0,
            "total_token_throughput": (n_in + n_out) / duration if duration > 0 else 0.0,
            "request_throughput": len(reqs) / duration if duration > 0 else 0.0,
            "ttft_mean_s": sum(ttfts) / len(ttfts),
            "ttft_p95_s": percentile(ttfts, None, 0.95),
            "itl_mean_s": itl_mean,
            "itl_p95_s": percentile(vals, wts, 0.95),
            "itl_p99_s": percentile(vals, wts, 0.99),
            "e2e_mean_s": sum(e2e) / len(e2e),
            "recompute_time_s": self.recompute_time_s,
        }

