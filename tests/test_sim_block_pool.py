"""The block pool and KV-cache manager rules (docs/scheduler.md section 3), by hand."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

from kvpressure.simulation.block_pool import BlockPool, StackBlockPool
from kvpressure.simulation.kv_cache_manager import KVCacheManager
from kvpressure.simulation.request import PREEMPTED, Request
from sim_helpers import ManualLoop, settings


def test_null_block_is_taken_out_and_blocks_pop_in_id_order():
    pool = BlockPool(6, True)
    assert pool.free_queue() == [1, 2, 3, 4, 5] and pool.get_num_free_blocks() == 5
    assert pool.get_new_blocks(2) == [1, 2]
    assert pool.pop_one() == 3
    assert pool.free_queue() == [4, 5]
    assert abs(pool.get_usage() - 3 / 5) < 1e-12


def test_free_puts_unhashed_blocks_at_the_head_and_hashed_at_the_tail_in_order():
    pool = BlockPool(8, True)
    blocks = pool.get_new_blocks(4)  # 1..4; 1 and 2 full and hashed
    pool.cache_block(1, 101)
    pool.cache_block(2, 102)
    pool.free_blocks(list(reversed(blocks)))
    # Visit order 4, 3, 2*, 1*: 4, 3 prepended (4 first), 2*, 1* appended.
    assert pool.free_queue() == [4, 3, 5, 6, 7, 2, 1]


def test_with_caching_off_every_freed_block_goes_to_the_head():
    pool = BlockPool(6, False)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(list(reversed(blocks)))
    assert pool.free_queue() == [3, 2, 1, 4, 5]


def test_touch_unlinks_from_the_middle_and_pop_evicts_the_key():
    pool = BlockPool(6, True)
    b = pool.get_new_blocks(3)
    pool.cache_block(b[0], 7)
    pool.cache_block(b[1], 8)
    pool.free_blocks(list(reversed(b)))  # [3, 4, 5, 2*, 1*]
    pool.touch([2])
    assert pool.free_queue() == [3, 4, 5, 1] and pool.ref_cnt[2] == 1
    pool.get_new_blocks(3)
    assert pool.get_cached_block(7) == 1
    pool.pop_one()  # pops 1: its key leaves the map
    assert pool.get_cached_block(7) is None and pool.block_hash[1] is None
    assert pool.get_cached_block(8) == 2  # held, not evictable


def test_first_stored_block_wins_and_survives_partial_eviction():
    pool = BlockPool(6, True)
    pool.get_new_blocks(2)
    pool.cache_block(1, 5)
    pool.cache_block(2, 5)
    assert pool.get_cached_block(5) == 1
    pool.free_blocks([1])
    pool.get_new_blocks(4)  # pops 3, 4, 5, then 1 (evicted)
    assert pool.get_cached_block(5) == 2


def test_hit_is_capped_at_whole_blocks_below_the_last_token():
    # A fully cached 32-token prompt (B=16) hits 16 tokens, not 31 (docs/scheduler.md#kv-lookup).
    kv = KVCacheManager(10, 16, 8192, True)
    a = Request("a", 32, 5, position=0, prefix_group="g", prefix_len=32, group_index=0)
    b = Request("b", 32, 5, position=1, prefix_group="g", prefix_len=32, group_index=0)
    assert kv.allocate_slots_waiting(a, 32, [], 0, True, False)
    assert kv.get_computed_blocks(b) == (a.blocks[:1], 16)


def test_watermark_counts_the_null_block_and_applies_only_beside_running_requests():
    # N = 10, watermark 0.1 -> W = int(0.1 * 10) = 1 block.
    kv = KVCacheManager(10, 16, 8192, False, watermark=0.1)
    assert kv.watermark_blocks == 1
    r = Request("r", 16 * 9, 1, position=0)
    assert kv.can_admit(r, 144, [], 0, True, has_scheduled_reqs=False)
    assert not kv.can_admit(r, 144, [], 0, True, has_scheduled_reqs=True)


def test_full_sequence_gate_uses_current_length_not_max_tokens():
    kv = KVCacheManager(4, 16, 8192, False)  # 3 usable blocks
    r = Request("r", 40, 1000, position=0)
    assert kv.can_admit(r, 40, [], 0, True, True)  # 3 blocks for 40 tokens
    r.num_tokens = 49
    assert not kv.can_admit(r, 16, [], 0, True, True)  # gate: 4 blocks > 3
    assert kv.can_admit(r, 16, [], 0, False, True)  # chunk alone: 1 block


def test_decode_takes_a_block_exactly_when_position_starts_one():
    loop = ManualLoop(settings(num_gpu_blocks=20, enable_prefix_caching=False))
    r = loop.add("r", 16, 20)
    loop.run_step()  # prompt fills block 1 exactly; the first output is position 16
    assert len(r.blocks) == 1
    loop.run_step()  # writes position 16 -> a new block
    assert len(r.blocks) == 2
    for _ in range(15):
        loop.run_step()  # positions 17..31 stay in block 2
    assert len(r.blocks) == 2
    loop.run_step()
    assert len(r.blocks) == 3 and r.status != PREEMPTED


@settings_h(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5), st.booleans()), max_size=60))
def test_stack_pool_without_caching_matches_the_linked_list(ops):
    # The stack pool's request-order shortcuts (append_new_blocks, free_request_blocks)
    # against the keyed pool's general calls.
    a, b = BlockPool(12, False), StackBlockPool(12)
    held_a, held_b = [], []
    for alloc, k, shortcut in ops:
        if alloc and a.num_free_blocks >= k:
            held_a.append(a.get_new_blocks(k))
            if shortcut and held_b:
                b.append_new_blocks(held_b[-1], k)  # grows the last request ...
                held_a[-2:] = [held_a[-2] + held_a[-1]]  # ... as the same blocks
            else:
                held_b.append(b.get_new_blocks(k))
        elif not alloc and held_a:
            i = k % len(held_a)
            a.free_blocks(list(reversed(held_a.pop(i))))
            if shortcut:
                b.free_request_blocks(held_b.pop(i))
            else:
                b.free_blocks(list(reversed(held_b.pop(i))))
        assert a.free_queue() == b.free_queue()
        assert held_a == held_b
        assert a.num_free_blocks == b.num_free_blocks


class _ListQueue:
    """vLLM's free-block queue and prefix-cache map written the plain way: one list head ->
    tail, one reference count and key per block, every key's blocks in storing order."""

    def __init__(self, n: int) -> None:
        self.q = list(range(1, n))
        self.ref = [0] * n
        self.key: list[int | None] = [None] * n
        self.blocks_of: dict[int, list[int]] = {}

    def pop(self, k: int) -> list[int]:
        out, self.q = self.q[:k], self.q[k:]
        for b in out:
            if self.key[b] is not None:
                self.blocks_of[self.key[b]].remove(b)
                if not self.blocks_of[self.key[b]]:
                    del self.blocks_of[self.key[b]]
                self.key[b] = None
            self.ref[b] += 1
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.q.remove(b)
            self.ref[b] += 1

    def free(self, ordered: list[int]) -> None:
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.key[b] is None else last).append(b)
        self.q = first + self.q + last

    def cache(self, b: int, key: int) -> None:
        self.key[b] = key
        self.blocks_of.setdefault(key, []).append(b)

    def lookup(self, key: int) -> int | None:
        return self.blocks_of[key][0] if key in self.blocks_of else None


_OPS = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "free", "cache", "hit"]),
                          st.integers(0, 1000)), max_size=80)


@settings_h(max_examples=300, deadline=None)
@given(st.integers(2, 14), _OPS)
def test_pool_keeps_the_plain_queue_order_through_frees_hits_and_evictions(n, ops):
    # Keys from a small set, so that several blocks carry one key and evictions hit shared
    # entries; what a lookup returns and the whole queue order must match the plain model.
    pool, ref = BlockPool(n, True), _ListQueue(n)
    held: list[list[int]] = []  # each "request"'s blocks, in order
    for op, x in ops:
        if op == "alloc":
            k = x % 4 + 1
            if k <= len(ref.q):
                got = pool.get_new_blocks(k) if k > 1 or x % 2 else [pool.pop_one()]
                assert got == ref.pop(k)
                held.append(got)
        elif op == "free" and held:
            blocks = held.pop(x % len(held))
            pool.free_blocks(blocks[::-1])
            ref.free(blocks[::-1])
        elif op == "cache" and held:
            blocks = held[x % len(held)]
            b = blocks[x % len(blocks)]
            if ref.key[b] is None:
                key = x % 5 - 2 or 3  # negative keys are shared prefix-group keys
                pool.cache_block(b, key)
                ref.cache(b, key)
        elif op == "hit":
            key = x % 5 - 2 or 3
            b = ref.lookup(key)
            assert pool.get_cached_block(key) == b
            if b is not None:
                pool.touch([b])
                ref.touch([b])
                held.append([b])
        assert pool.free_queue() == ref.q
        assert pool.num_free_blocks == len(ref.q)
        assert [pool.ref_cnt[b] if b < len(pool.ref_cnt) else 0 for b in range(n)] == ref.ref
        for key in range(-2, 4):
            assert pool.get_cached_block(key) == ref.lookup(key)


class _EagerOwnKeys(KVCacheManager):
    """Every key enters the lookup map as soon as its block is keyed, as in vLLM."""

    __slots__ = ()

    def cache_blocks(self, req, num_tokens):
        super().cache_blocks(req, num_tokens)
        self._register_own_keys(req)


@st.composite
def _pressured_caching_workloads(draw):
    B = draw(st.sampled_from([4, 16]))
    reqs = []
    for i in range(draw(st.integers(2, 12))):
        r = {"id": f"q{i}", "prompt_len": draw(st.integers(1, 12 * B)),
             "output_len": draw(st.integers(1, 6 * B)), "priority": draw(st.integers(0, 2))}
        if draw(st.booleans()):
            r["prefix_group"] = "g"
        reqs.append(r)
    longest = max(r["prompt_len"] + r["output_len"] for r in reqs)
    s = {"num_gpu_blocks": -(-longest // B) + 1 + draw(st.integers(0, 12)), "block_size": B,
         "max_num_seqs": draw(st.integers(1, 8)), "max_num_batched_tokens": 8 * B,
         "enable_prefix_caching": True, "max_model_len": longest + 1,
         "policy": draw(st.sampled_from(["fcfs", "priority"])),
         "scheduler_reserve_full_isl": draw(st.booleans())}
    return {"name": "keys", "mode": {"type": "closed", "concurrency": draw(st.integers(2, 8))},
            "settings": s, "prefix_groups": {"g": {"length": draw(st.integers(0, 4)) * B}},
            "requests": reqs}


@settings_h(max_examples=120, deadline=None)
@given(_pressured_caching_workloads())
def test_own_keys_registered_at_preemption_decide_as_registered_at_once(data):
    # A request's own keys enter the lookup map only when it is freed unfinished; vLLM
    # registers them at once. Every row (prefix hits, evictions through usage, preemptions)
    # and every request's counters must be the same, on small pools that preempt and re-hit.
    import kvpressure.simulation.scheduler as scheduler_module
    from kvpressure.simulation.engine import simulate
    from kvpressure.simulation.scenario import load_scenario

    lazy = simulate(load_scenario(data))
    real = scheduler_module.KVCacheManager
    scheduler_module.KVCacheManager = _EagerOwnKeys
    try:
        eager = simulate(load_scenario(data))
    finally:
        scheduler_module.KVCacheManager = real
    assert lazy.steps_frame().equals(eager.steps_frame())
    assert lazy.requests_frame().equals(eager.requests_frame())


def test_a_resumed_request_finds_its_first_copy_of_a_block_it_computed_twice():
    # B = 4, a 16-token prompt: 4 keyed blocks, but a lookup stops at (16 - 1) // 4 = 3, so
    # the resumed request computes block 3 again in a new block: two blocks carry its key.
    # Preempted once more with 17 tokens, its lookup reaches block 3 and must get the copy
    # keyed first (vLLM's first stored), even though its own keys enter the map only when
    # it is freed.
    kv = KVCacheManager(16, 4, 8192, True)
    p = Request("p", 16, 10, position=0, block_size=4)
    assert kv.allocate_slots_waiting(p, 16, [], 0, True, False)
    assert p.blocks == [1, 2, 3, 4]
    kv.free(p)  # preempted: free queue 5..15, then 4, 3, 2, 1 (keyed, at the tail)
    p.status = PREEMPTED
    hit, h = kv.get_computed_blocks(p)
    assert (hit, h) == ([1, 2, 3], 12)
    assert kv.allocate_slots_waiting(p, 4, hit, h, True, True)
    assert p.blocks == [1, 2, 3, 5]
    p.num_tokens = 17
    kv.free(p)
    assert kv.pool.free_queue() == list(range(6, 16)) + [4, 5, 3, 2, 1]
    assert kv.get_computed_blocks(p) == ([1, 2, 3, 4], 16)


def test_evictable_hit_blocks_are_the_ones_no_request_holds():
    kv = KVCacheManager(10, 4, 8192, True)
    a = Request("a", 16, 4, position=0, prefix_group="g", prefix_len=16, group_index=0,
                block_size=4)
    b = Request("b", 12, 4, position=1, prefix_group="g", prefix_len=16, group_index=0,
                block_size=4)
    assert kv.allocate_slots_waiting(a, 16, [], 0, True, False)  # blocks 1-4, all keyed
    hit, h = kv.get_computed_blocks(b)  # (12 - 1) // 4 = 2 blocks
    assert (hit, h) == ([1, 2], 8)
    assert kv.num_evictable(hit) == 0 and kv.num_evictable([3]) == 0
    kv.free(a)
    assert kv.num_evictable(hit) == 2 and kv.num_evictable([4]) == 1
    kv.pool.touch([2])
    assert kv.num_evictable([1, 2, 3, 4]) == 3 and kv.num_evictable([]) == 0
    # A 20-token request of the group hits blocks 1-4 (cap (20 - 1) // 4 = 4), of which 1, 3
    # and 4 are free: it needs cdiv(20, 4) - 4 = 1 new block plus the 3 it takes out of the
    # free queue. 5 usable blocks, 4 free (5 never used, 4, 3, 1): it fits exactly.
    kv = KVCacheManager(6, 4, 8192, True)
    assert kv.allocate_slots_waiting(a, 16, [], 0, True, False)
    kv.free(a)
    kv.pool.touch([2])
    c = Request("c", 20, 4, position=2, prefix_group="g", prefix_len=20, group_index=0,
                block_size=4)
    hit, h = kv.get_computed_blocks(c)
    assert (hit, h, kv.pool.num_free_blocks) == ([1, 2, 3, 4], 16, 4)
    assert kv.can_admit(c, 4, hit, h, True, True)
    kv.pool.pop_one()  # block 5: one free block fewer
    assert not kv.can_admit(c, 4, hit, h, True, True)


def test_keyed_part_stays_in_order_and_bounded_through_long_runs_of_hits_and_frees():
    # Thousands of frees, hits and pops (past the thresholds at which the keyed part drops
    # the entries hits and pops left behind): the queue and lookups still match the plain
    # model, and the list holds at most about twice the blocks in that part.
    import random

    rng = random.Random(7)
    n = 40
    pool, ref = BlockPool(n, True), _ListQueue(n)
    held: list[list[int]] = []
    trims = 0
    for _ in range(4000):
        base = pool.lru_base
        op = rng.choice(("alloc", "free", "free", "free", "hit", "hit", "hit"))
        if op == "alloc":
            k = rng.randint(1, 6)
            if k <= len(ref.q):
                got = pool.get_new_blocks(k) if k > 1 else [pool.pop_one()]
                assert got == ref.pop(k)
                for b in got:
                    if ref.key[b] is None:  # every block keyed: frees go to the tail
                        key = rng.randint(-3, 40)
                        pool.cache_block(b, key)
                        ref.cache(b, key)
                held.append(got)
        elif op == "free" and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free_blocks(blocks[::-1])
            ref.free(blocks[::-1])
            # Frees drop the dead entries once they outnumber the live ones.
            assert len(pool.lru) - pool.lru_head <= 2 * pool.lru_live + 16
        elif op == "hit":
            b = ref.lookup(rng.randint(-3, 40))
            if b is not None:
                pool.touch([b])
                ref.touch([b])
                held.append([b])
        assert pool.free_queue() == ref.q
        assert pool.num_free_blocks == len(ref.q)
        assert pool.lru_live == len(pool._lru_live())
        trims += pool.lru_base > base
    assert trims  # pops dropped the entries before the head
    for key in range(-3, 41):
        assert pool.get_cached_block(key) == ref.lookup(key)


def test_hits_on_free_blocks_leave_entries_that_a_free_drops():
    # 99 keyed blocks freed (the keyed part, oldest first), 80 of them hit back out: the
    # next free rebuilds the part from its 19 live entries plus the new one, in order.
    n = 100
    pool, ref = BlockPool(n, True), _ListQueue(n)
    blocks = pool.get_new_blocks(n - 1)
    assert blocks == ref.pop(n - 1)
    for b in blocks:
        pool.cache_block(b, b)
        ref.cache(b, b)
    pool.free_blocks(blocks)
    ref.free(blocks)
    hit = blocks[5:85]
    pool.touch(hit)
    ref.touch(hit)
    assert len(pool.lru) == n - 1 and pool.lru_live == 19
    pool.free_blocks([hit[0]])
    ref.free([hit[0]])
    assert len(pool.lru) == pool.lru_live == 20 and pool.lru_head == 0
    assert pool.free_queue() == ref.q == blocks[:5] + blocks[85:] + [hit[0]]
    # Pops still evict oldest first, keys and all.
    assert pool.get_new_blocks(6) == ref.pop(6) == blocks[:5] + [blocks[85]]
    assert pool.get_cached_block(blocks[0]) is None and pool.free_queue() == ref.q
