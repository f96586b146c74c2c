"""Decode progress (docs/scheduler.md#fast-lazy): the hooks the scheduler calls about the
decoding head of ``running``, and the lazy implementation that keeps it as a clock.

Most requests in ``running`` spend most steps decoding: each step they gain exactly one
computed token, one token and one output, and need a block only when their position starts
one. Updating ~100 of them every step is the bulk of a busy simulation, although a step only
*decides* something about the few that cross a block boundary or reach their last token.

The scheduler (``scheduler.py``) reads as vLLM's ``schedule()``; it hands the decoding head of
``running`` to a ``DecodeProgress`` through five hooks:

* ``serve_head``: pass 1 over the head, before the general pass walks the rest;
* ``advance_head``: the head's share of ``_update_after_schedule`` (tokens, finishes);
* ``leave``: a request is preempted or finished (its counters must be up to date);
* ``served``: tokens the head gave a request outside the step's grants (a
  PRIORITY victim's budget comes back);
* ``extend_head``: after ``update_from_output``, requests that decoded right behind the head
  join it.

``DecodeProgress`` itself is the exact path (``fast_path="off"``): no head, every request keeps
its own counters, the hooks do nothing. ``LazyDecode`` holds the decoding requests that form
the head of ``running`` (they all get their token every step: ``serve_head`` serves them first,
and hands the step back to the general pass when the budget could not cover them). Their
counters are stored as of the clock value ``lz_d0`` at which they were last brought up to
date; the clock counts the steps they advanced together. Per request, everything else follows
by arithmetic:

* it starts a block at clock ``k`` when ``c + k - d0`` is a multiple of the block size, so
  requests are bucketed by ``(d0 - c) % block_size`` and bucket ``k % block_size`` holds the
  crossings of step ``k``, kept in ``running`` order (joins happen at the end of the head);
* it emits its last token at clock ``d0 + left - 1``; a heap gives the finishes in
  ``(clock, running order)``.

A request is brought up to date (``sync``) when the scheduler touches it: preemption,
finish, or leaving for any other reason. In time mode the gaps and end times of the lazy
steps are kept too, so that a request's inter-token statistics come out as if each token had
been stamped one at a time.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from kvpressure.simulation.request import Request

if TYPE_CHECKING:
    from kvpressure.simulation.scheduler import Scheduler, SchedulerOutput


class DecodeProgress:
    """The exact path: no decoding head, every hook a no-op. The scheduler calls
    ``serve_head`` and ``advance_head`` only while the head has members."""

    __slots__ = ()

    num_members = 0

    def serve_head(self, sched: Scheduler, out: SchedulerOutput, budget: int
                   ) -> tuple[int, int, bool]:
        """Pass 1 over the head: ``(index in running where the general pass goes on, budget
        left, whether pass 1 stopped)``."""
        return 0, budget, False

    def advance_head(self, out: SchedulerOutput) -> None:
        """The head's tokens of this step into ``out`` (its finishes first in
        ``out.finished``)."""

    def leave(self, req: Request) -> None:
        """``req`` is preempted or finishes: a member leaves the head, up to date."""

    def served(self, req: Request) -> int:
        """Tokens ``req`` got this step from ``serve_head``."""
        return 0

    def extend_head(self, running: list[Request], mark: int) -> None:
        """After ``update_from_output``: requests decoding right behind the head join it
        (those granted tokens in the call whose ``SchedulerOutput.mark`` is ``mark``)."""


class LazyDecode(DecodeProgress):
    __slots__ = ("block_size", "max_model_len", "clock", "num_members", "buckets", "heap",
                 "sum_off", "seq", "timed", "gaps", "ends")

    def __init__(self, block_size: int, max_model_len: int, timed: bool) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.clock = 0
        self.num_members = 0
        self.buckets: list[list[Request]] = [[] for _ in range(block_size)]
        # (clock of the last token, join sequence, request); stale after the request left.
        self.heap: list[tuple[int, int, Request]] = []
        # Σ (num_computed_tokens - clock) over the members: Σ c = sum_off + members * clock.
        self.sum_off = 0
        self.seq = 0
        self.timed = timed
        # Time mode: gap (end - start) and end time of each lazy step, indexed by clock.
        self.gaps: list[float] = []
        self.ends: list[float] = []

    # -- the scheduler's hooks ------------------------------------------------------------
    def serve_head(self, sched: Scheduler, out: SchedulerOutput, budget: int
                   ) -> tuple[int, int, bool]:
        """Only members starting a block need anything (docs/scheduler.md#run-alloc); a member
        that preempts itself under FCFS stops pass 1 (#pre-fcfs)."""
        members = self.num_members
        if not members:
            return 0, budget, False
        if members > budget:
            # The budget cannot serve every member: this step runs eagerly.
            self.flush(sched.running)
            return 0, budget, False
        clock = self.clock
        kv = sched.kv
        cross = self.buckets[clock % self.block_size]
        stopped = False
        # Enough free blocks for every crossing: popped in running order, at once.
        if cross and not kv.append_blocks(cross):
            # Not every crossing gets a block: preemptions, in running order. FCFS takes
            # victims from the end of running (members still to come in this bucket); PRIORITY
            # may take any running request, served members included (their token of this
            # step is then simply not counted: they leave before the clock moves).
            priority = sched.priority_policy
            for req in list(cross):
                if req.lz_d0 < 0:
                    continue  # preempted earlier in this step
                served = True
                while not kv.append_block(req):
                    victim = sched.preempt_at(sched.victim_index(), out)
                    if victim is req:
                        served = False
                        break
                if not served:
                    if priority:
                        continue
                    stopped = True
                    break
        if kv.enable_caching:
            # Members whose token completes a block register its key (#kv-cache-eager).
            for req in self.buckets[(clock + 1) % self.block_size]:
                kv.cache_blocks(req, req.num_computed_tokens + clock - req.lz_d0 + 1)
        members = self.num_members
        return members, budget - members, stopped

    def advance_head(self, out: SchedulerOutput) -> None:
        members = self.num_members
        if not members:
            return
        clock = self.clock
        out.num_lazy = members
        out.num_scheduled_tokens += members
        out.num_decode_tokens += members
        out.sum_decode_ctx += self.sum_off + members * (clock + 1)
        if self.next_finish() == clock:
            out.finished.extend(self.pop_finishing(clock))
        self.clock = clock + 1

    def leave(self, r: Request) -> None:
        if r.lz_d0 < 0:
            return
        self.sync(r)
        self.buckets[(r.lz_d0 - r.num_computed_tokens) % self.block_size].remove(r)
        self.sum_off -= r.num_computed_tokens - r.lz_d0
        self.num_members -= 1
        r.lz_d0 = -1
        r.lz_seq = 0  # its heap entries are stale by lz_d0 already; the int need not live on

    def served(self, req: Request) -> int:
        # A member still in running was served earlier in pass 1.
        return 1 if req.lz_d0 >= 0 else 0

    def extend_head(self, running: list[Request], mark: int) -> None:
        n = self.num_members
        while n < len(running):
            r = running[n]
            if r.is_prefill_chunk or r.grant_mark != mark:
                break
            self.join(r)
            n += 1

    # -- membership -----------------------------------------------------------------------
    def join(self, r: Request) -> None:
        """``r`` (up to date, decoding, not finished) becomes the last member."""
        clock = self.clock
        c = r.num_computed_tokens
        r.lz_d0 = clock
        self.seq += 1
        r.lz_seq = self.seq
        self.buckets[(clock - c) % self.block_size].append(r)
        left = r.max_tokens - r.num_output_tokens
        cap = self.max_model_len - r.num_tokens
        if cap < left:
            left = cap
        heapq.heappush(self.heap, (clock + left - 1, self.seq, r))
        self.sum_off += c - clock
        self.num_members += 1

    def sync(self, r: Request) -> None:
        """Bring a member's counters up to the current clock."""
        d0 = r.lz_d0
        e = self.clock - d0
        if e <= 0:
            return
        c = r.num_computed_tokens + e
        r.num_computed_tokens = c
        r.hwm = c
        r.num_tokens += e
        r.num_output_tokens += e
        r.scheduled_tokens += e
        r.lz_d0 = self.clock
        if self.timed:
            r.num_itl += e
            m = max(self.gaps[d0:self.clock])
            if m > r.itl_max_s:
                r.itl_max_s = m
            r.last_token_time_s = self.ends[self.clock - 1]

    def computed(self, r: Request, clock: int) -> int:
        """A member's ``num_computed_tokens`` at ``clock``."""
        return r.num_computed_tokens + clock - r.lz_d0

    def next_finish(self) -> int:
        """Clock of the next member's last token (drops stale heap entries); -1 if none."""
        heap = self.heap
        while heap:
            k, s, r = heap[0]
            if r.lz_d0 >= 0 and r.lz_seq == s:
                return k
            heapq.heappop(heap)
        return -1

    def pop_finishing(self, clock: int) -> list[Request]:
        """The members whose last token comes at ``clock``, in ``running`` order; they
        stay members (``update_from_output`` makes them leave once the clock has passed)."""
        out = []
        while self.next_finish() == clock:
            out.append(heapq.heappop(self.heap)[2])
        return out

    def record(self, gap: float, end: float) -> None:
        """Time mode: the step at the current clock - 1 lasted ``gap`` and ended at ``end``."""
        self.gaps.append(gap)
        self.ends.append(end)

    def record_steps(self, gaps: list[float], ends: list[float]) -> None:
        """Time mode: ``record`` for each of many steps at once (a leap)."""
        self.gaps.extend(gaps)
        self.ends.extend(ends)

    def flush(self, running: list[Request]) -> None:
        """Every member leaves (the head ``running[:members]``), counters up to date."""
        for r in running[:self.num_members]:
            self.sync(r)
            r.lz_d0 = -1
            r.lz_seq = 0
        for b in self.buckets:
            b.clear()
        self.heap.clear()
        self.sum_off = 0
        self.num_members = 0
