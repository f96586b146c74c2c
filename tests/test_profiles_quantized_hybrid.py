"""Quantized, MoE, hybrid-attention and MLA models against hand-worked bytes.

The config.json files under tests/data/hf_config/ are written from the public model cards'
configs (shapes, quantization_config, layer_types) of the models each test names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpressure.profiles import GiB, KVPoolError, load_model, size_kv_pool
from kvpressure.profiles.weights import pp_layers

HF = Path(__file__).parent / "data" / "hf_config"


def test_gptq_int4_7b_weights_and_kv():
    """Llama-2-7B GPTQ int4, group 128.

    Linear weights per layer: q, k, v, o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 =
    135,266,304; 32 layers: 6,476,005,376 weights at 4 bits + a 16-bit scale and a 4-bit zero
    per 128 = 4.15625 bits -> 3,364,487,168 B. fp16: embedding and LM head 2 x 32000 x 4096
    x 2 B = 524,288,000; norms 32 x 2 x 4096 x 2 + 4096 x 2 = 532,480. Total 3,889,307,648 B
    (3.62 GiB, not the 12.6 GiB of 2-byte weights). KV per token: 2 x 32 x 32 x 128 x 2 B =
    524,288.
    """
    m = load_model(HF / "llama-2-7b-gptq-int4.json")
    assert m.quantization.method == "gptq"
    assert m.quantization.bits == 4 + 20 / 128
    assert m.weight_bytes == 3_364_487_168 + 524_288_000 + 532_480 == 3_889_307_648
    assert m.kv_bytes_per_token() == 524_288


def test_w8a8_70b_is_one_byte_per_linear_weight_and_fits_at_tp2():
    """Llama-3.1-70B compressed-tensors w8a8 int8 per channel, lm_head ignored.

    Linear per layer: 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 = 855,638,016; x 80 =
    68,451,041,280 B at 1 byte. bf16: embedding 128256 x 8192 x 2 = 2,101,346,304, the LM head
    the same, norms 80 x 2 x 8192 x 2 + 8192 x 2 = 2,637,824. Total 72,656,371,712 B = 67.67
    GiB (not 131 GiB). At TP 2 a rank holds half of every linear layer and table and all
    norms: 34,225,520,640 + 2,101,346,304 + 2,637,824 = 36,329,504,768 B.
    """
    m = load_model(HF / "llama-3.1-70b-w8a8.json")
    assert m.weight_bytes == 72_656_371_712
    assert m.weight_bytes_per_rank(2) == 36_329_504_768
    s = size_kv_pool("h100-80g", m, tp=2, max_model_len=8192)
    assert s.num_gpu_blocks > 0 and s.weights_bytes == 36_329_504_768
    assert m.kv_bytes_per_token(2) == 80 * 4 * 256 * 2


def test_mxfp4_moe_gpt_oss_20b_shapes():
    """gpt-oss-20b: 24 layers alternating 128-token sliding and full attention, 32 experts.

    Experts (mxfp4, 4 + 8/32 = 4.25 bits), padded as CUDA's MXFP4 MoE kernels need: hidden
    2880 -> 3072 (multiple of 256), expert width 2880 -> 2944 (128): 24 x 32 x 3 x 3072 x 2944
    = 20,837,302,272 weights -> 11,069,816,832 B. Kept in bf16 by modules_to_not_convert:
    attention 24 x (2 x 2880 x 4096 + 2 x 2880 x 512 + 4096 + 1024 biases) = 637,132,800
    weights, routers 24 x 2880 x 32 = 2,211,840, norms 24 x 2 x 2880 + 2880 = 141,120;
    embedding and LM head 2 x 201088 x 2880 = 1,158,266,880; at 2 B: 3,595,505,280 B.
    Total 14,665,322,112 B (13.66 GiB). At TP 2 the experts are 32 x 3 x 3072 x 1536 (1440
    rounded up to 128): 7.06 GiB a rank, where vLLM 0.19.0 logged 7.01 GiB on an H100.
    KV per token per layer: 8 heads x (64 + 64) x 2 B = 2048; 49,152 over 24 layers.
    """
    m = load_model(HF / "gpt-oss-20b.json")
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (32, 4, 2880)
    assert m.layer_types.count("sliding_attention") == 12 and m.sliding_window == 128
    assert m.weight_bytes == 11_069_816_832 + 3_595_505_280 == 14_665_322_112
    assert m.weight_bytes_per_rank(2) / GiB == pytest.approx(7.01, rel=0.01)
    assert m.kv_bytes_per_token() == 49_152


def test_gpt_oss_pool_groups_sliding_and_full_layers_like_vllm():
    """Two groups of 12 layers with one 2048 B/token page each: a block is 12 x 16 x 2048 =
    393,216 B, half of treating all 24 layers as full attention (786,432 B), so twice the
    blocks. At max_model_len 8192, 2048 batched tokens, synchronous scheduling: a request
    needs cdiv(8192, 16) = 512 full blocks + cdiv(127 + 2048, 16) + 1 = 137 sliding ones."""
    budget = 40 * GiB
    s = size_kv_pool("h100-80g", HF / "gpt-oss-20b.json", max_model_len=8192,
                     max_num_batched_tokens=2048, async_scheduling=False,
                     kv_cache_memory_bytes=budget)
    assert s.block_bytes == 393_216
    assert s.num_gpu_blocks == budget // 393_216 == 109_226
    assert [g["kind"] for g in s.kv_groups] == ["sliding", "full"]
    assert [g["num_layers"] for g in s.kv_groups] == [12, 12]
    assert s.blocks_per_max_len_request == 512 + 137
    assert s.kv_cache_size_tokens == int(109_226 / 649 * 8192)
    # asynchronous scheduling (0.33.0's default) keeps two batches in flight
    a = size_kv_pool("h100-80g", HF / "gpt-oss-20b.json", max_model_len=8192,
                     max_num_batched_tokens=2048, kv_cache_memory_bytes=budget)
    assert a.blocks_per_max_len_request == 512 + (-(-(127 + 4096) // 16) + 1)


def test_mixtral_counts_every_expert():
    """Mixtral-8x7B (num_local_experts 8, experts of intermediate_size 14336, top 2).

    Per layer: experts 8 x 3 x 4096 x 14336 = 1,409,286,144; attention 2 x 4096^2 + 2 x 4096 x
    1024 = 41,943,040; router 4096 x 8 = 32,768; norms 8192. 32 layers + embedding and LM head
    2 x 32000 x 4096 + final norm 4096: 46,702,792,704 weights (the card's 46.7B), 93.4 GB in
    bf16. Active: minus 32 x 6 unused experts x 3 x 4096 x 14336 = 12,879,925,248 (12.9B).
    """
    m = load_model(HF / "mixtral-8x7b.json")
    assert m.num_params == 46_702_792_704
    assert m.num_active_params == 12_879_925_248
    assert m.weight_bytes == 2 * 46_702_792_704
    assert m.layer_types == ()  # sliding_window null: all full attention


def test_sliding_window_hybrid_gemma3_pattern():
    """Gemma-3-12B text: 48 layers, every 6th full, the rest sliding over 1024 tokens; 8 KV
    heads of 256 -> 8 x 512 x 2 = 8192 B per token per layer, a 16-token page 131,072 B.
    40 sliding + 8 full layers: groups of 8 (40 >= 1.5 x 8), 5 sliding groups + 1 full group,
    a block = 8 pages = 1,048,576 B (a sixth of 48 full layers). A request of 8192 tokens,
    2048 batched, sync: 512 full blocks + 5 x (cdiv(1023 + 2048, 16) + 1 = 193) = 1477."""
    m = load_model(HF / "gemma-3-12b-text.json")
    assert [i for i, t in enumerate(m.layer_types) if t == "full_attention"] == list(
        range(5, 48, 6))
    s = size_kv_pool("h100-80g", m, max_model_len=8192, max_num_batched_tokens=2048,
                     async_scheduling=False, kv_cache_memory_bytes=16 * GiB)
    assert s.block_bytes == 1_048_576
    assert len(s.kv_groups) == 6
    assert s.blocks_per_max_len_request == 512 + 5 * 193 == 1477
    assert s.num_gpu_blocks == 16 * 1024


def test_mla_at_tp8_pp2_the_larger_stage_decides():
    """DeepSeek-V3 (61 MLA layers) at TP 8 x PP 2: vLLM's get_pp_indices gives 31 + 30 layers
    (the remainder goes to the stage before the last). MLA keeps one 576-wide latent per
    rank: 1152 B per token per layer at any TP. Stage 0 blocks are 31 x 16 x 1152 = 571,392
    B, stage 1's 30 x 18,432 = 552,960 B; with 20 GiB for KV on every rank stage 0 has
    fewer blocks (37,583 vs 38,836) and decides the pool."""
    assert pp_layers(61, 2, 0) == range(0, 31) and pp_layers(61, 2, 1) == range(31, 61)
    s = size_kv_pool("h200", HF / "deepseek-v3.json", tp=8, pp=2, max_model_len=8192,
                     kv_cache_memory_bytes=20 * GiB)
    assert [x["block_bytes"] for x in s.stages] == [571_392, 552_960]
    assert s.deciding_stage == 0
    assert s.num_gpu_blocks == 20 * GiB // 571_392 == 37_583
    assert s.kv_bytes_per_token == 31 * 1152
    # every weight is on some stage: the stages together exceed one TP-1/PP-1 copy / 8
    m = load_model(HF / "deepseek-v3.json")
    stage_bytes = [m.weight_bytes_per_rank(8, 2, r) for r in (0, 1)]
    assert sum(stage_bytes) >= m.weight_bytes / 8
    full = size_kv_pool("h200", m, tp=8, pp=2, max_model_len=8192)
    assert full.weights_bytes == stage_bytes[full.deciding_stage]


def test_budget_at_or_below_zero_is_vllms_refusal_not_an_input_error():
    s = size_kv_pool("l40s", "llama-3.1-8b", gpu_memory_utilization=0.36, max_model_len=4096)
    assert s.num_gpu_blocks == 0 and s.kv_pool_bytes == 0
    assert "No available memory for the cache blocks" in s.refusal
    assert all(r["bytes"] >= 0 for r in s.memory_breakdown())


def test_kv_budget_larger_than_the_card_is_warned_and_nothing_is_negative():
    s = size_kv_pool("l4", "llama-3.1-8b", max_model_len=4096, kv_cache_memory_bytes=40 * GiB)
    assert s.warnings and "more than the card" in s.warnings[0]
    rows = {r["component"]: r["bytes"] for r in s.memory_breakdown()}
    assert rows["left unused in the request"] == 0


def test_unknown_quant_method_names_the_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text((HF / "mixtral-8x7b.json").read_text().replace(
        '"torch_dtype"', '"quantization_config": {"quant_method": "magic"}, "torch_dtype"'))
    with pytest.raises(Exception, match="quantization_config.quant_method"):
        load_model(p)


def test_pp_larger_than_layers_is_refused():
    with pytest.raises(KVPoolError.__mro__[1], match="pipeline_parallel_size"):
        size_kv_pool("h100-80g", "llama-3.1-8b", pp=64, max_model_len=4096)


def test_shared_expert_and_router_of_qwen_moe():
    """Qwen1.5-MoE-A2.7B: 60 experts of 1408, top 4, one shared expert of 5632 with its
    sigmoid gate. Per layer: attention 4 x 2048^2 + 3 x 2048 biases = 16,783,360; experts
    60 x 3 x 2048 x 1408 = 519,045,120; shared expert 3 x 2048 x 5632 = 34,603,008 + gate
    2048; router 2048 x 60 = 122,880; norms 4096: 570,560,512. 24 layers + embedding and LM
    head 2 x 151936 x 2048 + final norm 2048 = 14,315,784,192 (the card's 14.3B); active: minus
    24 x 56 idle experts x 8,650,752 = 2,689,173,504 (2.7B). vLLM 0.19.0 loaded 26.67 GiB."""
    m = load_model(HF / "qwen1.5-moe-a2.7b.json")
    assert m.num_params == 24 * 570_560_512 + 2 * 151936 * 2048 + 2048 == 14_315_784_192
    assert m.num_active_params == 14_315_784_192 - 24 * 56 * 3 * 2048 * 1408 == 2_689_173_504
    assert m.weight_bytes_per_rank(1) / GiB == pytest.approx(26.67, abs=0.01)


def test_per_layer_head_widths_unify_pages_by_block_size():
    """Full layers with their own head width (Gemma-style ``global_head_dim`` and
    ``num_global_key_value_heads``): 6 sliding layers with 8 KV heads of 256 (8192 B per token,
    a 16-token page of 131,072 B) and 2 full layers with 2 heads of 512 (4096 B per token,
    65,536 B per page). vLLM unifies pages by giving the smaller page a larger block: the full
    layers get blocks of 32 tokens, 131,072 B. Groups of 2 layers (the fewest of a type):
    3 sliding groups + 1 full group; a block is 2 x 131,072 = 262,144 B."""
    config = {
        "model_type": "gemma3_text", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
        "vocab_size": 32000, "sliding_window": 512, "max_position_embeddings": 8192,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"]
        + ["sliding_attention"] * 3 + ["full_attention"],
        "torch_dtype": "bfloat16",
    }
    from kvpressure.profiles import ModelProfile
    from kvpressure.profiles.fields import FieldReader
    from kvpressure.profiles.model import _build

    m = _build(FieldReader(config, "<config>"), hf=True, name="toy")
    assert m.kv_bytes_per_token_of_layer(0) == 8192 and m.kv_bytes_per_token_of_layer(3) == 4096
    s = size_kv_pool("h100-80g", m, max_model_len=4096, max_num_batched_tokens=2048,
                     async_scheduling=False, kv_cache_memory_bytes=GiB)
    assert sorted({(g["kind"], g["block_size"]) for g in s.kv_groups}) == [
        ("full", 32), ("sliding", 16)]
    assert len(s.kv_groups) == 4
    assert s.block_bytes == 262_144
    assert s.num_gpu_blocks == GiB // 262_144
    # a request of 4096 tokens: 4096 / 32 = 128 full blocks, 3 x (cdiv(511 + 2048, 16) + 1)
    assert s.blocks_per_max_len_request == 128 + 3 * (160 + 1)
    assert isinstance(m, ModelProfile)


@pytest.mark.parametrize(
    ("config", "bits"),
    [
        # 4-bit weights + a 16-bit scale and a packed 4-bit zero point per 128
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 4 + 20 / 128),
        # NF4: one 8-bit absmax per 64, itself scaled by an fp32 per 256 blocks
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
          "bnb_4bit_use_double_quant": True}, 4 + (8 + 32 / 256) / 64),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4 + 32 / 64),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 8),
        # fp8 with one fp32 scale per 128 x 128 block (DeepSeek-V3, Qwen3-FP8)
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 8 + 32 / (128 * 128)),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
            "symmetric": True}}}}, 4 + 16 / 128),
    ],
)
def test_stored_bits_per_weight(config, bits):
    from kvpressure.profiles.quantization import parse_quantization

    q = parse_quantization(config, "config.json")
    assert q.bits == pytest.approx(bits)
    # norms, routers, embeddings and the LM head stay at the model's 16 bits
    for component in ("norms", "router", "embed", "lm_head"):
        assert q.bits_for(component, 16) == 16
    assert q.bits_for("experts", 16) == pytest.approx(bits)


def test_modules_not_converted_and_a_quantized_lm_head():
    from kvpressure.profiles.quantization import parse_quantization

    q = parse_quantization({"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router"]}, "config.json")
    assert q.bits_for("attention", 16) == 16 and q.bits_for("experts", 16) == 4.25
    g = parse_quantization({"quant_method": "gptq", "bits": 4, "group_size": 128,
                            "lm_head": True}, "config.json")
    assert g.bits_for("lm_head", 16) == g.bits == 4 + 20 / 128
