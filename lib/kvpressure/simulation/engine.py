"""The driving loop (docs/scheduler.md section 4): arrivals, ``schedule()``, the fake model output,
``update_from_output()``, one row per iteration; in steps, or in time with a cost model.

Event-driven fast path
----------------------
When every running request is decoding (its last chunk reached the end of its tokens, so it
gets exactly one token), all of them fit in the token budget, and the head of the waiting
queue cannot be admitted (no budget left, ``max_num_active_seqs`` reached, or its
allocation gates fail; these stay failed while free blocks only shrink and ``running`` does
not change), the next steps differ only by which requests cross a block boundary. The engine
then advances many steps at once, up to (not including) the next event: a request's last
token, an arrival, or the first step whose block-boundary crossings (taken in ``running``
order, step by step) would exhaust the free blocks. Blocks are popped in exactly the order
the step-by-step path pops them, so the free queue, evictions and every row are identical;
``event_driven=False`` runs the plain step-by-step path for comparison.

On the event-driven path the scheduler also keeps the decode progress of the head of
``running`` lazily (``lazy_decode.py``): the members' counters follow from a shared clock,
block crossings and finishes are found in per-phase buckets and a heap, so both plain steps
and leaps cost work proportional to what they decide (crossings, finishes, admissions,
preemptions) rather than to the number of running requests. A request handed to a recorder
hook is always up to date (with a per-token recorder, that costs one update per member and
step); the counters of other running requests may lag until they are next touched.

Recorder: the calls it receives, and when, are the ``Recorder`` protocol (``recorder.py``).

Clock: without a cost model, step ``k`` starts at ``clock.t0 + k * clock.dt`` (the reference
harness: 1.0 + k * 0.015625 s) and its outputs are stamped one step later. With a cost model,
step ``k`` starts at ``time_s`` (0 at the start), lasts ``cost_model.step_time(features)``
seconds (0 for a step that schedules no token), and the next step starts when it ends.
"""

from __future__ import annotations

import time as _time
from array import array
from dataclasses import dataclass
from typing import Any

from kvpressure.errors import InputError
from kvpressure.simulation.lazy_decode import LazyDecode
from kvpressure.simulation.outputs import SimResult, StepsTable, percentile
from kvpressure.simulation.recorder import RecorderHooks
from kvpressure.simulation.request import FINISHED_LENGTH_CAPPED, PREEMPTED, RUNNING, Request
from kvpressure.simulation.scenario import Scenario
from kvpressure.simulation.scheduler import Scheduler, SchedulerOutput
from kvpressure.simulation.step_features import StepFeatures

__all__ = ["StepClock", "StepFeatures", "simulate", "SimulationStalled"]


class SimulationStalled(InputError):
    """The workload cannot make progress (a request can never be admitted)."""


@dataclass(frozen=True)
class StepClock:
    """The fixed clock of step-level runs: step ``k`` starts at ``t0 + k * dt``."""

    t0: float = 1.0
    dt: float = 0.015625


def _without(running: list[Request], finished: list[Request]) -> list[Request]:
    """``running`` minus the finished requests, order kept (in place when they are few:
    ``list.remove`` scans in C)."""
    if len(finished) * 8 < len(running):
        for r in finished:
            running.remove(r)
        return running
    return [r for r in running if r.status == RUNNING]


def simulate(scenario: Scenario, cost_model: Any = None, recorder: Any = None,
             event_driven: bool = True, clock: StepClock | None = None) -> SimResult:
    """Run the scenario through vLLM 0.33.0's scheduler model; see the module docstring."""
    return _Engine(scenario, cost_model, recorder, event_driven, clock or StepClock()).run()


class _Engine:
    def __init__(self, scenario: Scenario, cost_model, recorder, event_driven: bool,
                 clock: StepClock) -> None:
        self.scenario = scenario
        self.settings = scenario.settings
        self.cost_model = cost_model
        self.recorder = recorder
        self.event_driven = event_driven
        self.clock = clock
        self.timed = cost_model is not None
        s = self.settings
        groups = {g: i for i, g in enumerate(scenario.prefix_groups)}
        self.requests = [
            Request(r.id, r.prompt_len, r.output_len, position=i, priority=r.priority,
                    prefix_group=r.prefix_group, prefix_len=r.prefix_len,
                    group_index=groups.get(r.prefix_group, -1) if r.prefix_group else -1,
                    block_size=s.block_size, arrival_step=r.arrival_step,
                    arrival_time_s=r.arrival_time_s, keyed=s.enable_prefix_caching)
            for i, r in enumerate(scenario.requests)]
        rec = recorder
        # Lazy decode progress (lazy_decode.py) on the event-driven path.
        self.lazy = LazyDecode(s.block_size, s.max_model_len, self.timed) if event_driven \
            else None
        self.sched = Scheduler(s, self.lazy)
        self.steps = StepsTable(self.timed)
        self.closed = scenario.mode == "closed"
        self.time_arrivals = (not self.closed
                              and any(r.arrival_time_s is not None for r in self.requests))
        if self.time_arrivals and not self.timed:
            raise InputError(f"{scenario.source}: requests give arrival_time_s but no cost "
                             "model gives steps a duration; use arrival_step")
        if self.closed:
            self.order = list(self.requests)
        elif self.time_arrivals:
            self.order = sorted(self.requests, key=lambda r: (r.arrival_time_s or 0.0,
                                                              r.position))
        else:
            self.order = sorted(self.requests, key=lambda r: (r.arrival_step, r.position))
        self.next_idx = 0
        self.num_submitted = 0
        self.unfinished = 0
        self.step = 0
        self.t = 0.0
        self.itl_values: list[float] = []
        self.itl_weights: list[int] = []
        self.recompute_time_s = 0.0
        # Looked up once (recorder.py): a recorder may implement only part of the contract.
        hooks = self.hooks = RecorderHooks(rec)
        self.r_arrival = hooks.on_arrival
        self.r_scheduled = hooks.on_scheduled
        self.r_preempted = hooks.on_preempted
        self.r_output = hooks.on_output
        self.r_leap = hooks.on_decode_leap
        self.r_tokens = hooks.on_decode_tokens
        self.r_step_end = hooks.on_step_end
        self.r_steps_end = hooks.on_steps_end
        self.r_scrape = hooks.maybe_scrape
        if self.timed:
            import numpy as np

            self.np = np

    # -- time -----------------------------------------------------------------------------
    def _step_start(self) -> float:
        if self.timed:
            return self.t
        return self.clock.t0 + self.step * self.clock.dt

    def _price(self, out: SchedulerOutput) -> float:
        if out.num_scheduled_tokens == 0:
            return 0.0
        f = StepFeatures(out.num_prefill_tokens, out.num_decode_seqs, out.num_prefill_seqs,
                         out.sum_decode_ctx, out.sum_prefill_attn, out.sum_prefill_ctx)
        d = float(self.cost_model.step_time(f))
        if out.recomputed_tokens:
            # The same step had the recomputed KV been kept: each chunk loses its recomputed
            # head and starts that much later.
            attn = 0.0
            seqs = 0
            for start, p, r in out.chunks:
                p2 = p - r
                if p2 > 0:
                    seqs += 1
                    attn += p2 * (start + r + p2 / 2)
            f2 = StepFeatures(out.num_prefill_tokens - out.recomputed_tokens,
                              out.num_decode_seqs, seqs, out.sum_decode_ctx, attn,
                              out.sum_prefill_ctx)
            d2 = float(self.cost_model.step_time(f2)) if (
                f2.num_prefill_tokens or f2.num_decode_seqs) else 0.0
            self.recompute_time_s += max(0.0, d - d2)
        return d

    # -- arrivals -------------------------------------------------------------------------
    def _submit(self, req: Request, t: float) -> None:
        req.arrival_time = self.num_submitted
        self.num_submitted += 1
        req.submit_step = self.step
        req.submit_time_s = t
        self.unfinished += 1
        self.sched.add_request(req)
        if self.r_arrival is not None:
            self.r_arrival(req, t)

    def _submit_arrivals(self) -> int:
        order = self.order
        n0 = self.num_submitted
        if self.closed:
            c = self.scenario.concurrency
            t = self._step_start()
            while self.unfinished < c and self.next_idx < len(order):
                self._submit(order[self.next_idx], t)
                self.next_idx += 1
        elif self.time_arrivals:
            while self.next_idx < len(order) and \
                    (order[self.next_idx].arrival_time_s or 0.0) <= self.t:
                r = order[self.next_idx]
                self._submit(r, r.arrival_time_s or 0.0)
                self.next_idx += 1
        else:
            t = self._step_start()
            while self.next_idx < len(order) and order[self.next_idx].arrival_step <= self.step:
                self._submit(order[self.next_idx], t)
                self.next_idx += 1
        return self.num_submitted - n0

    def _jump_to_next_arrival(self) -> bool:
        if self.closed or self.next_idx >= len(self.order):
            return False
        nxt = self.order[self.next_idx]
        if self.time_arrivals:
            self.t = max(self.t, nxt.arrival_time_s or 0.0)
        else:
            self.step = max(self.step, nxt.arrival_step)
        return True

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> SimResult:
        t_wall = _time.perf_counter()
        sched = self.sched
        idle_steps = 0
        while True:
            arrivals = self._submit_arrivals()
            if self.unfinished == 0 and self.next_idx >= len(self.order):
                # The reference harness stops once every request has finished; the empty step after
                # a drain (docs/scheduler.md#loop-drain) is recorded only when more arrivals follow.
                break
            if not sched.has_requests():
                if self._jump_to_next_arrival():
                    continue
                break
            if self.event_driven and self._try_leap(arrivals):
                idle_steps = 0
                continue
            n_tok = self._normal_step(arrivals)
            if n_tok == 0 and not sched.running and arrivals == 0:
                idle_steps += 1
                if idle_steps > 2:
                    head = sched.waiting.peek() if len(sched.waiting) else None
                    raise SimulationStalled(
                        f"{self.scenario.source}: no progress at step {self.step}: request "
                        f"{head.request_id if head else '?'} can never be admitted")
            else:
                idle_steps = 0
        loop_wall = _time.perf_counter() - t_wall
        finish = self.hooks.finish
        if finish is not None and len(self.steps):
            finish(self.t if self.timed
                   else self.clock.t0 + self.step * self.clock.dt)
        n = len(self.steps)
        timing = {"loop_wall_s": round(loop_wall, 6),
                  "steps_per_second": round(n / loop_wall, 1) if loop_wall > 0 else 0.0}
        return SimResult(self.scenario, self.steps, self.requests, timing,
                         self._time_stats() if self.timed else None, self.recorder)

    def _normal_step(self, arrivals: int) -> int:
        sched = self.sched
        kv = sched.kv
        step = self.step
        t0 = self._step_start()
        if self.r_scheduled is not None:
            r_sched = self.r_scheduled
            sched.on_admit = lambda r: r_sched(r, t0)
        if self.r_preempted is not None:
            r_pre = self.r_preempted
            sched.on_preempt = lambda r: r_pre(r, t0)
        out = sched.schedule(step)
        nl = out.num_lazy
        # The members served this step, for the per-token recorder (before finishes leave).
        members = sched.running[:nl] if nl and self.r_output is not None else ()
        waiting = sched.waiting
        num_running = len(sched.running)
        num_waiting = len(waiting)
        usage = kv.pool.get_usage()
        if self.timed:
            dur = self._price(out)
            t1 = t0 + dur
        else:
            dur = 0.0
            t1 = self.clock.t0 + (step + 1) * self.clock.dt
        if nl and self.timed:
            # Every lazy member's token: its gap is this step's (its last one ended at t0).
            gap = t1 - t0
            self.lazy.record(gap, t1)
            self.itl_values.append(gap)
            self.itl_weights.append(nl)
        emitted = sched.update_from_output(out, step)
        finished = len(out.finished)
        if finished and self.timed:
            for r in out.finished:
                r.finish_time_s = t1
        r_output = self.r_output
        if members:
            # Members come first in scheduling order; brought up to date for the recorder.
            lz = self.lazy
            if self.r_tokens is not None:
                # The bulk hook takes the plain decode tokens (its contract needs only the
                # requests' identity); a member that finished still gets its own output.
                if finished:
                    self.r_tokens([r for r in members if r.status <= PREEMPTED], t1)
                    members = [r for r in members if r.status > PREEMPTED]
                else:
                    self.r_tokens(members, t1)
                    members = ()
            for r in members:
                if r.lz_d0 >= 0:
                    lz.sync(r)
                r_output(r, t1, 1, r.status > PREEMPTED)
        if not self.timed and r_output is None:
            emitted = ()
        for r in emitted:
            if self.timed:
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
            fin = r.status > PREEMPTED
            if fin:
                r.finish_time_s = t1
            if r_output is not None:
                r_output(r, t1, 1, fin)
        self.unfinished -= finished
        num_waiting_after = len(waiting)
        usage_after = kv.pool.get_usage()
        row = (step, arrivals, num_running, len(out.scheduled) + nl, num_waiting,
               num_waiting - waiting.num_preempted, waiting.num_preempted,
               len(sched.deferred_waiting), usage, out.num_scheduled_tokens,
               out.num_prefill_tokens, out.num_decode_tokens, out.admitted_new, out.resumed,
               out.recomputed_tokens, len(out.preempted), finished, len(sched.running),
               num_waiting_after, usage_after, out.prefix_cache_queries,
               out.prefix_cache_hits)
        if self.timed:
            row += (t0, dur)
        self.steps.append(row)
        if self.r_step_end is not None:
            self.r_step_end(t1, len(sched.running), num_waiting_after,
                            len(sched.deferred_waiting), usage_after,
                            out.prefix_cache_queries, out.prefix_cache_hits)
        if self.r_scrape is not None:
            self.r_scrape(t1)
        self.step = step + 1
        self.t = t1
        return out.num_scheduled_tokens

    # -- event-driven fast path -----------------------------------------------------------
    def _admission_blocked(self, num_running: int, budget_left: int) -> bool:
        """True when the waiting head cannot be admitted now nor in any following step in
        which ``running`` is unchanged and free blocks only decrease."""
        sched = self.sched
        if budget_left <= 0 or num_running >= sched.max_num_active_seqs:
            return True
        kv = sched.kv
        head = sched.waiting.peek()
        hit, h = kv.get_computed_blocks(head)
        L = head.num_tokens
        n = L - h
        T = sched.long_prefill_token_threshold
        if 0 < T < n:
            n = T
        if n > budget_left:
            if not sched.chunked_prefill:
                return True
            n = budget_left
        if kv.can_admit(head, n, hit, h, sched.reserve_full_isl, True):
            return False
        # Without the full-sequence gate, a capped chunk's gate can loosen when an eviction
        # shortens the head's hit (fewer ref-0 hit blocks to count against free).
        return sched.reserve_full_isl or not hit or n == L - h

    def _try_leap(self, arrivals: int) -> bool:
        sched = self.sched
        running = sched.running
        R = len(running)
        if R == 0 or R > sched.max_num_scheduled_tokens:
            return False
        B = sched.block_size
        lz = self.lazy
        # Every running request must be a lazy member (so all are decoding); the crossings
        # of step j are bucket (clk + j) % B, the first finish is the heap's top.
        if lz.n != R:
            return False
        clk = lz.clock
        K = lz.next_finish() - clk + 1
        if K < 2:
            return False
        groups = lz.buckets[clk % B:] + lz.buckets[:clk % B]
        # The leap may end with the step of the first finish (its update frees blocks, so
        # nothing after it can be leapt without a fresh look).
        k_finish = K
        if not self.closed and not self.time_arrivals and self.next_idx < len(self.order):
            K = min(K, self.order[self.next_idx].arrival_step - self.step)
        if K < 2:
            return False
        if len(sched.waiting) and not self._admission_blocked(
                R, sched.max_num_scheduled_tokens - R):
            return False
        pool = sched.kv.pool
        free = pool.num_free_blocks
        counts = [len(g) for g in groups]
        # Free blocks after each step; stop before the first step that cannot be served.
        free_after: list[int] = []
        cum = 0
        for j in range(K):
            cum += counts[j % B]
            if cum > free:
                K = j
                break
            free_after.append(free - cum)
        if K < 2:
            return False
        t_start = self._step_start()
        durations = None
        if self.timed:
            np = self.np
            j = np.arange(K)
            sum_ctx = lz.sum_off + R * (clk + 1)  # Σ (num_computed_tokens + 1)
            f = StepFeatures(np.zeros(K, dtype=np.int64), np.full(K, R, dtype=np.int64),
                             np.zeros(K, dtype=np.int64), sum_ctx + R * j,
                             np.zeros(K), np.zeros(K, dtype=np.int64))
            durations = np.broadcast_to(
                np.asarray(self.cost_model.step_time(f), dtype=float), (K,))
            # Sequential sums, so that every time equals the step-by-step path's bit for bit.
            ends = np.cumsum(np.concatenate(([t_start], durations)))[1:]
            if self.time_arrivals and self.next_idx < len(self.order):
                nxt = self.order[self.next_idx].arrival_time_s or 0.0
                # Step j starts at ends[j-1]; it must start before the next arrival.
                starts = np.concatenate(([t_start], ends[:-1]))
                k2 = int(np.searchsorted(starts, nxt, side="left"))
                if k2 < K:
                    K = k2
                    if K < 2:
                        return False
                    durations = durations[:K]
                    ends = ends[:K]
                    free_after = free_after[:K]
        else:
            ends = None
        scrape_at = self.hooks.next_scrape_time()
        if scrape_at is not None:
            # End the leap with the step whose outputs reach the recorder's next scrape, so
            # that the scrape sees exactly what the step-by-step path shows it.
            if ends is None:
                dt, t0c = self.clock.dt, self.clock.t0
                # The first step k whose end reaches the scrape (at most K - 1): estimated,
                # then settled by the clock's own expression, so no walk over the leap.
                step0 = self.step

                def before(k: int) -> bool:
                    return t0c + (step0 + k + 1) * dt < scrape_at

                k_s = min(max(int((scrape_at - t0c) / dt) - step0 - 1, 0), K - 1)
                while k_s > 0 and not before(k_s - 1):
                    k_s -= 1
                while k_s < K - 1 and before(k_s):
                    k_s += 1
            else:
                k_s = int(self.np.searchsorted(ends, scrape_at, side="left"))
            if k_s + 1 < K:
                K = k_s + 1
                if K < 2:
                    return False
                free_after = free_after[:K]
                if ends is not None:
                    durations = durations[:K]
                    ends = ends[:K]
        finishing = K == k_finish
        # Pop the crossing blocks in step order, running order within a step: one
        # get_new_blocks call pops (and evicts) them in exactly that order.
        new_blocks = pool.get_new_blocks(free - free_after[K - 1])
        i = 0
        for j in range(K):
            g = groups[j % B]
            if g:
                m = i + len(g)
                for r, b in zip(g, new_blocks[i:m]):  # noqa: B905 (same length)
                    r.blocks.append(b)
                i = m
        kv = sched.kv
        caching = kv.enable_caching
        if self.r_leap is not None or self.r_output is not None:
            # The leap's batch, finished requests included, for the recorder
            # (sched.running loses the finished ones in place).
            running = list(running)
        if caching:
            # Members whose token of step j completes a block register its key.
            for j in range(K):
                for r in groups[(j + 1) % B]:
                    kv.cache_blocks(r, r.num_computed_tokens + clk + j - r.lz_d0 + 1)
        finished = lz.pop_finishing(clk + K - 1) if finishing else []
        lz.clock = clk + K
        if self.timed:
            # Gaps of the leapt steps, for the members' inter-token statistics (the first one
            # follows the previous step's end, when every member emitted its last token).
            gaps = np.diff(ends, prepend=t_start).tolist()
            lz.gaps.extend(gaps)
            lz.ends.extend(ends.tolist())
        if finished:
            # The last leapt step's update_from_output: free in scheduling order
            # (docs/scheduler.md#upd-finish).
            for r in finished:
                lz.leave(r)
                r.status = FINISHED_LENGTH_CAPPED
                r.finish_step = self.step + K - 1
                kv.free(r)
                sched.finished_req_ids.append(r.request_id)
            sched.running = _without(sched.running, finished)
            self.unfinished -= len(finished)
        # Rows.
        steps = self.steps
        step0 = self.step
        waiting = sched.waiting
        W = len(waiting)
        Wp = waiting.num_preempted
        D = len(sched.deferred_waiting)
        denom = pool.usage_denominator
        usage = [1.0 - fa / denom for fa in free_after]
        cols = steps.columns
        cols["step"].extend(range(step0, step0 + K))
        # One array per distinct value and width (outputs.py: request counts in 32 bits,
        # token counts in 64), shared by the columns that repeat it.
        zeros = array("q", (0,)) * K
        zeros32 = array("i", (0,)) * K
        rK = array("q", (R,)) * K
        rK32 = array("i", (R,)) * K
        wK32 = array("i", (W,)) * K if W else zeros32
        cols["arrivals"].append(arrivals)
        cols["arrivals"].extend(zeros32[1:])
        cols["num_running"].extend(rK32)
        cols["num_scheduled_reqs"].extend(rK32)
        cols["num_scheduled_tokens"].extend(rK)
        cols["num_decode_tokens"].extend(rK)
        cols["num_waiting"].extend(wK32)
        cols["num_waiting_after"].extend(wK32)
        cols["num_waiting_new"].extend(array("i", (W - Wp,)) * K if Wp else wK32)
        cols["num_waiting_preempted"].extend(array("i", (Wp,)) * K if Wp else zeros32)
        cols["num_waiting_deferred"].extend(array("i", (D,)) * K if D else zeros32)
        for name in ("num_prefill_tokens", "recomputed_tokens", "prefix_cache_queries",
                     "prefix_cache_hits"):
            cols[name].extend(zeros)
        for name in ("admitted_new", "resumed", "preemptions"):
            cols[name].extend(zeros32)
        F = len(finished)
        cols["finished"].extend(zeros32[1:])
        cols["finished"].append(F)
        cols["num_running_after"].extend(rK32[1:])
        cols["num_running_after"].append(R - F)
        cols["kv_usage"].extend(usage)
        usage_last = pool.get_usage() if F else usage[-1]
        kv_after = cols["kv_usage_after"]
        kv_after.extend(usage)
        kv_after[-1] = usage_last
        if self.timed:
            np = self.np
            starts = np.concatenate(([t_start], ends[:-1]))
            steps.extend("time_s", starts.tolist())
            steps.extend("step_duration_s", durations.tolist())
            times = ends
            t_end = float(ends[-1])
            # Inter-token gaps: each request's first leapt token follows its last token;
            # the later ones are the step durations, the same for every request.
            # Every member's first leapt token follows the previous step's end: all gaps are
            # step durations, shared by the R members (their own counters follow from
            # lz.gaps when they are next synced).
            self.itl_values.append(float(ends[0]) - t_start)
            self.itl_weights.append(R)
            for r in finished:
                r.finish_time_s = t_end
            self.itl_values.extend(np.diff(ends).tolist())
            self.itl_weights.extend([R] * (K - 1))
            self.t = t_end
        else:
            dt = self.clock.dt
            t0 = self.clock.t0
            times = [t0 + (step0 + j + 1) * dt for j in range(K)]
            t_end = times[-1]
        # Recorder: the leapt steps in aggregate; a last step with finishes as a plain step.
        bulk = self.r_tokens is not None
        if self.r_output is not None and not bulk:
            for r in running:
                if r.lz_d0 >= 0:
                    lz.sync(r)  # what on_output is handed is up to date
        Kl = K - 1 if F else K
        if Kl:
            if self.r_leap is not None:
                self.r_leap(running, times[:Kl])
            if self.r_steps_end is not None:
                zeros = [0] * Kl
                self.r_steps_end(times[:Kl], [R] * Kl, [W] * Kl, [D] * Kl, usage[:Kl], zeros,
                                 zeros)
            elif self.r_step_end is not None:
                for j in range(Kl):
                    self.r_step_end(float(times[j]), R, W, D, usage[j], 0, 0)
            if self.r_scrape is not None:
                self.r_scrape(float(times[Kl - 1]))
        if F:
            if bulk:
                self.r_tokens([r for r in running if r.status <= PREEMPTED], float(t_end))
            if self.r_output is not None:
                for r in running:
                    if r.status > PREEMPTED or not bulk:
                        if r.lz_d0 >= 0:
                            lz.sync(r)
                        self.r_output(r, float(t_end), 1, r.status > PREEMPTED)
            if self.r_step_end is not None:
                self.r_step_end(float(t_end), R - F, W, D, usage_last, 0, 0)
            if self.r_scrape is not None:
                self.r_scrape(float(t_end))
        self.step = step0 + K
        return True

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

