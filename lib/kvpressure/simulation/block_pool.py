"""vLLM 0.33.0's block pool (``v1/core/block_pool.py``): the free-block queue, reference counts,
and the block-key -> block map of the prefix cache.

The free queue is vLLM's ``FreeKVCacheBlockQueue`` order kept in three parts, head first:

* ``stack``: blocks freed without a key, top = head. Freeing prepends keyless blocks and
  nothing else ever reaches the head, so this part is a LIFO stack: ``stack[:top]``, the
  entries from ``top`` on being left over from earlier pops (a list that pops shrink would
  be reallocated over and over as a busy pool's stack swings up and down).
* the never-used ids ``lo..N-1``: vLLM's queue starts as blocks ``1..N-1`` in id order, and a
  block leaves that run only by being popped from the head, so the run is always one range.
* ``lru``: blocks freed with a key, oldest first. Freeing appends keyed blocks at the tail, a
  prefix hit takes a keyed block out from anywhere, and a pop reaches this part only once the
  two others are empty. A list read from ``lru_head`` on, whose entry for block ``b`` is live
  only at the absolute position ``lru_pos[b]`` (``lru_base`` is the absolute position of
  ``lru[0]``; -1: not in this part): a hit only marks the block out, and the pops step over
  the entries so left behind. The list is cut when its dead entries outnumber the live
  ones, so it stays within about twice the blocks in this part (plain list operations,
  native when compiled, where an ordered dict's go through calls).

A keyless block never gains a key while free (keys are registered on held blocks only), and a
free block loses its key only by being popped, so every free block sits in the part its key
says. Memory follows the blocks a run has used, not the pool's nominal size: ``ref_cnt``,
``block_hash`` and ``lru_pos`` hold ids ``0..lo-1`` (an id at or above ``lo`` has reference 0
and no key).
"""

from __future__ import annotations

from typing import Any

from kvpressure.simulation.request import KEY_SHIFT


class BlockPool:
    """Blocks ``0..N-1``; block 0 is the null block, never allocated nor counted."""

    __slots__ = ("num_gpu_blocks", "enable_caching", "stack", "top", "lru", "lru_head",
                 "lru_base",
                 "lru_pos", "lru_live", "lo", "num_free_blocks", "ref_cnt", "block_hash",
                 "cached", "usage_denominator", "version", "watch")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        n = num_gpu_blocks
        self.num_gpu_blocks = n
        self.enable_caching = enable_caching
        # Blocks 1..N-1 in id order (block 0 is taken out at once as the null block).
        self.lo = 1
        self.stack: list[int] = []
        self.top = 0
        self.lru: list[int] = []
        self.lru_head = 0
        self.lru_base = 0
        self.lru_pos: list[int] = [-1]
        self.lru_live = 0
        self.num_free_blocks = n - 1
        # Typed Any: the pool without prefix caching derives them (``StackBlockPool``).
        self.ref_cnt: Any = [0]
        self.block_hash: Any = [None]
        # key -> block id, or key -> {block id: None} when several blocks carry the key;
        # the first one stored is the one a lookup returns. A key only its owner can look
        # up may be on a block (``block_hash``) before it is here: the KV-cache manager adds
        # it when the owner is freed unfinished (kv_cache_manager.py ``cache_blocks``).
        self.cached: dict[int, Any] = {}  # int | dict[int, None], told apart by class
        self.usage_denominator = n - 1
        # Moves whenever the lookup of the watched request (``watch``: its key owner, see
        # request.py) could answer differently: a shared prefix-group key (negative) cached or
        # evicted, or one of its own keys evicted. Other keys belong to other requests; its own
        # are keyed only while it runs.
        self.version = 0
        self.watch = 0

    # -- free queue -----------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue head -> tail (for tests and debugging)."""
        return (self.stack[:self.top][::-1] + list(range(self.lo, self.num_gpu_blocks))
                + self._lru_live())

    def _lru_live(self) -> list[int]:
        """The live entries of ``lru``, oldest first."""
        pos = self.lru_pos
        at = self.lru_base + self.lru_head
        out = []
        for i, b in enumerate(self.lru[self.lru_head:]):
            if pos[b] == at + i:
                out.append(b)
        return out

    def _lru_pop(self) -> int:
        """The oldest live entry of ``lru``, taken out (the part is not empty)."""
        lru = self.lru
        pos: list[int] = self.lru_pos
        head = self.lru_head
        at = self.lru_base + head
        b = lru[head]
        while pos[b] != at:
            head += 1
            at += 1
            b = lru[head]
        pos[b] = -1
        self.lru_head = head + 1
        self.lru_live -= 1
        self._lru_trim()
        return b

    def _lru_trim(self) -> None:
        """Drop the entries before the head once they are most of the list."""
        head = self.lru_head
        if head >= 16 and head * 2 >= len(self.lru):
            del self.lru[:head]
            self.lru_base += head
            self.lru_head = 0

    def _lru_compact(self) -> None:
        """Rebuild ``lru`` from its live entries, in order, when the dead ones (blocks a hit
        took out) outnumber them."""
        live = self._lru_live()
        pos = self.lru_pos
        for i, b in enumerate(live):
            pos[b] = i
        self.lru = live
        self.lru_head = 0
        self.lru_base = 0

    def _take_range(self, k: int) -> range:
        """The next ``k`` never-used ids (k <= what is left), now materialised with ref 1."""
        lo = self.lo
        hi = lo + k
        self.lo = hi
        self.ref_cnt.extend([1] * k)
        self.block_hash.extend([None] * k)
        self.lru_pos.extend([-1] * k)
        return range(lo, hi)

    # -- allocation -----------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head, evicting any key they still carry."""
        if num_blocks <= 0:
            return []
        stack = self.stack
        # Typed locals (this pool's lists; the keyless pool has its own methods): the
        # compiled step indexes them natively.
        ref: list[int] = self.ref_cnt
        self.num_free_blocks -= num_blocks
        s = self.top
        if num_blocks <= s:
            s -= num_blocks
            out = stack[s:self.top]
            self.top = s
            out.reverse()
            for b in out:
                ref[b] = 1
            return out
        out = stack[:s]
        out.reverse()
        self.top = 0
        for b in out:
            ref[b] = 1
        left = num_blocks - s
        k = self.num_gpu_blocks - self.lo
        if k:
            if k > left:
                k = left
            out.extend(self._take_range(k))
            left -= k
        if left:
            # Keyed blocks, oldest first: each pop evicts its key (_lru_pop and _evict,
            # inlined).
            lru = self.lru
            pos: list[int] = self.lru_pos
            head = self.lru_head
            at = self.lru_base + head
            bh: list[int | None] = self.block_hash
            cached = self.cached
            watch = self.watch
            bumps = 0
            for _ in range(left):
                b = lru[head]
                while pos[b] != at:
                    head += 1
                    at += 1
                    b = lru[head]
                head += 1
                at += 1
                pos[b] = -1
                ref[b] = 1
                # The key object itself for the map (an int unboxed and boxed again would
                # be a new object at each use); blocks in ``lru`` are keyed.
                kobj: Any = bh[b]
                key: int = kobj
                bh[b] = None
                if key < 0 or key >> KEY_SHIFT == watch:
                    bumps += 1
                entry = cached.get(kobj)
                if isinstance(entry, dict):
                    self._evict_shared(key, entry, b)
                elif isinstance(entry, int) and entry == b:
                    del cached[kobj]
                out.append(b)
            self.version += bumps
            self.lru_head = head
            self.lru_live -= left
            self._lru_trim()
        return out

    def pop_one(self) -> int:
        """``get_new_blocks(1)[0]`` without the list."""
        self.num_free_blocks -= 1
        top = self.top
        if top:
            top -= 1
            self.top = top
            b = self.stack[top]
            self.ref_cnt[b] = 1
            return b
        if self.lo < self.num_gpu_blocks:
            return self._take_range(1)[0]
        b = self._lru_pop()
        self.ref_cnt[b] = 1
        self._evict(b)
        return b

    def append_new_blocks(self, blocks: list[int], num_blocks: int) -> None:
        """``blocks.extend(get_new_blocks(num_blocks))``."""
        blocks.extend(self.get_new_blocks(num_blocks))

    def free_request_blocks(self, blocks: list[int]) -> None:
        """Release a request's blocks given in request order: last block first
        (docs/scheduler.md#kv-free). ``blocks`` is consumed (reversed in place)."""
        blocks.reverse()
        self.free_blocks(blocks)

    def _evict(self, b: int) -> None:
        kobj: Any = self.block_hash[b]  # a block in ``lru`` is keyed
        key: int = kobj
        self.block_hash[b] = None
        if key < 0 or key >> KEY_SHIFT == self.watch:
            self.version += 1
        entry = self.cached.get(kobj)
        if isinstance(entry, dict):
            self._evict_shared(key, entry, b)
        elif isinstance(entry, int) and entry == b:
            del self.cached[kobj]

    def _evict_shared(self, key: int, entry: dict[int, None], b: int) -> None:
        entry.pop(b, None)
        if len(entry) == 1:
            self.cached[key] = next(iter(entry))
        elif not entry:
            del self.cached[key]

    def touch(self, blocks: list[int]) -> None:
        """A prefix hit: blocks with ref 0 leave the free queue; every ref count +1."""
        ref: list[int] = self.ref_cnt
        pos: list[int] = self.lru_pos
        taken = 0
        for b in blocks:
            r = ref[b]
            if r == 0:
                # Only keyed blocks are hit, and a free keyed block is in ``lru``: its entry
                # there is left dead.
                pos[b] = -1
                taken += 1
            ref[b] = r + 1
        self.num_free_blocks -= taken
        self.lru_live -= taken

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """Release blocks given in eviction order (a request's blocks last-first).

        Blocks reaching ref 0 without a key go to the head (reused first), keyed ones to the
        tail (evicted last), each group keeping the given order.
        """
        ref: list[int] = self.ref_cnt
        bh: list[int | None] = self.block_hash
        first: list[int] = []
        lru = self.lru
        pos: list[int] = self.lru_pos
        at = self.lru_base + len(lru)
        keyed = 0
        released = 0
        for b in ordered_blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                released += 1
                if bh[b] is None:
                    first.append(b)
                else:
                    pos[b] = at
                    at += 1
                    lru.append(b)
                    keyed += 1
        if keyed:
            live = self.lru_live + keyed
            self.lru_live = live
            if len(lru) - self.lru_head > 2 * live + 16:
                self._lru_compact()
        if first:
            # Prepending [b_1, ..., b_k] leaves b_1 at the head: push b_k first.
            first.reverse()
            self._push(first)
        self.num_free_blocks += released

    def _push(self, blocks: list[int]) -> None:
        """Push ``blocks`` on the stack in their order (the last one ends on top)."""
        stack = self.stack
        top = self.top
        n = len(stack)
        for b in blocks:
            if top < n:
                stack[top] = b
            else:
                stack.append(b)
                n += 1
            top += 1
        self.top = top

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
    """The same pool when prefix caching is off, without reference counts.

    Without caching no block carries a key, so the ``lru`` part stays empty and the free
    queue is the stack over the never-used ids. A block is never shared either, so its
    reference count is 1 exactly when it is off the queue: the counts are derived on request
    instead of being written at every pop and free.
    """

    __slots__ = ()

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False) -> None:
        if enable_caching:
            raise ValueError("StackBlockPool models a pool without prefix caching")
        n = num_gpu_blocks
        self.num_gpu_blocks = n
        self.enable_caching = False
        self.stack: list[int] = []
        self.top = 0
        self.lo = 1
        self.num_free_blocks = n - 1
        self.block_hash = _NoKeys()
        self.cached = {}
        self.usage_denominator = n - 1
        self.version = 0
        self.watch = 0

    def free_queue(self) -> list[int]:
        return self.stack[:self.top][::-1] + list(range(self.lo, self.num_gpu_blocks))

    @property
    def ref_cnt(self) -> list[int]:
        ref = [1] * self.lo + [0] * (self.num_gpu_blocks - self.lo)
        ref[0] = 0
        for b in self.stack[:self.top]:
            ref[b] = 0
        return ref

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks <= 0:
            return []
        stack = self.stack
        self.num_free_blocks -= num_blocks
        top = self.top
        if num_blocks <= top:
            if num_blocks <= 8:
                # Few blocks (see append_new_blocks).
                out = []
                for _ in range(num_blocks):
                    top -= 1
                    out.append(stack[top])
                self.top = top
                return out
            out = stack[top - num_blocks:top]
            self.top = top - num_blocks
            out.reverse()
            return out
        out = stack[:top]
        out.reverse()
        self.top = 0
        lo = self.lo
        self.lo = lo + num_blocks - len(out)
        out.extend(range(lo, self.lo))
        return out

    def pop_one(self) -> int:
        self.num_free_blocks -= 1
        top = self.top
        if top:
            top -= 1
            self.top = top
            return self.stack[top]
        self.lo += 1
        return self.lo - 1

    def append_new_blocks(self, blocks: list[int], num_blocks: int) -> None:
        stack = self.stack
        top = self.top
        if num_blocks <= top:
            # The top ``num_blocks`` of the stack, top first, straight into ``blocks``.
            self.num_free_blocks -= num_blocks
            if num_blocks <= 8:
                # A chunk's few blocks: reads and appends run natively when compiled, where
                # the slices go through generic calls.
                for _ in range(num_blocks):
                    top -= 1
                    blocks.append(stack[top])
                self.top = top
            else:
                self.top = top - num_blocks
                blocks.extend(stack[top - num_blocks:top][::-1])
        else:
            blocks.extend(self.get_new_blocks(num_blocks))

    def free_request_blocks(self, blocks: list[int]) -> None:
        # Released last block first, each prepended: the first block ends on top, which is
        # the request's order pushed as it is.
        self._push(blocks)
        self.num_free_blocks += len(blocks)

    def touch(self, blocks: list[int]) -> None:
        raise AssertionError("no prefix hits without prefix caching")

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        # Prepending [b_k, ..., b_1] keeps b_k at the head: push b_1 first, b_k last.
        self._push(ordered_blocks[::-1])
        self.num_free_blocks += len(ordered_blocks)

    def cache_block(self, b: int, key: int) -> None:
        raise AssertionError("no block is hashed without prefix caching")
