"""Leaps (docs/scheduler.md#fast-leap): many decode-only steps advanced at once.

When every running request is a member of the lazy decoding head (``lazy_decode.py``: all
decode, all fit the budget), and the head of the waiting queue cannot be admitted (no budget
left, ``max_num_active_seqs`` reached, or its allocation gates fail; these stay failed while
free blocks only shrink and ``running`` does not change), the next steps differ only by which
requests cross a block boundary. A leap advances them up to the next event: it ends with the
step of a request's last token (whose finishes go through the scheduler's own
``finish_requests``, as ``update_from_output``'s do), before an arrival, before the first
step whose crossings (taken in ``running`` order, step by step) would exhaust the free
blocks, or with the step whose outputs reach the recorder's next scrape. A leap preempts
nothing and admits nothing.

Blocks are popped in exactly the order the step-by-step path pops them (one
``get_new_blocks`` call for the whole leap), so the free queue, evictions and every row are
identical.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from kvpressure.simulation.step_features import StepFeatures

if TYPE_CHECKING:
    from kvpressure.simulation.engine import Simulation
    from kvpressure.simulation.scheduler import Scheduler


def admission_blocked(sched: Scheduler, num_running: int, budget_left: int) -> bool:
    """True when the waiting head cannot be admitted now nor in any following step in which
    ``running`` is unchanged and free blocks only decrease (docs/scheduler.md#adm-scan)."""
    if budget_left <= 0 or num_running >= sched.max_num_active_seqs:
        return True
    kv = sched.kv
    head = sched.waiting.peek()
    hit_blocks, h = kv.get_computed_blocks(head)
    n = sched.first_chunk(head, h, budget_left, sched.threshold())
    if not n:
        return True
    if kv.can_admit(head, n, hit_blocks, h, sched.reserve_full_isl, True):
        return False
    # Without the full-sequence gate, a capped chunk's gate can loosen when an eviction
    # shortens the head's hit (fewer ref-0 hit blocks to count against free).
    return sched.reserve_full_isl or not hit_blocks or n == head.num_tokens - h


def try_leap(sim: Simulation, arrivals: int) -> bool:
    """Advance ``sim`` by a leap of at least two steps, or return False (nothing done)."""
    sched = sim.scheduler
    lazy = sim.lazy
    running = sched.running
    num_running = len(running)
    # Every running request must be a member (so all decode) and be served.
    if lazy is None or num_running == 0 or lazy.num_members != num_running \
            or num_running > sched.max_num_scheduled_tokens:
        return False
    clock = lazy.clock
    # Up to the step of the first member's last token, included: its update frees blocks,
    # so nothing after it can be leapt without a fresh look.
    until_finish = lazy.next_finish() - clock + 1
    num_steps = until_finish
    if sim.client_returns is not None:
        # A client coming back submits before its step: the leap ends before it.
        back = sim.next_return_step()
        if back is not None:
            num_steps = min(num_steps, back - sim.step)
    elif not sim.closed and not sim.time_arrivals and sim.next_idx < len(sim.order):
        num_steps = min(num_steps, sim.order[sim.next_idx].arrival_step - sim.step)
    if num_steps < 2:
        return False
    if len(sched.waiting) and not admission_blocked(
            sched, num_running, sched.max_num_scheduled_tokens - num_running):
        return False
    block_size = sched.block_size
    # The crossings of leapt step j are bucket (clock + j) % block_size.
    phase = clock % block_size
    crossings = lazy.buckets[phase:] + lazy.buckets[:phase]
    pool = sched.kv.pool
    free = pool.num_free_blocks
    # Free blocks after each step; stop before the first step that cannot be served.
    free_after: list[int] = []
    popped = 0
    for j in range(num_steps):
        popped += len(crossings[j % block_size])
        if popped > free:
            num_steps = j
            break
        free_after.append(free - popped)
    if num_steps < 2:
        return False
    t_start = sim._step_start()
    durations = ends = None
    if sim.timed:
        js = np.arange(num_steps)
        sum_ctx = lazy.sum_off + num_running * (clock + 1)  # Σ (num_computed_tokens + 1)
        f = StepFeatures(np.zeros(num_steps, dtype=np.int64),
                         np.full(num_steps, num_running, dtype=np.int64),
                         np.zeros(num_steps, dtype=np.int64), sum_ctx + num_running * js,
                         np.zeros(num_steps), np.zeros(num_steps, dtype=np.int64))
        durations = np.broadcast_to(
            np.asarray(sim.cost_model.step_time(f), dtype=float), (num_steps,))
        # Sequential sums, so that every time equals the step-by-step path's bit for bit.
        ends = np.cumsum(np.concatenate(([t_start], durations)))[1:]
        if sim.time_arrivals and sim.next_idx < len(sim.order):
            nxt = sim.engine_arrivals[sim.next_idx]
            # Step j is scheduled at ends[j-1] (async: ends[j-2], when step j-1 started);
            # it must be scheduled before the next request reaches the engine core.
            if sim.async_scheduling:
                cuts = np.concatenate(([sim.schedule_t, t_start], ends[:-2]))[:num_steps]
            else:
                cuts = np.concatenate(([t_start], ends[:-1]))
            num_steps = min(num_steps, int(np.searchsorted(cuts, nxt, side="left")))
    scrape_at = sim.hooks.next_scrape_time()
    if scrape_at is not None:
        # End the leap with the step whose outputs reach the recorder's next scrape, so that
        # the scrape sees exactly what the step-by-step path shows it.
        num_steps = min(num_steps, _steps_until(sim, ends, num_steps, scrape_at) + 1)
    if num_steps < 2:
        return False
    del free_after[num_steps:]
    if ends is not None and durations is not None:
        durations = durations[:num_steps]
        ends = ends[:num_steps]
    # Pop the crossing blocks in step order, running order within a step: one
    # get_new_blocks call pops (and evicts) them in exactly that order.
    new_blocks = pool.get_new_blocks(free - free_after[-1])
    i = 0
    for j in range(num_steps):
        group = crossings[j % block_size]
        if group:
            m = i + len(group)
            for r, b in zip(group, new_blocks[i:m]):  # noqa: B905 (same length)
                r.blocks.append(b)
            i = m
    kv = sched.kv
    if kv.enable_caching:
        # Members whose token of step j completes a block register its key.
        for j in range(num_steps):
            for r in crossings[(j + 1) % block_size]:
                kv.cache_blocks(r, r.num_computed_tokens + clock + j - r.lz_d0 + 1)
    last = clock + num_steps - 1
    finished = lazy.pop_finishing(last) if num_steps == until_finish else []
    lazy.clock = last + 1
    # The leap's batch for the recorder (running loses the finished requests).
    hooks = sim.hooks
    members = list(running) if hooks.recorder is not None else running
    if ends is not None:
        # Every member's tokens: the first follows the previous step's end, so all gaps are
        # step durations, shared by the members (their own counters follow from lazy.gaps
        # when they are next synced, so these come before the finishes).
        gaps = np.diff(ends, prepend=t_start).tolist()
        lazy.gaps.extend(gaps)
        lazy.ends.extend(ends.tolist())
        sim.itl_values.extend(gaps)
        sim.itl_weights.extend([num_running] * num_steps)
        times: Any = ends
        sim.t = t_end = float(ends[-1])
        sim.schedule_t = (float(ends[-2]) if num_steps > 1 else t_start) \
            if sim.async_scheduling else t_end
    else:
        t0, dt, step0 = sim.clock_t0, sim.clock_dt, sim.step
        # Each step's end, for the recorder only; the last one by the same expression.
        times = [t0 + (step0 + j + 1) * dt for j in range(num_steps)] \
            if hooks.recorder is not None else None
        t_end = t0 + (step0 + num_steps) * dt
    usage = [1.0 - fa / pool.usage_denominator for fa in free_after]
    if finished:
        # The last step's update_from_output.
        sched.finish_requests(finished, sim.step + num_steps - 1)
        sim.client_finished(len(finished), sim.step + num_steps - 1)
        for r in finished:
            r.finish_time_s = t_end
    usage_last = pool.get_usage() if finished else usage[-1]
    _write_rows(sim, arrivals, num_running, len(finished), usage, usage_last, t_start,
                durations, ends)
    if hooks.recorder is not None:
        _tell_recorder(sim, members, times, usage, len(finished), usage_last)
    sim.step += num_steps
    return True


def _steps_until(sim: Simulation, ends, num_steps: int, scrape_at: float) -> int:
    """The first leapt step whose end reaches ``scrape_at`` (at most ``num_steps - 1``)."""
    if ends is not None:
        return int(np.searchsorted(ends, scrape_at, side="left"))
    dt, t0, step0 = sim.clock.dt, sim.clock.t0, sim.step

    def before(k: int) -> bool:
        return t0 + (step0 + k + 1) * dt < scrape_at

    # Estimated, then settled by the clock's own expression, so no walk over the leap.
    k = min(max(int((scrape_at - t0) / dt) - step0 - 1, 0), num_steps - 1)
    while k > 0 and not before(k - 1):
        k -= 1
    while k < num_steps - 1 and before(k):
        k += 1
    return k


def _write_rows(sim: Simulation, arrivals: int, num_running: int, num_finished: int,
                usage: list[float], usage_last: float, t_start: float, durations, ends
                ) -> None:
    """The leap's rows, by column (docs/scheduler.md#loop-row): every step serves the same
    ``num_running`` members one decode token each and changes no queue but by the finishes
    of its last step; only the step, the KV usage and the times differ."""
    num_steps = len(usage)
    sched = sim.scheduler
    waiting = sched.waiting
    num_waiting = len(waiting)
    num_preempted = waiting.num_preempted
    num_deferred = len(sched.deferred_waiting)
    if num_steps <= _ROWS_MAX:
        _append_rows(sim, arrivals, num_running, num_finished, usage, usage_last, t_start,
                     durations, ends, num_waiting, num_preempted, num_deferred)
        return
    if num_steps <= _RUN_MAX:
        u = usage[0]
        duration = float(durations[0]) if durations is not None else 0.0
        sim.steps.append_run(
            (sim.step, arrivals, num_running, num_running, num_waiting,
             num_waiting - num_preempted, num_preempted, num_deferred, u, num_running, 0,
             num_running, 0, 0, 0, 0, 0, num_running, num_waiting, u, 0, 0, t_start,
             duration),
            num_steps, usage, arrivals, num_finished, num_running - num_finished, usage_last,
            t_start, durations, ends)
        return
    cols = sim.steps.columns
    step0 = sim.step
    cols["step"].extend(range(step0, step0 + num_steps))
    # One array per distinct value and width (outputs.py: request counts in 32 bits, token
    # counts in 64), shared by the columns that repeat it.
    zeros = array("q", (0,)) * num_steps
    zeros32 = array("i", (0,)) * num_steps
    running64 = array("q", (num_running,)) * num_steps
    running32 = array("i", (num_running,)) * num_steps
    waiting32 = array("i", (num_waiting,)) * num_steps if num_waiting else zeros32
    for name in ("num_running", "num_scheduled_reqs", "num_running_after"):
        cols[name].extend(running32)
    for name in ("num_scheduled_tokens", "num_decode_tokens"):
        cols[name].extend(running64)
    for name in ("num_waiting", "num_waiting_after"):
        cols[name].extend(waiting32)
    for name, value in (("num_waiting_new", num_waiting - num_preempted),
                        ("num_waiting_preempted", num_preempted),
                        ("num_waiting_deferred", num_deferred)):
        cols[name].extend(array("i", (value,)) * num_steps if value else zeros32)
    for name in ("num_prefill_tokens", "recomputed_tokens", "prefix_cache_queries",
                 "prefix_cache_hits"):
        cols[name].extend(zeros)
    for name in ("arrivals", "admitted_new", "resumed", "preemptions", "finished"):
        cols[name].extend(zeros32)
    cols["kv_usage"].extend(usage)
    cols["kv_usage_after"].extend(usage)
    # The first step's arrivals; the last step's finishes.
    cols["arrivals"][-num_steps] = arrivals
    cols["finished"][-1] = num_finished
    cols["num_running_after"][-1] = num_running - num_finished
    cols["kv_usage_after"][-1] = usage_last
    if ends is not None:
        cols["time_s"].append(t_start)
        cols["time_s"].extend(ends[:-1].tolist())
        cols["step_duration_s"].extend(durations.tolist())


# Leaps up to this many steps long go into the table row by row (one packed row each);
# up to _RUN_MAX as one run of packed rows (its first row repeated, the columns that differ
# written over by numpy); longer ones by column (no run of rows that long is held twice
# in memory while the table joins it).
_ROWS_MAX: Final = 16
_RUN_MAX: Final = 16384


def _append_rows(sim: Simulation, arrivals: int, num_running: int, num_finished: int,
                 usage: list[float], usage_last: float, t_start: float, durations, ends,
                 num_waiting: int, num_preempted: int, num_deferred: int) -> None:
    """The rows of a short leap, the same values ``_write_rows`` puts in the columns."""
    append = sim.steps.append
    step = sim.step
    last = len(usage) - 1
    num_waiting_new = num_waiting - num_preempted
    t = t_start
    for k in range(last + 1):
        u = usage[k]
        time_s = duration = 0.0
        if ends is not None:
            time_s = t
            duration = float(durations[k])
            t = float(ends[k])
        if k < last:
            append((step + k, arrivals if k == 0 else 0, num_running, num_running, num_waiting,
                    num_waiting_new, num_preempted, num_deferred, u, num_running, 0,
                    num_running, 0, 0, 0, 0, 0, num_running, num_waiting, u, 0, 0, time_s,
                    duration))
        else:
            append((step + k, arrivals if k == 0 else 0, num_running, num_running, num_waiting,
                    num_waiting_new, num_preempted, num_deferred, u, num_running, 0,
                    num_running, 0, 0, 0, 0, num_finished, num_running - num_finished,
                    num_waiting, usage_last, 0, 0, time_s, duration))


def _tell_recorder(sim: Simulation, members: list, times, usage: list[float],
                   num_finished: int, usage_last: float) -> None:
    """The leapt steps in aggregate (tokens, per-step gauges, the scrapes due); a last step
    with finishes as a plain step."""
    hooks = sim.hooks
    sched = sim.scheduler
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
                hooks.on_step_end(float(times[j]), num_running, num_waiting, num_deferred,
                                  usage[j], 0, 0)
        if hooks.maybe_scrape is not None:
            hooks.maybe_scrape(float(times[num_leapt - 1]))
    if num_finished:
        t_end = float(times[-1])
        if hooks.on_output is not None:
            sim.report_head_tokens(members, num_finished, t_end)
        if hooks.on_step_end is not None:
            hooks.on_step_end(t_end, num_running - num_finished, num_waiting, num_deferred,
                              usage_last, 0, 0)
        if hooks.maybe_scrape is not None:
            hooks.maybe_scrape(t_end)
