"""KV-pool sizing against hand-worked numbers (vLLM 0.33.0 startup steps K1-K7, see kvpool.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvpressure.errors import InputError
from kvpressure.profiles import (
    GiB,
    KVPoolError,
    MiB,
    estimate_activation,
    load_model,
    safe_concurrency,
    size_kv_pool,
)

LLAMA8 = "llama-3.1-8b"


def test_k7_worked_example_is_exact_with_measured_components():
    # 140 GiB card, util 0.92, weights 15 GiB, other 1 GiB, activation 2 GiB, graphs 0.5 GiB
    s = size_kv_pool(
        "h100-80g", LLAMA8, tp=1, block_size=16, max_model_len=8192,
        total_memory_bytes=140 * GiB, weights_bytes=15 * GiB, non_torch_bytes=1 * GiB,
        activation_bytes=2 * GiB, cudagraph_bytes=GiB // 2,
    )
    assert s.requested_bytes == math.ceil(140 * GiB * 0.92)
    assert s.page_size_bytes == 16 * 8 * (128 + 128) * 2 == 64 * 1024
    assert s.block_bytes == 2 * MiB
    assert s.num_gpu_blocks == 56_473
    assert s.kv_cache_size_tokens == pytest.approx(903_000, rel=0.001)
    assert s.estimated == ()


def test_tp2_halves_block_bytes_per_rank():
    s = size_kv_pool("h100-80g", LLAMA8, tp=2, block_size=16, max_model_len=8192)
    assert s.kv_heads_per_rank == 4
    assert s.block_bytes == 1 * MiB


def test_pool_is_block_by_block_from_the_budget():
    s = size_kv_pool("ascend-910b-64g", "llama-3.1-70b", tp=8, max_model_len=8192)
    assert s.block_size == 128  # vllm-ascend default
    assert s.kv_bytes_per_token == 40 * 1024
    assert s.block_bytes == 128 * 40 * 1024
    # the runtime total of a 64 GB 910B (60.96 GiB), not the nameplate, is what vLLM scales
    assert s.total_memory_bytes == 65_452_113_920 and s.nameplate_memory_bytes == 64 * GiB
    # vllm-ascend's worker keeps no graph-pool estimate out of the budget
    assert s.cudagraph_bytes == 0 and "cudagraph" not in s.estimated
    expected_available = (
        math.ceil(65_452_113_920 * 0.92) - s.weights_bytes - s.non_torch_bytes
        - s.activation_peak_bytes
    )
    assert s.available_kv_bytes == expected_available
    assert s.num_gpu_blocks == expected_available // s.block_bytes
    # per rank at TP 8, bf16: linear layers 80 x (2 x 8192^2 + 2 x 8192 x 1024
    # + 3 x 8192 x 28672) / 8 = 8,556,380,160 weights; embedding and LM head 2 x 128256 x 8192
    # / 8 = 262,668,288; norms (replicated) 80 x 2 x 8192 + 8192 = 1,318,912
    assert s.weights_bytes == 2 * (8_556_380_160 + 262_668_288 + 1_318_912) == 17_640_734_720
    assert s.usable_tokens == (s.num_gpu_blocks - 1) * 128
    assert s.num_gpu_blocks > 0


def test_activation_estimate_by_hand():
    m = load_model(LLAMA8)
    fwd, sampler = estimate_activation(m, 1, 8192, 1024)
    assert fwd == 8192 * (4096 + 2 * 14336) * 2 == GiB // 2
    assert sampler == 1024 * 128256 * 4 * 3
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=8192)
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (8192, 1024)
    # hidden states stay alive while the sampler runs: the peak is the sum (1.97 GiB; vLLM
    # 0.19.0 measured 1.89 GiB for this model on an H100)
    assert s.activation_peak_bytes == fwd + sampler
    assert s.activation_peak_bytes / GiB == pytest.approx(1.89, rel=0.05)
    # non-torch 0.25 GiB alone, ~2.1 GiB with a TP group; graphs 0.2 GiB + 20 MiB a layer
    assert s.non_torch_bytes == 256 * MiB
    assert s.cudagraph_bytes == 200 * MiB + 32 * 20 * MiB
    assert size_kv_pool("h100-80g", LLAMA8, tp=2, max_model_len=8192).non_torch_bytes == 2150 * MiB


def test_h100_llama8b_lands_on_the_spec_magnitude():
    # by hand: 72.9 GiB requested - 15 weights - ~2.5 other = ~55 GiB of KV -> ~28k blocks of 16
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=8192)
    assert 27_000 <= s.num_gpu_blocks <= 29_000


def _tiny_pool(**kw):
    # available = 10 blocks of 2 MiB + 1 MiB; check = available - 1 block = 19 MiB
    return size_kv_pool("h100-80g", LLAMA8, block_size=16,
                        kv_cache_memory_bytes=21 * MiB, **kw)


def test_max_model_len_check_holds_back_the_null_block():
    s = _tiny_pool(max_model_len=144)  # cdiv(144, 16) = 9 blocks = 18 MiB <= 19 MiB
    assert s.num_gpu_blocks == 10
    assert s.blocks_per_max_len_request == 9
    assert s.max_concurrency == pytest.approx(10 / 9)
    assert s.kv_cache_size_tokens == int(10 / 9 * 144) == 160
    with pytest.raises(KVPoolError, match="largest max_model_len that fits is 144") as exc:
        _tiny_pool(max_model_len=145)  # 10 blocks = 20 MiB > 19 MiB
    assert exc.value.largest_fitting_len == 144
    assert isinstance(exc.value, InputError)


def test_auto_max_model_len_shrinks_to_what_fits():
    s = _tiny_pool(max_model_len=-1)
    assert s.max_model_len == 144


def test_weights_that_do_not_fit_are_a_clear_error():
    with pytest.raises(KVPoolError, match="weights need 79.06 GiB per rank"):
        size_kv_pool("ascend-910b-64g", "deepseek-v3", tp=8)


def test_no_memory_left_for_kv_is_vllms_refusal():
    # L40S 44.4 GiB x 0.36 = 15.98 GiB < 14.96 weights + 0.5 non-torch + 0.5 graphs + ~0.25
    # activation: 0 blocks and vLLM's message, not an input error
    s = size_kv_pool("l40s", LLAMA8, gpu_memory_utilization=0.36, max_model_len=4096)
    assert s.num_gpu_blocks == 0 and s.available_kv_bytes < 0
    assert "No available memory for the cache blocks" in s.refusal
    # x 0.33 = 14.65 GiB does not even hold the weights: that is still an error
    with pytest.raises(KVPoolError, match="weights need 14.96 GiB"):
        size_kv_pool("l40s", LLAMA8, gpu_memory_utilization=0.33, max_model_len=4096)


def test_overrides():
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=4096, num_gpu_blocks_override=1000)
    assert s.num_gpu_blocks == 1000
    assert s.num_gpu_blocks_computed > 1000
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=4096, kv_cache_memory_bytes=4 * GiB,
                     gpu_memory_utilization=0.1)
    assert s.num_gpu_blocks == 4 * GiB // (2 * MiB)


def test_fp8_kv_cache_doubles_the_blocks():
    bf16 = size_kv_pool("h100-80g", LLAMA8, max_model_len=4096, kv_cache_memory_bytes=8 * GiB)
    fp8 = size_kv_pool("h100-80g", LLAMA8, max_model_len=4096, kv_cache_memory_bytes=8 * GiB,
                       kv_cache_dtype_bytes=1)
    assert fp8.num_gpu_blocks == 2 * bf16.num_gpu_blocks


def test_higher_utilization_gives_more_blocks():
    lo = size_kv_pool("ascend-910b-64g", "qwen2.5-72b", tp=8, gpu_memory_utilization=0.85,
                      max_model_len=8192)
    hi = size_kv_pool("ascend-910b-64g", "qwen2.5-72b", tp=8, gpu_memory_utilization=0.95,
                      max_model_len=8192)
    total = 65_452_113_920
    gained = math.ceil(total * 0.95) - math.ceil(total * 0.85)
    assert hi.num_gpu_blocks - lo.num_gpu_blocks in (
        gained // hi.block_bytes, gained // hi.block_bytes + 1
    )


def test_batch_defaults_are_capped_and_checked():
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=4)
    assert s.max_num_batched_tokens == 1024 * 4  # capped at max_num_seqs x max_model_len
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=32768, enable_chunked_prefill=False)
    assert s.max_num_batched_tokens == 32768
    s = size_kv_pool("h100-80g", LLAMA8, max_model_len=8192, max_num_batched_tokens=512)
    assert s.max_num_seqs == 512  # the default 1024 is cut to the token budget
    with pytest.raises(InputError, match=r"max_num_batched_tokens \(128\) must be >= max_num_seqs"):
        size_kv_pool("h100-80g", LLAMA8, max_model_len=8192, max_num_batched_tokens=128,
                     max_num_seqs=256)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"block_size": 0}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"tp": 16}, "exceeds the 8 cards"),
        ({"tp": 3}, "num_attention_heads"),
        ({"kv_cache_dtype_bytes": 3}, "kv_cache_dtype_bytes"),
    ],
)
def test_bad_parameters_name_the_parameter(kwargs, pattern):
    with pytest.raises(InputError, match=pattern):
        size_kv_pool("h100-80g", LLAMA8, **{"max_model_len": 4096, **kwargs})


def test_qwen25_7b_cannot_run_at_tp8():
    with pytest.raises(InputError, match=r"qwen2\.5-7b\.yaml: field 'num_attention_heads'"):
        size_kv_pool("ascend-910b-64g", "qwen2.5-7b", tp=8)


def test_safe_concurrency_by_hand():
    s = size_kv_pool("h100-80g", LLAMA8, block_size=16, max_model_len=4096,
                     num_gpu_blocks_override=1001)
    assert safe_concurrency(s, 100) == 1000 // 7 == 142  # cdiv(100, 16) = 7 blocks each
    assert safe_concurrency(s, 100, half_filled_tail=True) == math.floor(1000 / 6.75) == 148
    assert safe_concurrency(s, 16) == 1000
    assert safe_concurrency(s, 17) == 500
    lengths = [256, 512, 1024, 2048, 4096]
    values = [s.safe_concurrency(n) for n in lengths]
    assert values == sorted(values, reverse=True)
    with pytest.raises(InputError, match="avg_seq_len"):
        safe_concurrency(s, 0)


def test_to_dict_carries_every_intermediate():
    s = size_kv_pool("ascend-910b-64g", "llama-3.1-70b", tp=8, max_model_len=8192)
    d = s.to_dict()
    for key in ("requested_bytes", "weights_bytes", "non_torch_bytes", "activation_peak_bytes",
                "activation_forward_bytes", "activation_sampler_bytes", "cudagraph_bytes",
                "available_kv_bytes", "block_bytes", "num_gpu_blocks", "kv_cache_size_tokens",
                "max_concurrency"):
        assert key in d
    rows = {r["component"]: r["bytes"] for r in s.memory_breakdown()}
    parts = (rows["weights"] + rows["non-torch (runtime, collectives)"] + rows["activation peak"]
             + rows["graph capture"] + rows["KV pool (num_gpu_blocks x block)"]
             + rows["left unused in the request"])
    assert parts == s.requested_bytes
    assert 0 <= rows["left unused in the request"] < s.block_bytes


def test_seed_case_pool_by_hand():
    """data/experiments/seed_case.yaml: Llama-3.1-70B, TP 8, 910B at utilization 0.9,
    max_model_len 32768, 2048 batched tokens, 256 sequences, blocks of 128.

    requested   ceil(65,452,113,920 x 0.9)                       = 58,906,902,528
    weights     2 x (8,556,380,160 + 262,668,288 + 1,318,912)    = 17,640,734,720
    non-torch   2150 MiB (a TP group's collective buffers)       =  2,254,438,400
    activation  2048 x (8192 + 2 x 28672 / 8) x 2 = 62,914,560
                + 256 x 128256 x 4 x 3 = 394,002,432             =    456,916,992
    graphs      none (vllm-ascend)                               =              0
    available                                                    = 38,554,812,416
    block       80 layers x 128 x 1 KV head x 256 x 2 B          =      5,242,880
    num_gpu_blocks = 38,554,812,416 // 5,242,880 = 7,353 (941,184 tokens; 7,995 with the
    nameplate 64 GiB and the earlier estimates)
    """
    from kvpressure.simulation.experiment import load_experiment

    exp = load_experiment(Path(__file__).parents[1] / "data" / "experiments" / "seed_case.yaml")
    s = exp.pool()
    assert s.available_kv_bytes == 58_906_902_528 - 17_640_734_720 - 2_254_438_400 - 456_916_992
    assert s.block_bytes == 5_242_880
    assert exp.settings()["num_gpu_blocks"] == s.num_gpu_blocks == 7_353
    assert s.kv_cache_size_tokens == 7_353 * 128


def test_capacity_notebook_grid_is_monotone():
    """notebooks/00_capacity.ipynb's defaults: fewer sequences fit as they grow longer, more
    blocks as the utilization rises, and the pool's bytes add up."""
    from kvpressure.profiles import load_hardware, safe_concurrency_grid

    hw, mdl = load_hardware("ascend-910b-64g"), load_model("llama-3.1-70b")
    sizing = size_kv_pool(hw, mdl, tp=8, pp=1, gpu_memory_utilization=0.92,
                          max_model_len=8192)
    assert sizing.num_gpu_blocks > 0 and sizing.available_kv_bytes > 0
    assert len(sizing.kv_groups) == 1
    assert sizing.block_bytes == sizing.kv_bytes_per_token * sizing.block_size
    assert all(row["bytes"] >= 0 for row in sizing.memory_breakdown())
    lengths, utils = [256, 512, 1024, 2048, 4096, 8192], [0.85, 0.90, 0.92, 0.95]
    grid = safe_concurrency_grid(hw, mdl, lengths, utils, tp=8, max_model_len=8192)
    for util in utils:
        fits = [r["safe_concurrency"] for r in sorted(
            (r for r in grid if r["gpu_memory_utilization"] == util),
            key=lambda r: r["avg_seq_len"])]
        assert fits == sorted(fits, reverse=True) and fits[0] > fits[-1], (util, fits)
    blocks = [next(r["num_gpu_blocks"] for r in grid if r["gpu_memory_utilization"] == u)
              for u in utils]
    assert blocks == sorted(blocks) and blocks[0] < blocks[-1], blocks
