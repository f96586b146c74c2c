"""How vLLM 0.33.0 lays the KV cache out: layer specs, groups, bytes per block, blocks per
request (``vllm/v1/core/kv_cache_planning.py`` and ``kv_cache_interface.py``).

* Every attention layer has a spec: full, sliding window (with its window) or MLA, and a page
  of ``block_size * bytes_per_token`` bytes on one rank.
* All specs equal: one group of every layer. All layers needing the same token slots (all
  full, or all sliding with one window) but with different page sizes: still one group.
* Otherwise (hybrid): pages are unified first (a smaller page gets a larger block size when it
  divides the largest page, else it is padded), then layers are grouped by spec and split into
  groups of ``group_size`` layers, the fewest layers of any type (or the most, when that is
  under 1.5x the fewest), padding the last group of a type.
* One block of the shared pool holds a page of every layer of one group: bytes per block =
  the widest group's pages, on the rank (pipeline stage) at hand.
* A request of ``max_model_len`` tokens needs, per group, ``cdiv(max_model_len, B)`` blocks
  (full, MLA) or ``cdiv(min(window - 1 + in_flight, max_model_len), B) + 1`` (sliding, where
  ``in_flight`` = max_num_batched_tokens x concurrent batches); the groups' counts add up.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, SLIDING, MLA = "full", "sliding", "mla"


@dataclass(frozen=True)
class LayerSpec:
    kind: str
    bytes_per_token: int
    window: int | None = None


@dataclass(frozen=True)
class KVGroup:
    kind: str
    window: int | None
    block_size: int
    page_bytes: int
    layers: tuple[int, ...]

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        if self.kind == SLIDING and self.window is not None:
            tokens = min(self.window - 1 + in_flight_tokens, max_model_len)
            return _cdiv(tokens, self.block_size) + 1
        return _cdiv(max_model_len, self.block_size)

    def blocks_held(self, seq_len: int) -> int:
        """Blocks a running sequence of ``seq_len`` tokens holds in this group (out-of-window
        blocks freed, no chunk in flight)."""
        full = _cdiv(seq_len, self.block_size)
        if self.kind == SLIDING and self.window is not None:
            return min(full, _cdiv(self.window - 1, self.block_size) + 1)
        return full


@dataclass(frozen=True)
class KVLayout:
    groups: tuple[KVGroup, ...]
    uniform: bool
    """One group only (no hybrid manager)."""
    layer_pages: tuple[int, ...]
    """Page bytes of each layer after unification (what a block stores for it)."""

    def bytes_per_block(self, layers: range) -> int:
        """Bytes one block takes on a rank holding ``layers``: the widest group there."""
        on_stage = set(layers)
        widest = 0
        for g in self.groups:
            if self.uniform:
                width = sum(self.layer_pages[i] for i in g.layers if i in on_stage)
            else:
                width = sum(1 for i in g.layers if i in on_stage) * g.page_bytes
            widest = max(widest, width)
        return widest

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        return sum(g.blocks_per_request(max_model_len, in_flight_tokens) for g in self.groups)

    def blocks_held(self, seq_len: int) -> int:
        return sum(g.blocks_held(seq_len) for g in self.groups)


def plan_layout(specs: list[LayerSpec], block_size: int) -> KVLayout:
    """Group the layers as vLLM 0.33.0's ``get_kv_cache_groups`` does (no speculative
    decoding, no Mamba, a layer-outermost cache layout)."""
    pages = [block_size * s.bytes_per_token for s in specs]
    kinds = {(s.kind, s.window) for s in specs}
    same_slots = len(kinds) == 1 or {k for k, _ in kinds} <= {FULL, MLA}
    if len(set(zip(specs, pages, strict=True))) == 1 or same_slots:
        kind, window = specs[0].kind, specs[0].window
        group = KVGroup(kind, window, block_size, pages[0], tuple(range(len(specs))))
        return KVLayout((group,), True, tuple(pages))

    # hybrid: unify page sizes, then group layers of one spec into equal-sized groups
    largest = max(pages)
    unified: list[tuple[str, int | None, int, int]] = []  # kind, window, block_size, page
    for s, page in zip(specs, pages, strict=True):
        if page != largest and largest % page == 0:
            unified.append((s.kind, s.window, block_size * (largest // page), largest))
        else:
            unified.append((s.kind, s.window, block_size, largest))  # equal, or padded
    buckets: dict[tuple, list[int]] = {}
    for i, key in enumerate(unified):
        buckets.setdefault(key, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for (kind, window, bs, page), layers in buckets.items():
        n = _cdiv(len(layers), group_size)
        for i in range(n):
            # layers[i::n], as vLLM does, so pipeline stages split every group evenly
            groups.append(KVGroup(kind, window, bs, page, tuple(layers[i::n])))
    return KVLayout(tuple(groups), False, tuple(largest for _ in specs))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
