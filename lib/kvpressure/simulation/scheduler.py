"""One step of vLLM 0.33.0's V1 scheduler (``v1/core/sched/scheduler.py``), synchronous:
``schedule()`` then ``update_from_output()`` with the reference harness's fake model output
(one token for every request whose chunk reaches the end of its known tokens)."""

from __future__ import annotations

import heapq
from collections import deque

from kvpressure.simulation.kv_cache_manager import KVCacheManager
from kvpressure.simulation.lazy_decode import LazyDecode
from kvpressure.simulation.request import (
    FINISHED_LENGTH_CAPPED,
    PREEMPTED,
    RUNNING,
    WAITING,
    Request,
)


class SchedulerOutput:
    """What one ``schedule()`` call decided, in scheduling order."""

    __slots__ = ("scheduled", "admitted", "preempted", "num_scheduled_tokens",
                 "num_prefill_tokens", "num_decode_tokens", "num_decode_seqs",
                 "num_prefill_seqs", "admitted_new", "resumed", "recomputed_tokens",
                 "prefix_cache_queries", "prefix_cache_hits", "sum_decode_ctx",
                 "sum_prefill_attn", "sum_prefill_ctx", "chunks", "emitted", "finished",
                 "num_lazy")

    def __init__(self) -> None:
        self.scheduled: dict[Request, int] = {}
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
        self.chunks: list[tuple[int, int, int]] = []
        # Requests that sampled a token this step / reached their last one, in order.
        self.emitted: list[Request] = []
        self.finished: list[Request] = []
        # Lazy decode members served this step (one token each, not in ``scheduled`` nor
        # ``emitted``; their finishes are at the head of ``finished``).
        self.num_lazy = 0


class WaitingQueue:
    """FCFS deque or PRIORITY heap; ``prepend`` is a heap push under PRIORITY
    (docs/scheduler.md#que-waiting)."""

    __slots__ = ("priority", "q", "num_preempted")

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self.q: deque[Request] | list[tuple[int, int, Request]] = [] if priority else deque()
        self.num_preempted = 0

    def __len__(self) -> int:
        return len(self.q)

    def add(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self.q, (req.priority, req.arrival_time, req))
        else:
            self.q.append(req)

    def prepend(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self.q, (req.priority, req.arrival_time, req))
        else:
            self.q.appendleft(req)

    def peek(self) -> Request:
        return self.q[0][2] if self.priority else self.q[0]

    def pop(self) -> Request:
        return heapq.heappop(self.q)[2] if self.priority else self.q.popleft()

    def requests(self) -> list[Request]:
        """In queue order (heap order sorted under PRIORITY)."""
        if self.priority:
            return [t[2] for t in sorted(self.q)]
        return list(self.q)


class Scheduler:
    """Queues, budgets and the two scheduling passes (docs/scheduler.md sections 1-2)."""

    def __init__(self, settings, lazy: LazyDecode | None = None) -> None:
        """``lazy``: keep the decode progress of the head of ``running`` as a clock
        (lazy_decode.py)."""
        s = settings
        self.settings = s
        self.block_size = s.block_size
        self.max_model_len = s.max_model_len
        self.max_num_scheduled_tokens = s.max_num_batched_tokens
        self.max_num_active_seqs = s.max_num_active_seqs or s.max_num_seqs
        self.long_prefill_token_threshold = s.long_prefill_token_threshold
        self.chunked_prefill = s.enable_chunked_prefill
        self.reserve_full_isl = s.scheduler_reserve_full_isl
        self.priority_policy = s.policy == "priority"
        self.kv = KVCacheManager(s.num_gpu_blocks, s.block_size, s.max_model_len,
                                 s.enable_prefix_caching, s.watermark)
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
        self.on_admit = None
        self.on_preempt = None
        self.lazy = lazy

    # -- queue entry ----------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.status = WAITING
        self.waiting.add(req)

    def has_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.finished_req_ids)

    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- preemption -----------------------------------------------------------------------
    def _priority_victim(self) -> int:
        """Index in ``running`` of PRIORITY's victim: the greatest (priority, arrival_time),
        the first of equals."""
        running = self.running
        vi = 0
        best = (running[0].priority, running[0].arrival_time)
        for i in range(1, len(running)):
            r = running[i]
            key = (r.priority, r.arrival_time)
            if key > best:
                best = key
                vi = i
        return vi

    def _preempt(self, req: Request) -> None:
        if req.lz_d0 >= 0:
            self.lazy.leave(req)
        self.kv.free(req)
        req.status = PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.is_prefill_chunk = True
        self.waiting.prepend(req)
        self.waiting.num_preempted += 1

    # -- one step -------------------------------------------------------------------------
    def schedule(self, step: int) -> SchedulerOutput:
        out = SchedulerOutput()
        self.finished_req_ids = []
        kv = self.kv
        running = self.running
        waiting = self.waiting
        budget = self.max_num_scheduled_tokens
        mml = self.max_model_len
        T = self.long_prefill_token_threshold
        if len(running) + len(waiting) <= 1:
            T = 0
        scheduled = out.scheduled
        preempted = out.preempted
        priority = self.priority_policy

        B = self.block_size
        pool = kv.pool
        caching = kv.enable_caching

        # Pass 1: running requests in list order; the lazy head first, as a whole.
        req_index = 0
        lz = self.lazy
        stopped = False
        if lz is not None and lz.n:
            if lz.n > budget:
                # The budget cannot serve every member: this step runs eagerly.
                lz.flush(running)
            else:
                stopped = self._lazy_pass(out)
                budget -= lz.n
                req_index = lz.n
        while not stopped and req_index < len(running) and budget > 0:
            req = running[req_index]
            c = req.num_computed_tokens
            if not req.is_prefill_chunk:
                # Decoding (c = L - 1): n = 1 whatever T and the budget; a block is needed
                # only when position c starts one. Same decisions as the general path below.
                if c % B:
                    pass
                elif pool.num_free_blocks:
                    req.blocks.append(pool.pop_one())
                else:
                    n = 1
                    req = None
                if req is not None:
                    if caching and (c + 1) % B == 0:
                        kv.cache_blocks(req, c + 1)
                    scheduled[req] = 1
                    budget -= 1
                    req_index += 1
                    continue
                req = running[req_index]
            n = req.num_tokens - c
            if 0 < T < n:
                n = T
            if n > budget:
                n = budget
            if n > mml - c - 1:
                n = mml - c - 1
            if n <= 0:
                req_index += 1
                continue
            ok = True
            while not kv.allocate_slots_running(req, n):
                if priority:
                    vi = self._priority_victim()
                    victim = running.pop(vi)
                    if vi < req_index:
                        req_index -= 1
                    granted = scheduled.pop(victim, None)
                    if granted is not None:
                        budget += granted
                    elif victim.lz_d0 >= 0:
                        budget += 1  # a lazy member, served its token earlier in pass 1
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if self.on_preempt is not None:
                    self.on_preempt(victim)
                if victim is req:
                    ok = False
                    break
            if not ok:
                if priority:
                    continue
                break
            scheduled[req] = n
            budget -= n
            req_index += 1

        # Pass 2: waiting requests, only in a step that preempted nothing.
        if not preempted:
            max_active = self.max_num_active_seqs
            chunked = self.chunked_prefill
            full_isl = self.reserve_full_isl
            while budget > 0 and len(waiting):
                if len(running) >= max_active:
                    break
                req = waiting.peek()
                hit_blocks, h = kv.get_computed_blocks(req)
                L = req.num_tokens
                n = L - h
                if 0 < T < n:
                    n = T
                if n > budget:
                    if not chunked:
                        break
                    n = budget
                if not kv.allocate_slots_waiting(req, n, hit_blocks, h, full_isl,
                                                 bool(running)):
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
                    kv.record_prefix_cache_stats(req, h)
                    out.prefix_cache_queries += L
                    out.prefix_cache_hits += h
                req.status = RUNNING
                req.num_computed_tokens = h
                scheduled[req] = n
                out.admitted.append(req)
                budget -= n
                if self.on_admit is not None:
                    self.on_admit(req)

        # _update_after_schedule: advance num_computed_tokens, account the chunks. The fake
        # model output (one token per request whose chunk reaches L) is appended here too:
        # nothing between schedule() and update_from_output() reads it, and one pass over
        # the batch is cheaper than two. Freeing waits for update_from_output().
        total = prefill = decode = recomputed = 0
        sum_decode_ctx = 0
        emitted = out.emitted
        finished = out.finished
        if lz is not None and lz.n:
            nl = lz.n
            D = lz.clock
            total += nl
            decode += nl
            sum_decode_ctx += lz.sum_off + nl * (D + 1)
            finished.extend(lz.pop_finishing(D))
            lz.clock = D + 1
            out.num_lazy = nl
        for req, n in scheduled.items():
            start = req.num_computed_tokens
            end = start + n
            total += n
            if not req.is_prefill_chunk:
                # A decode token is never below the high-water mark (it writes position L-1).
                decode += 1
                sum_decode_ctx += end
                req.num_computed_tokens = end
                req.hwm = end
                req.scheduled_tokens += 1
                L = end + 1
                req.num_tokens = L
                o = req.num_output_tokens + 1
                req.num_output_tokens = o
                emitted.append(req)
                if o >= req.max_tokens or L >= mml:
                    finished.append(req)
                continue
            else:
                prefill += n
                out.num_prefill_seqs += 1
                out.sum_prefill_attn += n * (start + n / 2)
                out.sum_prefill_ctx += end
                hwm = req.hwm
                r = 0
                if hwm > start:
                    r = (end if end < hwm else hwm) - start
                    recomputed += r
                    req.recomputed_tokens += r
                out.chunks.append((start, n, r))
            if end > req.hwm:
                req.hwm = end
            req.num_computed_tokens = end
            req.scheduled_tokens += n
            if end < req.num_tokens:
                continue
            req.is_prefill_chunk = False
            L = end + 1
            req.num_tokens = L
            o = req.num_output_tokens + 1
            req.num_output_tokens = o
            if o == 1:
                req.first_token_step = step
            emitted.append(req)
            if o >= req.max_tokens or L >= mml:
                finished.append(req)
        out.sum_decode_ctx = sum_decode_ctx
        out.num_scheduled_tokens = total
        out.num_prefill_tokens = prefill
        out.num_decode_tokens = decode
        out.num_decode_seqs = decode
        out.recomputed_tokens = recomputed
        return out

    def update_from_output(self, out: SchedulerOutput, step: int) -> list[Request]:
        """Finish and free the requests whose token reached ``max_tokens`` or
        ``max_model_len``, in scheduling order (docs/scheduler.md#upd-finish); the tokens
        themselves were appended at the end of ``schedule()``.

        Returns the requests that emitted a token, in scheduling order (finished ones have
        a finished status)."""
        lz = self.lazy
        if out.finished:
            kv = self.kv
            for req in out.finished:
                if req.lz_d0 >= 0:
                    lz.leave(req)
                req.status = FINISHED_LENGTH_CAPPED
                req.finish_step = step
                kv.free(req)
                self.finished_req_ids.append(req.request_id)
            running = self.running
            if len(out.finished) * 8 < len(running):
                # Few finishes: list.remove scans in C, in place.
                for req in out.finished:
                    running.remove(req)
            else:
                self.running = [r for r in running if r.status == RUNNING]
        if lz is not None:
            # Requests that decoded this step right behind the lazy head join it.
            running = self.running
            n = lz.n
            scheduled = out.scheduled
            while n < len(running):
                r = running[n]
                if r.is_prefill_chunk or r not in scheduled:
                    break
                lz.join(r)
                n += 1
        return out.emitted

    def _lazy_pass(self, out: SchedulerOutput) -> bool:
        """Pass 1 over the lazy head: only members starting a block need anything. Returns
        True when a member had to preempt itself under FCFS (which then ends pass 1)."""
        lz = self.lazy
        D = lz.clock
        pool = self.kv.pool
        running = self.running
        stopped = False
        cross = lz.buckets[D % lz.B]
        if len(cross) <= pool.num_free_blocks:
            # Enough free blocks for every crossing: popped in running order, at once.
            if cross:
                for req, b in zip(cross, pool.get_new_blocks(len(cross))):  # noqa: B905
                    req.blocks.append(b)
        else:
            # Not every crossing gets a block: preemptions, in running order. FCFS takes
            # victims from the end of running (members still to come in this bucket); PRIORITY
            # may take any running request, served members included (their token of this
            # step is then simply not counted: they leave before the clock moves).
            priority = self.priority_policy
            for req in list(cross):
                if req.lz_d0 < 0:
                    continue  # preempted earlier in this step
                served = True
                while not pool.num_free_blocks:
                    victim = running.pop(self._priority_victim() if priority else -1)
                    self._preempt(victim)
                    out.preempted.append(victim)
                    if self.on_preempt is not None:
                        self.on_preempt(victim)
                    if victim is req:
                        served = False
                        break
                if not served:
                    if priority:
                        continue
                    stopped = True
                    break
                req.blocks.append(pool.pop_one())
        kv = self.kv
        if kv.enable_caching:
            # Members whose token completes a block register its key.
            for req in lz.buckets[(D + 1) % lz.B]:
                kv.cache_blocks(req, req.num_computed_tokens + D - req.lz_d0 + 1)
        return stopped
