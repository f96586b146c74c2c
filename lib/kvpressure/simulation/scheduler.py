"""One step of vLLM 0.33.0's V1 scheduler (``v1/core/sched/scheduler.py``), synchronous:
``schedule()`` then ``update_from_output()`` with the reference harness's fake model output
(one token for every request whose chunk reaches the end of its known tokens).

``Scheduler.schedule`` reads in the order of vLLM's: budget and threshold, pass 1 over
``running`` (allocation, preemption), pass 2 over ``waiting`` (admission), then
``_update_after_schedule``. Rule ids (``#run-pass``...) point into docs/scheduler.md. The
decoding head of ``running`` may be kept lazily (``lazy_decode.py``, docs/scheduler.md#fast-lazy):
the scheduler hands it to its ``DecodeProgress`` hooks, which do nothing on the exact path.

Names as in docs/scheduler.md: ``L`` = ``req.num_tokens`` (prompt plus outputs so far), ``c`` =
``req.num_computed_tokens``, ``h`` = prefix-cache hit tokens, ``n`` = the tokens granted this
step (a chunk), ``T`` = the effective ``long_prefill_token_threshold``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from kvpressure.simulation.kv_cache_manager import KVCacheManager
from kvpressure.simulation.lazy_decode import DecodeProgress
from kvpressure.simulation.request import (
    FINISHED_LENGTH_CAPPED,
    PREEMPTED,
    RUNNING,
    WAITING,
    Request,
)

# ``SchedulerOutput.chunks`` of a scheduler that does not record them: shared, as nothing is
# appended to it then.
_NO_CHUNKS: list[tuple[int, int, int]] = []


class SchedulerOutput:
    """What one ``schedule()`` call decided, in scheduling order."""

    __slots__ = ("granted", "mark", "admitted", "preempted", "num_scheduled_tokens",
                 "num_prefill_tokens", "num_decode_tokens", "num_decode_seqs",
                 "num_prefill_seqs", "admitted_new", "resumed", "recomputed_tokens",
                 "prefix_cache_queries", "prefix_cache_hits", "sum_decode_ctx",
                 "sum_prefill_attn", "sum_prefill_ctx", "chunks", "emitted", "finished",
                 "num_lazy")

    def __init__(self, mark: int = 0, record_chunks: bool = True) -> None:
        # The requests granted tokens, in scheduling order; each carries its grant
        # (``Request.grant``, valid while ``Request.grant_mark`` is this call's ``mark``):
        # one list append a grant instead of a map entry.
        self.granted: list[Request] = []
        self.mark = mark
        self.admitted: list[Request] = []
        self.preempted: list[Request] = []
        self.num_scheduled_tokens = 0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.num_decode_seqs = 0
        self.num_prefill_seqs = 0
        self.admitted_new = 0
        self.resumed = 0
        self.recomputed_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.sum_decode_ctx = 0
        self.sum_prefill_attn = 0.0
        self.sum_prefill_ctx = 0
        # (start, length, recomputed) of each prefill chunk, for pricing recompute.
        self.chunks: list[tuple[int, int, int]] = [] if record_chunks else _NO_CHUNKS
        # Requests that sampled a token this step / reached their last one, in order.
        self.emitted: list[Request] = []
        self.finished: list[Request] = []
        # Lazy decode members served this step (one token each, not in ``scheduled`` nor
        # ``emitted``; their finishes are at the head of ``finished``).
        self.num_lazy = 0

    @property
    def scheduled(self) -> dict[Request, int]:
        """Request -> tokens granted, in scheduling order (read it before the next
        ``schedule()``: the grants live on the requests)."""
        return {r: r.grant for r in self.granted}

    def grant(self, req: Request, n: int) -> None:
        req.grant = n
        req.grant_mark = self.mark
        self.granted.append(req)

    def withdraw(self, req: Request) -> int:
        """Take back ``req``'s grant of this call, if any (PRIORITY victims); its tokens."""
        if req.grant_mark != self.mark:
            return 0
        req.grant_mark = 0
        self.granted.remove(req)
        return req.grant


def decode_step_output(num_decoding: int) -> SchedulerOutput:
    """The output of a step in which the ``num_decoding`` requests of the decoding head get
    one token each and nothing else happens: each step of a leap (leap.py)."""
    out = SchedulerOutput(0, False)
    out.num_lazy = num_decoding
    out.num_scheduled_tokens = num_decoding
    out.num_decode_tokens = num_decoding
    out.num_decode_seqs = num_decoding
    return out


class WaitingQueue:
    """FCFS queue or PRIORITY heap; ``prepend`` is a heap push under PRIORITY
    (docs/scheduler.md#que-waiting)."""

    __slots__ = ("priority", "fifo", "head", "heap", "num_preempted")

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        # FCFS: ``fifo[head:]``, head first. A plain list read from an index: pops and
        # left appends are list reads and writes the compiled code does natively, where a
        # deque's methods are generic calls. Entries before ``head`` are left over.
        self.fifo: list[Request] = []
        self.head = 0
        # PRIORITY: a heap of (priority, arrival_time, request).
        self.heap: list[tuple[int, int, Request]] = []
        self.num_preempted = 0

    def __len__(self) -> int:
        if self.priority:
            return len(self.heap)
        return len(self.fifo) - self.head

    def add(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self.heap, (req.priority, req.arrival_time, req))
        else:
            self.fifo.append(req)

    def prepend(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self.heap, (req.priority, req.arrival_time, req))
            return
        head = self.head
        if head:
            head -= 1
            self.fifo[head] = req
            self.head = head
        else:
            self.fifo.insert(0, req)

    def peek(self) -> Request:
        return self.heap[0][2] if self.priority else self.fifo[self.head]

    def pop(self) -> Request:
        if self.priority:
            return heapq.heappop(self.heap)[2]
        fifo = self.fifo
        head = self.head
        req = fifo[head]
        head += 1
        if head >= 64 and head * 2 >= len(fifo):
            del fifo[:head]
            head = 0
        self.head = head
        return req

    def requests(self) -> list[Request]:
        """In queue order (heap order sorted under PRIORITY)."""
        if self.priority:
            return [t[2] for t in sorted(self.heap)]
        return self.fifo[self.head:]


class Scheduler:
    """Queues, budgets and the two scheduling passes (docs/scheduler.md sections 1-2)."""

    def __init__(self, settings: Any, decode: DecodeProgress | None = None) -> None:
        """``decode``: where the decoding head of ``running`` is kept (``lazy_decode.py``);
        by default nowhere (every request keeps its own counters)."""
        s = settings
        self.settings = s
        # Plain typed numbers: the compiled step (native.py) works on them natively, and
        # settings may come with numpy scalars.
        self.block_size = int(s.block_size)
        self.max_model_len = int(s.max_model_len)
        self.max_num_scheduled_tokens = int(s.max_num_batched_tokens)
        self.max_num_active_seqs = int(s.max_num_active_seqs or s.max_num_seqs)
        self.long_prefill_token_threshold = int(s.long_prefill_token_threshold)
        self.chunked_prefill = bool(s.enable_chunked_prefill)
        self.reserve_full_isl = bool(s.scheduler_reserve_full_isl)
        self.priority_policy = s.policy == "priority"
        self.kv = KVCacheManager(int(s.num_gpu_blocks), self.block_size, self.max_model_len,
                                 bool(s.enable_prefix_caching), float(s.watermark))
        self.running: list[Request] = []
        self.waiting = WaitingQueue(self.priority_policy)
        # Waiting requests skipped by the admission scan or enqueued blocked
        # (docs/scheduler.md#que-counts). Nothing in this model's scope is ever deferred, but the
        # gauge is reported from this set.
        self.deferred_waiting: set[Request] = set()
        # Requests finished in update_from_output and not yet reported by schedule()
        # (docs/scheduler.md#loop-drain).
        self.finished_req_ids: list[str] = []
        # Optional callbacks ``f(req)`` at each admission / preemption, called at the moment
        # it happens inside schedule() (the engine stamps them with the step's start).
        self.on_admit: Callable[[Request], None] | None = None
        self.on_preempt: Callable[[Request], None] | None = None
        self.decode: DecodeProgress = decode if decode is not None else DecodeProgress()
        # Numbers the schedule() calls (SchedulerOutput.mark; 0 is no call's).
        self.num_calls = 0
        # Whether outputs list their prefill chunks (``SchedulerOutput.chunks``): only a
        # priced step reads them, so the engine turns this off in step mode.
        self.record_chunks = True

    # -- queue entry ----------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.status = WAITING
        self.waiting.add(req)

    def has_requests(self) -> bool:
        return bool(self.running or len(self.waiting) or self.finished_req_ids)

    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- rules shared with the fast path --------------------------------------------------
    def threshold(self) -> int:
        """``T`` of this step: 0 when at most one request is running or waiting
        (docs/scheduler.md#step-threshold)."""
        if len(self.running) + len(self.waiting) <= 1:
            return 0
        return self.long_prefill_token_threshold

    def first_chunk(self, req: Request, h: int, budget: int, threshold: int) -> int:
        """Tokens pass 2 would grant the waiting ``req`` with a hit of ``h`` tokens; 0 when
        chunking is off and its prompt does not fit the budget (docs/scheduler.md#adm-scan)."""
        n = req.num_tokens - h
        if 0 < threshold < n:
            n = threshold
        if n > budget:
            if not self.chunked_prefill:
                return 0
            n = budget
        return n

    def victim_index(self) -> int:
        """Index in ``running`` of the next victim: the last request under FCFS
        (docs/scheduler.md#pre-fcfs); under PRIORITY the greatest (priority, arrival_time),
        the first of equals (#pre-priority)."""
        running = self.running
        if not self.priority_policy:
            return len(running) - 1
        # (priority, arrival_time) compared field by field: native int comparisons where
        # tuples would be built and compared generically for every running request.
        vi = 0
        best_p = running[0].priority
        best_a = running[0].arrival_time
        for i in range(1, len(running)):
            r = running[i]
            p = r.priority
            if p > best_p or (p == best_p and r.arrival_time > best_a):
                best_p = p
                best_a = r.arrival_time
                vi = i
        return vi

    def preempt_at(self, index: int, out: SchedulerOutput) -> Request:
        """Preempt ``running[index]`` (docs/scheduler.md#pre-effect)."""
        req = self.running.pop(index)
        self.decode.leave(req)
        self.kv.free(req)
        req.status = PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.is_prefill_chunk = True
        self.waiting.prepend(req)
        self.waiting.num_preempted += 1
        out.preempted.append(req)
        if self.on_preempt is not None:
            self.on_preempt(req)
        return req

    # -- one step -------------------------------------------------------------------------
    def schedule(self, step: int) -> SchedulerOutput:
        """vLLM's ``Scheduler.schedule()``, in its order (docs/scheduler.md section 2)."""
        self.num_calls += 1
        out = SchedulerOutput(self.num_calls, self.record_chunks)
        self.finished_req_ids = []  # reported by this call (#loop-drain)
        budget = self.max_num_scheduled_tokens  # #step-budget
        threshold = self.threshold()
        # Pass 1 over running: its decoding head (lazy_decode.py), then the rest.
        decode = self.decode
        req_index, stopped = 0, False
        if decode.num_members:
            req_index, budget, stopped = decode.serve_head(self, out, budget)
        if not stopped:
            budget = self._schedule_running(out, req_index, budget, threshold)
        if not out.preempted and len(self.waiting):  # #adm-after-preemption
            self._schedule_waiting(out, budget, threshold, step)
        if decode.num_members:
            decode.advance_head(out)
        self._update_after_schedule(out, step)
        return out

    def _schedule_running(self, out: SchedulerOutput, req_index: int, budget: int,
                          threshold: int) -> int:
        """Pass 1 from ``running[req_index]`` while the budget lasts (docs/scheduler.md#run-pass);
        returns the budget left."""
        kv = self.kv
        running = self.running
        granted = out.granted
        mark = out.mark
        priority = self.priority_policy
        max_model_len = self.max_model_len
        while req_index < len(running) and budget > 0:
            req = running[req_index]
            if not req.is_prefill_chunk:
                # A run of decoding requests (c = L - 1): n = 1 each whatever T and the
                # budget, their blocks from the KV-cache manager (#run-alloc); the general
                # path below decides the same, slower, and preempts for a request whose block
                # is not free.
                end = kv.allocate_decode_slots(running, req_index, budget)
                if end > req_index:
                    for i in range(req_index, end):
                        r = running[i]
                        r.grant = 1
                        r.grant_mark = mark
                        granted.append(r)
                    budget -= end - req_index
                    req_index = end
                    continue
            c = req.num_computed_tokens
            n = req.num_tokens - c
            if 0 < threshold < n:
                n = threshold  # #step-threshold
            if n > budget:
                n = budget
            if n > max_model_len - c - 1:
                n = max_model_len - c - 1
            if n <= 0:
                req_index += 1
                continue
            preempted_self = False
            while not kv.allocate_slots_running(req, n):  # #run-alloc
                vi = self.victim_index()
                if priority:
                    if vi < req_index:
                        req_index -= 1
                    victim = running[vi]
                    budget += out.withdraw(victim) + self.decode.served(victim)
                if self.preempt_at(vi, out) is req:
                    preempted_self = True
                    break
            if preempted_self:
                if priority:
                    continue
                break
            req.grant = n
            req.grant_mark = mark
            granted.append(req)
            budget -= n
            req_index += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int,
                          step: int) -> None:
        """Pass 2: admit from the head of ``waiting`` until one cannot be
        (docs/scheduler.md#adm-scan, #adm-accept)."""
        kv = self.kv
        running = self.running
        waiting = self.waiting
        max_active = self.max_num_active_seqs
        full_isl = self.reserve_full_isl
        while budget > 0 and len(waiting):
            if len(running) >= max_active:
                break
            req = waiting.peek()
            hit_blocks, h = kv.get_computed_blocks(req)  # #kv-lookup
            n = self.first_chunk(req, h, budget, threshold)
            if not n:
                break
            if not kv.allocate_slots_waiting(req, n, hit_blocks, h, full_isl,
                                             bool(running)):  # #kv-admit
                break
            waiting.pop()
            self.deferred_waiting.discard(req)
            running.append(req)
            if req.status == PREEMPTED:
                out.resumed += 1
                waiting.num_preempted -= 1
            else:
                out.admitted_new += 1
                req.first_sched_step = step
                req.prefix_hit_tokens_at_admission = h
            if kv.enable_caching:
                kv.record_prefix_cache_stats(req, h)  # #kv-stats
                out.prefix_cache_queries += req.num_tokens
                out.prefix_cache_hits += h
            req.status = RUNNING
            req.num_computed_tokens = h
            out.grant(req, n)
            out.admitted.append(req)
            budget -= n
            if self.on_admit is not None:
                self.on_admit(req)

    def _update_after_schedule(self, out: SchedulerOutput, step: int) -> None:
        """Advance ``c`` by each grant and account the chunks (docs/scheduler.md#upd-advance,
        #loop-row). The fake model output (one token per request whose chunk reaches ``L``,
        #loop-fake-output) is appended here too: nothing between ``schedule()`` and
        ``update_from_output()`` reads it, and one pass over the batch is cheaper than two.
        Freeing waits for ``update_from_output()``."""
        max_model_len = self.max_model_len
        total = prefill = decode_tokens = recomputed = 0
        sum_decode_ctx = prefill_seqs = sum_prefill_ctx = 0
        sum_prefill_attn = 0.0
        emitted = out.emitted
        finished = out.finished
        chunks = out.chunks
        record_chunks = self.record_chunks
        for req in out.granted:
            n = req.grant
            start = req.num_computed_tokens
            end = start + n
            total += n
            if not req.is_prefill_chunk:
                # A decode token is never below the high-water mark (it writes position L-1).
                decode_tokens += 1
                sum_decode_ctx += end
                req.num_computed_tokens = end
                req.hwm = end
                req.scheduled_tokens += 1
                length = end + 1
                req.num_tokens = length
                num_output = req.num_output_tokens + 1
                req.num_output_tokens = num_output
                emitted.append(req)
                if num_output >= req.max_tokens or length >= max_model_len:
                    finished.append(req)
                continue
            prefill += n
            prefill_seqs += 1
            sum_prefill_attn += n * (start + n / 2)
            sum_prefill_ctx += end
            hwm = req.hwm  # high-water mark of c: recomputed tokens (#loop-row)
            again = 0
            if hwm > start:
                again = (end if end < hwm else hwm) - start
                recomputed += again
                req.recomputed_tokens += again
            if record_chunks:
                chunks.append((start, n, again))
            if end > hwm:
                req.hwm = end
            req.num_computed_tokens = end
            req.scheduled_tokens += n
            if end < req.num_tokens:
                continue
            req.is_prefill_chunk = False
            length = end + 1
            req.num_tokens = length
            num_output = req.num_output_tokens + 1
            req.num_output_tokens = num_output
            if num_output == 1:
                req.first_token_step = step
            emitted.append(req)
            if num_output >= req.max_tokens or length >= max_model_len:
                finished.append(req)
        out.sum_decode_ctx += sum_decode_ctx
        out.num_prefill_seqs = prefill_seqs
        out.sum_prefill_attn = sum_prefill_attn
        out.sum_prefill_ctx = sum_prefill_ctx
        out.num_scheduled_tokens += total
        out.num_prefill_tokens = prefill
        out.num_decode_tokens += decode_tokens
        out.num_decode_seqs = out.num_decode_tokens
        out.recomputed_tokens = recomputed

    def update_from_output(self, out: SchedulerOutput, step: int) -> list[Request]:
        """Finish and free the requests whose token reached ``max_tokens`` or
        ``max_model_len``, in scheduling order (docs/scheduler.md#upd-finish); the tokens
        themselves were appended at the end of ``schedule()``.

        Returns the requests that emitted a token, in scheduling order (finished ones have
        a finished status)."""
        if out.finished:
            self.finish_requests(out.finished, step)
        self.decode.extend_head(self.running, out.mark)
        return out.emitted

    def finish_requests(self, finished: list[Request], step: int) -> None:
        """The one place requests finish: each leaves ``running`` and its blocks are freed, in
        the given (scheduling) order (docs/scheduler.md#upd-finish)."""
        kv = self.kv
        decode = self.decode
        for req in finished:
            decode.leave(req)
            req.status = FINISHED_LENGTH_CAPPED
            req.finish_step = step
            kv.free(req)
            self.finished_req_ids.append(req.request_id)
        running = self.running
        if len(finished) * 8 < len(running):
            # Few finishes: list.remove scans in C, in place.
            for req in finished:
                running.remove(req)
        else:
            self.running = [r for r in running if r.status == RUNNING]
