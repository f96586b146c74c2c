"""vLLM 0.33.0's block pool (``v1/core/block_pool.py``): the free-block queue, reference counts,
and the block-key -> block map of the prefix cache.

The free queue is a doubly linked list over block ids held in two dicts (``prev``/``next``)
with two sentinels, so popping the head, prepending, appending and unlinking a touched block
from the middle are all O(1), as in vLLM's ``FreeKVCacheBlockQueue``.

Materialised lazily: vLLM's queue starts as blocks ``1..N-1`` in id order, and a block leaves
that initial run only by being popped from the head (the only way to reach it), after which it
is linked explicitly. So the queue is always [explicit head part] + [never-used ids ``lo..N-1``,
one ``RANGE`` node in the list] + [explicit tail part], and memory follows the blocks a run has
used, not the pool's nominal size: ``ref_cnt`` and ``block_hash`` hold ids ``0..lo-1`` (an id
at or above ``lo`` has reference 0 and no key).
"""

from __future__ import annotations

from kvpressure.simulation.request import KEY_SHIFT

# Sentinels and the node of never-used ids, in the link dicts (block ids are >= 0).
HEAD = -2
TAIL = -3
RANGE = -4


class BlockPool:
    """Blocks ``0..N-1``; block 0 is the null block, never allocated nor counted."""

    __slots__ = ("num_gpu_blocks", "enable_caching", "prev", "next", "lo", "num_free_blocks",
                 "ref_cnt", "block_hash", "cached", "usage_denominator", "version", "watch")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        n = num_gpu_blocks
        self.num_gpu_blocks = n
        self.enable_caching = enable_caching
        # Blocks 1..N-1 in id order (block 0 is taken out at once as the null block).
        self.lo = 1
        if n > 1:
            self.next = {HEAD: RANGE, RANGE: TAIL}
            self.prev = {RANGE: HEAD, TAIL: RANGE}
        else:
            self.next = {HEAD: TAIL}
            self.prev = {TAIL: HEAD}
        self.num_free_blocks = n - 1
        self.ref_cnt = [0]
        self.block_hash: list[int | None] = [None]
        # key -> block id, or key -> {block id: None} when several blocks carry the key;
        # the first one stored is the one a lookup returns.
        self.cached: dict[int, int | dict[int, None]] = {}
        self.usage_denominator = n - 1
        # Moves whenever the lookup of the watched request (``watch``: its key owner, see
        # request.py) could answer differently: a shared prefix-group key (negative) cached or
        # evicted, or one of its own keys evicted. Other keys belong to other requests; its own
        # are cached only while it runs.
        self.version = 0
        self.watch = 0

    # -- free queue -----------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue head -> tail (for tests and debugging)."""
        out: list[int] = []
        b = self.next[HEAD]
        while b != TAIL:
            if b == RANGE:
                out.extend(range(self.lo, self.num_gpu_blocks))
            else:
                out.append(b)
            b = self.next[b]
        return out

    def _take_range(self, k: int) -> range:
        """The next ``k`` never-used ids (k <= what is left), now materialised with ref 1;
        the RANGE node leaves the queue once it is empty."""
        lo = self.lo
        hi = lo + k
        self.lo = hi
        self.ref_cnt.extend([1] * k)
        self.block_hash.extend([None] * k)
        if hi == self.num_gpu_blocks:
            nxt, prv = self.next, self.prev
            p = prv.pop(RANGE)
            q = nxt.pop(RANGE)
            nxt[p] = q
            prv[q] = p
        return range(lo, hi)

    def _unlink(self, b: int) -> None:
        nxt, prv = self.next, self.prev
        p = prv.pop(b)
        q = nxt.pop(b)
        nxt[p] = q
        prv[q] = p
        self.num_free_blocks -= 1

    def _prepend_n(self, blocks: list[int]) -> None:
        nxt, prv = self.next, self.prev
        first = nxt[HEAD]
        p = HEAD
        for b in blocks:
            prv[b] = p
            nxt[p] = b
            p = b
        nxt[p] = first
        prv[first] = p
        self.num_free_blocks += len(blocks)

    def _append_n(self, blocks: list[int]) -> None:
        nxt, prv = self.next, self.prev
        p = prv[TAIL]
        for b in blocks:
            prv[b] = p
            nxt[p] = b
            p = b
        nxt[p] = TAIL
        prv[TAIL] = p
        self.num_free_blocks += len(blocks)

    # -- allocation -----------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head, evicting any key they still carry."""
        nxt, prv, ref, bh = self.next, self.prev, self.ref_cnt, self.block_hash
        out: list[int] = []
        left = num_blocks
        b = nxt[HEAD]
        while left:
            if b == RANGE:
                k = min(left, self.num_gpu_blocks - self.lo)
                out.extend(self._take_range(k))
                left -= k
                b = nxt[HEAD] if left else b
                continue
            out.append(b)
            ref[b] += 1
            if bh[b] is not None:
                self._evict(b)
            q = nxt.pop(b)
            del prv[b]
            nxt[HEAD] = q
            prv[q] = HEAD
            b = q
            left -= 1
        self.num_free_blocks -= num_blocks
        return out

    def pop_one(self) -> int:
        """``get_new_blocks(1)[0]`` without the list."""
        nxt, prv = self.next, self.prev
        b = nxt[HEAD]
        self.num_free_blocks -= 1
        if b == RANGE:
            return self._take_range(1)[0]
        q = nxt.pop(b)
        del prv[b]
        nxt[HEAD] = q
        prv[q] = HEAD
        self.ref_cnt[b] += 1
        if self.block_hash[b] is not None:
            self._evict(b)
        return b

    def _evict(self, b: int) -> None:
        key = self.block_hash[b]
        self.block_hash[b] = None
        if key < 0 or key >> KEY_SHIFT == self.watch:
            self.version += 1
        entry = self.cached.get(key)
        if entry is None:
            return
        if isinstance(entry, dict):
            entry.pop(b, None)
            if len(entry) == 1:
                self.cached[key] = next(iter(entry))
            elif not entry:
                del self.cached[key]
        elif entry == b:
            del self.cached[key]

    def touch(self, blocks: list[int]) -> None:
        """A prefix hit: blocks with ref 0 leave the free queue; every ref count +1."""
        ref = self.ref_cnt
        for b in blocks:
            if ref[b] == 0:
                self._unlink(b)
            ref[b] += 1

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """Release blocks given in eviction order (a request's blocks last-first).

        Blocks reaching ref 0 without a key go to the head (reused first), keyed ones to the
        tail (evicted last), each group keeping the given order.
        """
        ref, bh = self.ref_cnt, self.block_hash
        first: list[int] = []
        last: list[int] = []
        for b in ordered_blocks:
            ref[b] -= 1
            if ref[b] == 0:
                if bh[b] is None:
                    first.append(b)
                else:
                    last.append(b)
        if first:
            self._prepend_n(first)
        if last:
            self._append_n(last)

    # -- prefix cache ---------------------------------------------------------------------
    def cache_block(self, b: int, key: int) -> None:
        self.block_hash[b] = key
        if key < 0:
            self.version += 1
        entry = self.cached.get(key)
        if entry is None:
            self.cached[key] = b
        elif isinstance(entry, dict):
            entry[b] = None
        else:
            self.cached[key] = {entry: None, b: None}

    def get_cached_block(self, key: int) -> int | None:
        entry = self.cached.get(key)
        if entry is None or not isinstance(entry, dict):
            return entry
        return next(iter(entry))

    # -- stats ----------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.num_free_blocks

    def get_usage(self) -> float:
        """``1 - free / (N - 1)``: cached blocks no request holds count as free."""
        return 1.0 - self.num_free_blocks / self.usage_denominator


class _NoKeys:
    """``block_hash`` of a pool without prefix caching: no block carries a key."""

    __slots__ = ()

    def __getitem__(self, b: int) -> None:
        return None


class StackBlockPool(BlockPool):
    """The same pool when prefix caching is off, on a plain list.

    Without caching no block carries a hash, so every freed block is prepended to the head
    and every allocation pops the head: the free queue is then a stack whose top is the
    head, and ``list.extend``/slicing replace the linked-list walks. Below the stack lie the
    never-used ids ``lo..N-1`` (vLLM's initial order), taken only once the stack is empty, so
    the stack holds at most the peak number of blocks in use. A block is never shared
    without caching, so its reference count is 1 exactly when it is off the queue; the counts
    are derived on request instead of being written at every pop and free.
    """

    __slots__ = ("stack",)

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False) -> None:
        if enable_caching:
            raise ValueError("StackBlockPool models a pool without prefix caching")
        n = num_gpu_blocks
        self.num_gpu_blocks = n
        self.enable_caching = False
        self.stack: list[int] = []
        self.lo = 1
        self.num_free_blocks = n - 1
        self.block_hash = _NoKeys()  # type: ignore[assignment]
        self.cached = {}
        self.usage_denominator = n - 1
        self.version = 0
        self.watch = 0

    def free_queue(self) -> list[int]:
        return self.stack[::-1] + list(range(self.lo, self.num_gpu_blocks))

    @property
    def ref_cnt(self) -> list[int]:  # type: ignore[override]
        ref = [1] * self.lo + [0] * (self.num_gpu_blocks - self.lo)
        ref[0] = 0
        for b in self.stack:
            ref[b] = 0
        return ref

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks <= 0:
            return []
        stack = self.stack
        self.num_free_blocks -= num_blocks
        if num_blocks <= len(stack):
            out = stack[-num_blocks:]
            del stack[-num_blocks:]
            out.reverse()
            return out
        out = stack[::-1]
        stack.clear()
        lo = self.lo
        self.lo = lo + num_blocks - len(out)
        out.extend(range(lo, self.lo))
        return out

    def pop_one(self) -> int:
        self.num_free_blocks -= 1
        if self.stack:
            return self.stack.pop()
        self.lo += 1
        return self.lo - 1

    def touch(self, blocks: list[int]) -> None:
        raise AssertionError("no prefix hits without prefix caching")

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        # Prepending [b_k, ..., b_1] keeps b_k at the head: push b_1 first, b_k last.
        self.stack.extend(reversed(ordered_blocks))
        self.num_free_blocks += len(ordered_blocks)

    def cache_block(self, b: int, key: int) -> None:
        raise AssertionError("no block is hashed without prefix caching")
