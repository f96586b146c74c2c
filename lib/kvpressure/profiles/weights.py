"""Weight bytes per rank: parameters by component, the TP split, pipeline stages, quantization.

Under tensor parallelism vLLM shards the column/row-parallel linear layers (q, k, v, o, the MLP
and every expert) and the vocabulary-parallel embedding and LM head (vocabulary padded to a
multiple of 64 first); it replicates norms, MoE routers, MLA's down-projections
(``q_a_proj``, ``kv_a_proj_with_mqa``) and, when there are fewer KV heads than ranks, the K/V
projection of one head per rank. Under pipeline parallelism each stage holds the layers
``get_pp_indices`` gives it; the first stage also holds the embedding, the last the final norm
and the LM head (a tied LM head is its own copy there when the stages differ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvpressure.errors import InputError

if TYPE_CHECKING:
    from kvpressure.profiles.model import ModelProfile

VOCAB_PADDING = 64


def pp_layers(num_layers: int, pp: int, rank: int) -> range:
    """vLLM 0.33.0's ``get_pp_indices``: equal shares; the remainder goes one layer each to
    the stages before the last, counting back from the second-to-last."""
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise InputError(f"pipeline_parallel_size: must be an integer >= 1, got {pp!r}")
    if pp > num_layers:
        raise InputError(f"pipeline_parallel_size: {pp} exceeds the {num_layers} layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    start = sum(parts[:rank])
    return range(start, start + parts[rank])


@dataclass
class LayerParams:
    """Parameters of one decoder layer: ``split`` ones are sharded over TP, the rest are not."""

    split: dict[str, int] = field(default_factory=dict)
    replicated: dict[str, int] = field(default_factory=dict)
    kv_proj: int = 0
    """k and v projections (split when there are at least as many KV heads as ranks)."""
    kv_heads: int = 0

    def total(self) -> int:
        return sum(self.split.values()) + sum(self.replicated.values()) + self.kv_proj


@dataclass
class ParamCounts:
    layers: list[LayerParams]
    embed: int
    lm_head: int
    final_norm: int
    moe_layers: int

    def total(self) -> int:
        return self.embed + self.lm_head + self.final_norm + sum(x.total() for x in self.layers)


def param_counts(m: ModelProfile) -> ParamCounts:
    H = m.hidden_size
    layers = []
    moe_layers = 0
    for i in range(m.num_hidden_layers):
        lp = LayerParams()
        if m.use_mla:
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                lp.replicated["attention"] = H * m.q_lora_rank + m.q_lora_rank  # q_a + its norm
                q_b = m.q_lora_rank * m.num_attention_heads * qk
            else:
                q_b = H * m.num_attention_heads * qk
            lp.replicated["attention"] = lp.replicated.get("attention", 0) + H * (
                m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            lp.split["attention"] = q_b + m.kv_lora_rank * m.num_attention_heads * (
                m.qk_nope_head_dim + m.v_head_dim) + m.num_attention_heads * m.v_head_dim * H
        else:
            full = m.layer_type(i) == "full_attention"
            d = m.global_head_dim if full and m.global_head_dim else m.head_dim
            n_kv = (m.num_global_key_value_heads if full and m.num_global_key_value_heads
                    else m.num_key_value_heads)
            q_width = m.num_attention_heads * d
            lp.split["attention"] = 2 * H * q_width + (q_width if m.attention_bias else 0)
            lp.kv_proj = 2 * H * n_kv * d + (2 * n_kv * d if m.attention_bias else 0)
            lp.kv_heads = n_kv
        lp.replicated["norms"] = 2 * H
        if m.is_moe and i >= m.num_dense_layers:
            moe_layers += 1
            expert = 3 * H * m.moe_intermediate_size
            lp.split["experts"] = m.num_experts * expert
            shared = m.num_shared_experts * expert
            if m.shared_expert_intermediate_size:
                shared += 3 * H * m.shared_expert_intermediate_size
                lp.replicated["router"] = H  # the shared expert's sigmoid gate
            if shared:
                lp.split["shared_experts"] = shared
            lp.replicated["router"] = lp.replicated.get("router", 0) + H * m.num_experts
        else:
            lp.split["mlp"] = 3 * H * m.intermediate_size
        layers.append(lp)
    embed = m.vocab_size * H
    return ParamCounts(layers, embed, 0 if m.tie_word_embeddings else embed, H, moe_layers)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _bytes(params: float, bits: float) -> float:
    return params * bits / 8


def stage_weight_bytes(m: ModelProfile, tp: int, pp: int = 1, rank: int = 0) -> int:
    """Bytes of weights one TP rank of pipeline stage ``rank`` loads."""
    counts = param_counts(m)
    q = m.quantization
    # a quantized checkpoint keeps its unconverted parts in the model dtype; a profile without
    # quantization_config stores everything in weight_dtype
    dense_bits = 8 * (m.dtype_bytes if q is not None else m.weight_dtype_bytes)

    def bits(component: str) -> float:
        return dense_bits if q is None else q.bits_for(component, dense_bits)

    total = 0.0
    padded_experts = None
    if q is not None and q.method == "mxfp4" and m.is_moe:
        # CUDA's MXFP4 MoE kernels (Marlin, TRT-LLM) pad the hidden size to 256 and each
        # rank's expert width to 128 (fused_moe/oracle/mxfp4.py); gpt-oss-20b at TP 2 loads
        # 7.01 GiB, not the 6.40 of the unpadded shapes
        hidden = _round_up(m.hidden_size, 256)
        width = _round_up(math.ceil(m.moe_intermediate_size / tp), 128)
        padded_experts = m.num_experts * 3 * hidden * width
    for i in pp_layers(m.num_hidden_layers, pp, rank):
        lp = counts.layers[i]
        for comp, n in lp.split.items():
            if comp == "experts" and padded_experts is not None:
                total += _bytes(padded_experts, bits(comp))
                continue
            total += _bytes(n / tp, bits(comp))
        for comp, n in lp.replicated.items():
            total += _bytes(n, bits(comp) if comp == "attention" else 8 * m.dtype_bytes)
        if lp.kv_proj:
            share = lp.kv_proj / tp if lp.kv_heads >= tp else lp.kv_proj / lp.kv_heads
            total += _bytes(share, bits("attention"))
    vocab = math.ceil(m.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    table = vocab * m.hidden_size / tp
    first, last = rank == 0, rank == pp - 1
    if first:
        total += _bytes(table, bits("embed"))
    if last:
        total += _bytes(m.hidden_size, 8 * m.dtype_bytes)
        if not m.tie_word_embeddings or not first:
            total += _bytes(table, bits("lm_head"))
    return math.ceil(total)
