"""vLLM 0.33.0's KV-cache manager for one full-attention group (``v1/core/kv_cache_manager.py``
with ``FullAttentionManager``): prefix-cache lookup, ``allocate_slots``, ``free``."""

from __future__ import annotations

from typing import Any

from kvpressure.simulation.block_pool import BlockPool, StackBlockPool
from kvpressure.simulation.request import KEY_SHIFT, NO_BLOCKS, PREEMPTED, WAITING, Request

# The hit of every lookup without prefix caching: shared, as nothing appends to a hit list.
_NO_HIT: list[int] = []


_NO_KEYS: list[Any] = []


class KVCacheManager:
    """Block accounting for requests; ``allocate_slots`` returning False is vLLM's ``None``
    (the scheduler then preempts, or stops admitting)."""

    __slots__ = ("pool", "block_size", "max_model_len", "enable_caching", "watermark_blocks",
                 "prefix_queries", "prefix_hits", "preempted_queries", "preempted_hits",
                 "_hit_memo", "_group_keys")

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool, watermark: float = 0.0) -> None:
        self.pool = (BlockPool(num_gpu_blocks, True) if enable_caching
                     else StackBlockPool(num_gpu_blocks))
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        # N includes the null block (docs/scheduler.md#kv-watermark).
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        # Prefix-cache stats of successful admissions (docs/scheduler.md#kv-stats): first
        # admissions, and re-admissions after a preemption (which no exporter reads).
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preempted_queries = 0
        self.preempted_hits = 0
        # The last lookup (request, pool version, its length, hit blocks, hit tokens): the
        # head of the waiting queue is looked up again at every step it stays blocked.
        self._hit_memo: tuple | None = None
        # A prefix group's shared keys as objects, by the group's key base (block i's key at
        # index i): lookups and caching pass them to the map as they are, where computing a
        # key boxes a new int at every use.
        self._group_keys: dict[int, list[Any]] = {}

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Longest run of cached leading blocks, at most ``(L - 1) // B`` of them."""
        if not self.enable_caching:
            return _NO_HIT, 0
        pool = self.pool
        memo = self._hit_memo
        # Still valid: none of its keys changed in the cache (block_pool.py ``watch``), and
        # the request was not admitted since (the memo is dropped then: its own blocks get
        # cached while it runs).
        if memo is not None and memo[0] is req and memo[1] == pool.version \
                and memo[2] == req.num_tokens:
            return memo[3], memo[4]
        # Typed: the compiled step looks keys up natively, not through a bound method.
        cached: dict[int, Any] = pool.cached
        hit: list[int] = []
        n = (req.num_tokens - 1) // self.block_size
        # The keys of Request.block_key, shared ones first.
        s = req.num_shared_blocks
        if s > n:
            s = n
        keys = self.shared_keys(req) if s else _NO_KEYS
        for i in range(s):
            entry = cached.get(keys[i])
            if entry is None:
                break
            hit.append(next(iter(entry)) if isinstance(entry, dict) else entry)
        else:
            base = req.key_base
            for i in range(s, n):
                entry = cached.get(base + i)
                if entry is None:
                    break
                hit.append(next(iter(entry)) if isinstance(entry, dict) else entry)
        h = len(hit) * self.block_size
        pool.watch = req.key_base >> KEY_SHIFT
        self._hit_memo = (req, pool.version, req.num_tokens, hit, h)
        return hit, h

    def shared_keys(self, req: Request) -> list[Any]:
        """The keys of the request's shared blocks (``Request.block_key``), as objects."""
        g = req.group_key_base
        keys = self._group_keys.get(g)
        n = req.num_shared_blocks
        if keys is None or len(keys) < n:
            keys = [g - i - 1 for i in range(n)]
            self._group_keys[g] = keys
        return keys

    def num_evictable(self, blocks: list[int]) -> int:
        """Blocks of ``blocks`` that sit in the free queue (no request holds them)."""
        # Only a caching pool has hits, and its counts are a list (indexed natively when
        # compiled).
        ref: list[int] = self.pool.ref_cnt
        n = 0
        for b in blocks:
            if ref[b] == 0:
                n += 1
        return n

    def _blocks_to_admit(self, req: Request, num_new_tokens: int, hit_blocks: list[int],
                         num_hit_tokens: int, full_sequence_must_fit: bool,
                         has_scheduled_reqs: bool) -> int:
        """New blocks an admission pops, or -1 when one of its gates fails."""
        B = self.block_size
        mml = self.max_model_len
        m = len(hit_blocks)
        # The gates add the evictable hit blocks and the watermark to the need; taken off
        # the free count instead, once for both gates.
        free = self.pool.num_free_blocks
        if m:
            free -= self.num_evictable(hit_blocks)
        w = self.watermark_blocks
        if w and has_scheduled_reqs and req.status in (WAITING, PREEMPTED):
            free -= w
        if full_sequence_must_fit:
            full = req.num_tokens
            if full > mml:
                full = mml
            full = -(-full // B) - m
            if full > 0 and full > free or free < 0:
                return -1
        total = num_hit_tokens + num_new_tokens
        if total > mml:
            total = mml
        need = -(-total // B) - m
        if need < 0:
            need = 0
        return need if need <= free else -1

    def can_admit(self, req: Request, num_new_tokens: int, hit_blocks: list[int],
                  num_hit_tokens: int, full_sequence_must_fit: bool,
                  has_scheduled_reqs: bool) -> bool:
        """The two gates of ``allocate_slots`` for a waiting/preempted request, no side effect."""
        return self._blocks_to_admit(req, num_new_tokens, hit_blocks, num_hit_tokens,
                                     full_sequence_must_fit, has_scheduled_reqs) >= 0

    def allocate_slots_waiting(self, req: Request, num_new_tokens: int, hit_blocks: list[int],
                               num_hit_tokens: int, full_sequence_must_fit: bool,
                               has_scheduled_reqs: bool) -> bool:
        """Admission of a request holding no blocks: gates, touch, pop, hash
        (docs/scheduler.md#kv-admit)."""
        need = self._blocks_to_admit(req, num_new_tokens, hit_blocks, num_hit_tokens,
                                     full_sequence_must_fit, has_scheduled_reqs)
        if need < 0:
            return False
        self._hit_memo = None
        pool = self.pool
        if hit_blocks:
            pool.touch(hit_blocks)
            req.blocks = hit_blocks + pool.get_new_blocks(need)
            req.num_cached_blocks = len(hit_blocks)
        else:
            req.blocks = pool.get_new_blocks(need)
            req.num_cached_blocks = 0
        if self.enable_caching:
            total = num_hit_tokens + num_new_tokens
            L = req.num_tokens
            self.cache_blocks(req, total if total < L else L)
        return True

    def allocate_slots_running(self, req: Request, num_new_tokens: int) -> bool:
        """A running request's next chunk: blocks for ``c + n`` tokens, no watermark, no
        full-sequence gate."""
        total = req.num_computed_tokens + num_new_tokens
        blocks = req.blocks
        mml = self.max_model_len
        need = -(-(total if total < mml else mml) // self.block_size) - len(blocks)
        if need > 0:
            pool = self.pool
            if need > pool.num_free_blocks:
                return False
            if need == 1:
                blocks.append(pool.pop_one())
            else:
                pool.append_new_blocks(blocks, need)
        if self.enable_caching:
            L = req.num_tokens
            self.cache_blocks(req, total if total < L else L)
        return True

    # -- decoding requests (one token a step): the exact step's decode branch and the fast
    # path's decoding head take their blocks here, as every chunk does above.
    def allocate_decode_slots(self, reqs: list[Request], start: int, limit: int) -> int:
        """The decoding requests of ``reqs`` from ``start`` on, at most ``limit`` of them, one
        token each at its position ``c``: a new block when ``c`` starts one
        (docs/scheduler.md#run-alloc, what ``allocate_slots_running(req, 1)`` decides), the
        block's key when the token fills it (#kv-cache-eager). Stops at a prefill chunk, or
        before a request whose block is needed when none is free (nothing done for it: the
        scheduler's general path then preempts); returns the index it stopped at. One call
        for a run of them: the exact step's commonest work, done without a call a request."""
        end = start + limit
        if end > len(reqs):
            end = len(reqs)
        B = self.block_size
        caching = self.enable_caching
        pool = self.pool
        i = start
        while i < end:
            req = reqs[i]
            if req.is_prefill_chunk:
                break
            c = req.num_computed_tokens
            if not c % B:
                if not pool.num_free_blocks:
                    break
                req.blocks.append(pool.pop_one())
            if caching and (c + 1) % B == 0:
                self.cache_blocks(req, c + 1)
            i += 1
        return i

    def append_block(self, req: Request) -> bool:
        """One new block for ``req`` (a decoding request whose token starts one,
        docs/scheduler.md#run-alloc); False, nothing done, when none is free."""
        pool = self.pool
        if not pool.num_free_blocks:
            return False
        req.blocks.append(pool.pop_one())
        return True

    def append_blocks(self, reqs: list[Request]) -> bool:
        """One new block for each of ``reqs``, popped (and evicted, #kv-evict) in their order:
        the crossings of one decode step. False, nothing done, when fewer blocks are free."""
        n = len(reqs)
        pool = self.pool
        if n > pool.num_free_blocks:
            return False
        if n:
            for r, b in zip(reqs, pool.get_new_blocks(n)):  # noqa: B905 (same length)
                r.blocks.append(b)
        return True

    def append_blocks_of_steps(self, groups: list[list[Request]]) -> None:
        """``append_blocks`` for each group in turn (the crossings of many decode steps, a
        leap's), as one pop: the order single pops would take. The caller has checked that
        enough blocks are free."""
        total = 0
        for g in groups:
            total += len(g)
        new_blocks = self.pool.get_new_blocks(total)
        i = 0
        for g in groups:
            for r in g:
                r.blocks.append(new_blocks[i])
                i += 1

    def num_free_blocks(self) -> int:
        """Blocks a request may still take (cached blocks nobody holds included)."""
        return self.pool.num_free_blocks

    def usages(self, num_free: list[int]) -> list[float]:
        """``usage()`` with each count of free blocks in ``num_free`` (a leap's steps)."""
        denominator = self.pool.usage_denominator
        return [1.0 - n / denominator for n in num_free]

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register the keys of the request's blocks that are full of known tokens
        (``BlockPool.cache_block`` and ``Request.block_key``, inlined).

        A block past the shared prefix gets a key of the request's own, which no other
        request ever looks up: it is written on the block (what freeing and eviction read)
        and enters the lookup map only if the request is freed unfinished
        (``_register_own_keys``), the only case in which that key is looked up again."""
        num_full = num_tokens // self.block_size
        start = req.num_cached_blocks
        if num_full <= start:
            return
        bh: list[int | None] = self.pool.block_hash  # only a caching pool keys blocks
        blocks: list[int] = req.blocks  # it holds blocks: a list
        s = req.num_shared_blocks
        if start < s:
            pool = self.pool
            cached = pool.cached
            keys = self.shared_keys(req)
            end = s if s < num_full else num_full
            shared = 0
            for i in range(start, end):
                b = blocks[i]
                if bh[b] is None:
                    key = keys[i]
                    shared += 1
                    bh[b] = key
                    entry = cached.get(key)
                    if entry is None:
                        cached[key] = b
                    elif isinstance(entry, dict):
                        entry[b] = None
                    else:
                        cached[key] = {entry: None, b: None}
            if shared:
                pool.version += shared
            start = end
        base = req.key_base
        for i in range(start, num_full):
            b = blocks[i]
            if bh[b] is None:
                bh[b] = base + i
        req.num_cached_blocks = num_full

    def _register_own_keys(self, req: Request) -> None:
        """Put the request's own keyed blocks into the lookup map, in block order (the
        order ``cache_blocks`` keyed them, so where a key is on several blocks the one
        stored first still comes first); blocks already there stay as they are."""
        pool = self.pool
        bh: list[int | None] = pool.block_hash
        cached = pool.cached
        blocks: list[int] = req.blocks  # called only while it holds blocks
        base = req.key_base
        for i in range(req.num_shared_blocks, req.num_cached_blocks):
            b = blocks[i]
            key = base + i
            if bh[b] != key:
                continue
            entry = cached.get(key)
            if entry is None:
                cached[key] = b
            elif isinstance(entry, dict):
                if b not in entry:
                    entry[b] = None
            elif entry != b:
                cached[key] = {entry: None, b: None}

    def free(self, req: Request) -> None:
        """Release all of a request's blocks, last block first (docs/scheduler.md#kv-free).
        A request freed unfinished (preempted) will be looked up again: its own keys enter
        the lookup map first."""
        blocks = req.blocks
        if blocks:
            if self.enable_caching and req.status <= PREEMPTED:
                self._register_own_keys(req)
            self.pool.free_request_blocks(blocks)
        req.blocks = NO_BLOCKS
        req.num_cached_blocks = 0

    def record_prefix_cache_stats(self, req: Request, num_hit_tokens: int) -> None:
        if not self.enable_caching:
            return
        if req.num_preemptions > 0:
            self.preempted_queries += req.num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.prefix_queries += req.num_tokens
            self.prefix_hits += num_hit_tokens

    def usage(self) -> float:
        """``BlockPool.get_usage()`` (read twice a step: one call, not two)."""
        pool = self.pool
        return 1.0 - pool.num_free_blocks / pool.usage_denominator
