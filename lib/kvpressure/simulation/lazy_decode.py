"""Decode progress kept as a clock instead of per-request counters.

Most requests in ``running`` spend most steps decoding: each step they gain exactly one
computed token, one token and one output, and need a block only when their position starts
one. Updating ~100 of them every step is the bulk of a busy simulation, although a step only
*decides* something about the few that cross a block boundary or reach their last token.

``LazyDecode`` holds the decoding requests that form the head of ``running`` (they all get
their token every step: pass 1 serves them first, and the scheduler falls back to the eager
path when the budget could not cover them). Their counters are stored as of the clock value
``lz_d0`` at which they were last brought up to date; the clock counts the steps they
advanced together. Per request, everything else follows by arithmetic:

* it starts a block at clock ``D`` when ``c + D - d0`` is a multiple of ``B``, so requests
  are bucketed by ``(d0 - c) % B`` and bucket ``D % B`` holds the crossings of step ``D``,
  kept in ``running`` order (joins happen at the end of the lazy head);
* it emits its last token at clock ``d0 + left - 1``; a heap gives the finishes in
  ``(clock, running order)``.

A request is brought up to date (``sync``) when the scheduler touches it: preemption,
finish, or leaving for any other reason. In time mode the gaps and end times of the lazy
steps are kept too, so that a request's inter-token statistics come out as if each token had
been stamped one at a time.
"""

from __future__ import annotations

import heapq

from kvpressure.simulation.request import Request


class LazyDecode:
    __slots__ = ("B", "mml", "clock", "n", "buckets", "heap", "sum_off", "seq", "timed",
                 "gaps", "ends")

    def __init__(self, block_size: int, max_model_len: int, timed: bool) -> None:
        self.B = block_size
        self.mml = max_model_len
        self.clock = 0
        self.n = 0
        self.buckets: list[list[Request]] = [[] for _ in range(block_size)]
        # (clock of the last token, join sequence, request); stale after the request left.
        self.heap: list[tuple[int, int, Request]] = []
        # Σ (num_computed_tokens - clock) over the members: Σ c = sum_off + n * clock.
        self.sum_off = 0
        self.seq = 0
        self.timed = timed
        # Time mode: gap (end - start) and end time of each lazy step, indexed by clock.
        self.gaps: list[float] = []
        self.ends: list[float] = []

    def join(self, r: Request) -> None:
        """``r`` (up to date, decoding, not finished) becomes the last member."""
        D = self.clock
        c = r.num_computed_tokens
        r.lz_d0 = D
        self.seq += 1
        r.lz_seq = self.seq
        self.buckets[(D - c) % self.B].append(r)
        left = r.max_tokens - r.num_output_tokens
        cap = self.mml - r.num_tokens
        if cap < left:
            left = cap
        heapq.heappush(self.heap, (D + left - 1, self.seq, r))
        self.sum_off += c - D
        self.n += 1

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

    def leave(self, r: Request) -> None:
        """``r`` stops being a member, with its counters up to date."""
        self.sync(r)
        self.buckets[(r.lz_d0 - r.num_computed_tokens) % self.B].remove(r)
        self.sum_off -= r.num_computed_tokens - r.lz_d0
        self.n -= 1
        r.lz_d0 = -1
        r.lz_seq = 0  # its heap entries are stale by lz_d0 already; the int need not live on

    def computed(self, r: Request, D: int) -> int:
        """A member's ``num_computed_tokens`` at clock ``D``."""
        return r.num_computed_tokens + D - r.lz_d0

    def next_finish(self) -> int:
        """Clock of the next member's last token (drops stale heap entries); -1 if none."""
        heap = self.heap
        while heap:
            d, s, r = heap[0]
            if r.lz_d0 >= 0 and r.lz_seq == s:
                return d
            heapq.heappop(heap)
        return -1

    def pop_finishing(self, D: int) -> list[Request]:
        """The members whose last token comes at clock ``D``, in ``running`` order; they
        stay members (the caller makes them leave once the clock has passed ``D``)."""
        out = []
        while self.next_finish() == D:
            out.append(heapq.heappop(self.heap)[2])
        return out

    def record(self, gap: float, end: float) -> None:
        """Time mode: the step at the current clock - 1 lasted ``gap`` and ended at ``end``."""
        self.gaps.append(gap)
        self.ends.append(end)

    def flush(self, running: list[Request]) -> None:
        """Every member leaves (the head ``running[:n]``), counters up to date."""
        for r in running[:self.n]:
            self.sync(r)
            r.lz_d0 = -1
            r.lz_seq = 0
        for b in self.buckets:
            b.clear()
        self.heap.clear()
        self.sum_off = 0
        self.n = 0
