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

Blocks are popped in exactly the order the step-by-step path pops them (the KV-cache
manager's ``append_blocks_of_steps``, one pop for the whole leap), so the free queue,
evictions and every row are identical.

This module decides what the scheduler does over the leapt steps. What the engine does over
them (time, clients, the steps table, the recorder) is the engine's: a leap reads none of its
fields and calls four of its methods, ``steps_before_submission``, ``decode_step_times``,
``steps_before_scrape`` and ``end_leap``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpressure.simulation.engine import Simulation
    from kvpressure.simulation.lazy_decode import LazyDecode
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


def try_leap(sim: Simulation, sched: Scheduler, lazy: LazyDecode, arrivals: int) -> bool:
    """Advance ``sim`` (its scheduler ``sched``, its decoding head ``lazy``) by a leap of at
    least two steps, or return False (nothing done)."""
    running = sched.running
    num_running = len(running)
    # Every running request must be a member (so all decode) and be served.
    if num_running == 0 or lazy.num_members != num_running \
            or num_running > sched.max_num_scheduled_tokens:
        return False
    clock = lazy.clock
    # Up to the step of the first member's last token, included: its update frees blocks,
    # so nothing after it can be leapt without a fresh look.
    until_finish = lazy.next_finish() - clock + 1
    if until_finish < 2:
        return False
    num_steps = until_finish
    # A submission comes before its step: the leap ends before it.
    until_submission = sim.steps_before_submission()
    if until_submission is not None and until_submission < num_steps:
        num_steps = until_submission
    if num_steps < 2:
        return False
    if len(sched.waiting) and not admission_blocked(
            sched, num_running, sched.max_num_scheduled_tokens - num_running):
        return False
    block_size = sched.block_size
    # The crossings of leapt step j are bucket (clock + j) % block_size.
    phase = clock % block_size
    crossings = lazy.buckets[phase:] + lazy.buckets[:phase]
    kv = sched.kv
    free = kv.num_free_blocks()
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
    # Σ (num_computed_tokens + 1) of the first leapt step.
    sum_ctx = lazy.sum_off + num_running * (clock + 1)
    t_start, durations, ends, num_steps = sim.decode_step_times(num_steps, num_running,
                                                                sum_ctx)
    num_steps = sim.steps_before_scrape(ends, num_steps)
    if num_steps < 2:
        return False
    del free_after[num_steps:]
    if ends is not None and durations is not None:
        durations = durations[:num_steps]
        ends = ends[:num_steps]
    # The crossing blocks in step order, running order within a step (#run-alloc).
    kv.append_blocks_of_steps([crossings[j % block_size] for j in range(num_steps)])
    if kv.enable_caching:
        # Members whose token of step j completes a block register its key.
        for j in range(num_steps):
            for r in crossings[(j + 1) % block_size]:
                kv.cache_blocks(r, r.num_computed_tokens + clock + j - r.lz_d0 + 1)
    last = clock + num_steps - 1
    finished = lazy.pop_finishing(last) if num_steps == until_finish else []
    lazy.clock = last + 1
    sim.end_leap(arrivals, finished, kv.usages(free_after), t_start, durations, ends)
    return True
