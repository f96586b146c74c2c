"""Hardware and model profiles: built-ins, Hugging Face configs, validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.profiles import (
    GB,
    GiB,
    ModelProfile,
    estimate_params,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
)

HF = Path(__file__).parent / "data" / "hf_config"


def test_builtin_lists_hold_the_required_profiles():
    assert {"ascend-910b-64g", "a100-80g", "h100-80g", "h200", "l40s", "mi300x", "a10g", "l4",
            "a100-40g", "rtx-4090", "rtx-3090", "h20", "b200", "mi325x"} <= set(list_hardware())
    assert {
        "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-32b",
        "mistral-7b-v0.3", "qwen3-235b-a22b", "deepseek-v3",
    } <= set(list_models())


def test_seed_card_units_are_converted_to_si():
    hw = load_hardware("ascend-910b-64g")
    assert hw.num_cards == 8
    assert hw.memory_bytes == 64 * GiB
    assert hw.hbm_bandwidth == 1600 * GB
    assert hw.peak_flops == pytest.approx(353.9e12)
    assert hw.peak_flops_total == pytest.approx(376e12)
    assert hw.link_bandwidth_aggregate == 392 * GB
    assert hw.link_bandwidth == 196 * GB
    assert hw.default_block_size == 128
    assert hw.alpha_c == pytest.approx(10e-6)
    assert hw.t0 == pytest.approx(4e-3)
    # eta_f * Cube peak reproduces the measured 328 TFLOPS matmul
    assert hw.eta_f * hw.peak_flops == pytest.approx(328e12, rel=0.01)


def test_allreduce_bandwidth_prefers_measurement_then_link():
    hw = load_hardware("ascend-910b-64g")
    assert hw.allreduce_bandwidth(2) == 18 * GB
    assert hw.allreduce_bandwidth(8) == 72 * GB
    assert hw.allreduce_bandwidth(6) == 30 * GB  # largest measured group not above 6
    h100 = load_hardware("h100-80g")
    assert h100.allreduce_bandwidth(8) == pytest.approx(0.65 * 450 * GB)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a100-80g", (2048, 256)),  # 80 GiB but an A100: kept on the small tier
        ("h100-80g", (8192, 1024)),
        ("h200", (8192, 1024)),  # 141 GiB < 160 GiB
        ("mi300x", (16384, 1024)),
        ("l40s", (2048, 256)),
        ("ascend-910b-64g", (2048, 256)),
    ],
)
def test_vllm_batch_default_tiers(name, expected):
    assert load_hardware(name).batch_defaults() == expected


def test_llm_class_context_has_larger_budgets():
    assert load_hardware("a100-80g").batch_defaults("llm_class") == (8192, 256)
    assert load_hardware("h100-80g").batch_defaults("llm_class") == (16384, 1024)


def _numeric_fields(data: dict) -> list[str]:
    return [k for k, v in data.items()
            if k not in ("num_cards",) and (isinstance(v, int | float | dict)
                                              and not isinstance(v, bool))
            and k not in ("sources", "references")]


@pytest.mark.parametrize("kind", ["hardware", "models"])
def test_every_builtin_number_has_a_source_and_every_tag_a_reference(kind):
    for path in sorted((data_dir() / kind).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        sources = data["sources"]
        for field in _numeric_fields(data):
            assert field in sources, f"{path.name}: no source for {field}"
        tags = set(re.findall(r"\[([SR]\d+)\]", " ".join(sources.values())))
        assert tags <= set(data.get("references", {})), f"{path.name}: {tags}"


def test_every_card_has_a_runtime_total_below_its_nameplate():
    """vLLM multiplies the runtime's total (torch.cuda.mem_get_info) by the utilization; the
    nameplate stays as its own field. Every built-in card gives the runtime figure."""
    for path in sorted((data_dir() / "hardware").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert "usable_memory_gib" in data or "usable_memory_gb" in data, path.name
        hw = load_hardware(path)
        assert hw.usable_memory_bytes < hw.memory_bytes, path.name
    assert load_hardware("l40s").usable_memory_bytes == round(44.4 * GiB)
    assert load_hardware("a100-80g").usable_memory_bytes == round(79.15 * GiB)
    assert load_hardware("ascend-910b-64g").usable_memory_bytes == 65_452_113_920  # 60.96 GiB


@pytest.mark.parametrize(
    ("name", "tier"),
    [("a10g", (2048, 256)), ("l4", (2048, 256)), ("a100-40g", (2048, 256)),
     ("rtx-4090", (2048, 256)), ("rtx-3090", (2048, 256)), ("h20", (8192, 1024)),
     ("b200", (16384, 1024)), ("mi325x", (16384, 1024))],
)
def test_new_cards_fall_in_vllms_batch_tiers(name, tier):
    assert load_hardware(name).batch_defaults() == tier


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [
        ("llama-3.1-8b", 131072),
        ("llama-3.1-70b", 327680),
        ("qwen2.5-7b", 57344),
        ("qwen2.5-72b", 327680),
        ("qwen3-32b", 262144),
        ("mistral-7b-v0.3", 131072),
        ("qwen3-235b-a22b", 192512),
        ("deepseek-v3", 70272),
    ],
)
def test_kv_bytes_per_token_whole_model(name, kv_bytes):
    assert load_model(name).kv_bytes_per_token(1) == kv_bytes


def test_llama_8b_kv_by_hand():
    m = load_model("llama-3.1-8b")
    # 2 (K and V) x 32 layers x 8 heads x 128 x 2 bytes
    assert m.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert [m.kv_bytes_per_token(tp) for tp in (1, 2, 4, 8)] == [
        128 * 1024, 64 * 1024, 32 * 1024, 16 * 1024
    ]


def test_kv_heads_replicate_when_fewer_than_tp():
    qwen7 = load_model("qwen2.5-7b")
    assert qwen7.kv_bytes_per_token(4) == 14 * 1024
    assert qwen7.kv_bytes_per_token(8) == qwen7.kv_bytes_per_token(4) == 14336
    moe = load_model("qwen3-235b-a22b")
    assert moe.kv_heads_per_rank(8) == 1
    assert moe.kv_bytes_per_token(8) == moe.kv_bytes_per_token(4) == 47 * 1024


def test_mla_latent_is_one_head_without_v_at_any_tp():
    ds = load_model("deepseek-v3")
    for tp in (1, 2, 4, 8, 16):
        assert ds.kv_bytes_per_token(tp) == 61 * (512 + 64) * 2 == 70272
    assert ds.kv_head_size() == (576, 0)


def test_weights_per_rank_and_moe_keeps_all_experts():
    qwen72 = load_model("qwen2.5-72b")
    # from the shapes: per layer q,o 2 x 8192^2, k,v 2 x 8192 x 1024, qkv biases 10,240,
    # MLP 3 x 8192 x 29568, norms 16,384; 80 layers + 2 x 152064 x 8192 tables + final norm
    layer = 2 * 8192**2 + 2 * 8192 * 1024 + 10_240 + 3 * 8192 * 29568 + 16_384
    assert qwen72.weight_bytes == 2 * 72_700_000_000  # the card's parameter count
    assert qwen72.weight_bytes_per_rank(1) == 2 * (80 * layer + 2 * 152064 * 8192 + 8192)
    # TP 8: linear layers and tables split 8 ways, norms replicated
    per_rank = 80 * (layer - 16_384) // 8 + 80 * 16_384 + 2 * 152064 * 8192 // 8 + 8192
    assert qwen72.weight_bytes_per_rank(8) == 2 * per_rank == 18_178_859_008
    moe = load_model("qwen3-235b-a22b")
    assert moe.weight_bytes == 470e9  # every expert resident
    assert moe.weight_bytes_per_rank(1) == pytest.approx(470e9, rel=0.01)  # from the shapes
    assert moe.active_params == 22e9
    assert moe.active_weight_bytes_per_rank(4) == pytest.approx(11e9)


@pytest.mark.parametrize(
    ("name", "published_total", "published_active"),
    [
        ("llama-3.1-8b", 8.03e9, 8.03e9),
        ("llama-3.1-70b", 70.6e9, 70.6e9),
        ("qwen2.5-7b", 7.62e9, 7.62e9),
        ("qwen3-32b", 32.8e9, 32.8e9),
        ("mistral-7b-v0.3", 7.25e9, 7.25e9),
        ("qwen3-235b-a22b", 235e9, 22e9),
        ("deepseek-v3", 671e9, 37e9),
    ],
)
def test_param_estimate_lands_near_the_model_card(name, published_total, published_active):
    total, active = estimate_params(load_model(name))
    assert total == pytest.approx(published_total, rel=0.02)
    assert active == pytest.approx(published_active, rel=0.03)


def test_llama_8b_param_formula_by_hand():
    # embeddings + LM head: 2 x 128256 x 4096; per layer: q,o 2 x 4096^2, k,v 2 x 4096 x 1024,
    # MLP 3 x 4096 x 14336, 2 norms of 4096; final norm 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    expected = 2 * 128256 * 4096 + 32 * layer + 4096
    total, _ = estimate_params(load_model("llama-3.1-8b"))
    assert total == expected == 8_030_261_248


def test_hf_config_llama():
    m = ModelProfile.from_hf_config(HF / "llama-3.1-8b.json")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (32, 4096, 32, 8, 128)
    assert m.name == "meta-llama/Llama-3.1-8B"
    assert m.num_params == 8_030_261_248
    assert m.kv_bytes_per_token() == 131072
    assert m.max_position_embeddings == 131072


def test_hf_config_defaults_head_dim_and_reads_dtype_key():
    m = load_model(HF / "mistral-7b-v0.3.json")
    assert m.head_dim == 4096 // 32
    assert m.dtype == "bfloat16"
    assert m.num_params == pytest.approx(7.25e9, rel=0.01)


def test_hf_config_qwen2_has_qkv_bias():
    m = load_model(str(HF / "qwen2.5-7b.json"))
    assert m.attention_bias
    assert m.num_params == pytest.approx(7.62e9, rel=0.005)


def test_hf_config_moe_and_mla():
    moe = load_model(HF / "qwen3-235b-a22b.json")
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 1536)
    assert moe.num_params == pytest.approx(235e9, rel=0.01)
    assert moe.num_active_params == pytest.approx(22e9, rel=0.02)
    ds = load_model(HF / "deepseek-v3.json")
    assert ds.use_mla and ds.num_dense_layers == 3 and ds.num_shared_experts == 1
    assert ds.head_dim == 192
    assert ds.weight_dtype_bytes == 1  # FP8 checkpoint
    assert ds.kv_bytes_per_token(8) == 70272
    assert ds.num_params == pytest.approx(671e9, rel=0.01)


def test_hf_config_missing_field_names_file_and_field():
    with pytest.raises(InputError, match=r"missing-layers\.json.*num_hidden_layers"):
        load_model(HF / "missing-layers.json")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _hardware_yaml(**changes) -> str:
    data = yaml.safe_load((data_dir() / "hardware" / "h100-80g.yaml").read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    return yaml.safe_dump(data, sort_keys=False)


def test_hardware_missing_field(tmp_path):
    p = _write(tmp_path, "card.yaml", _hardware_yaml(hbm_bandwidth_gb_s=None))
    with pytest.raises(InputError, match=r"card\.yaml.*'hbm_bandwidth_gb_s'"):
        load_hardware(p)


def test_hardware_negative_size_names_line(tmp_path):
    text = _hardware_yaml(memory_gib=-80)
    line = text.splitlines().index("memory_gib: -80") + 1
    p = _write(tmp_path, "card.yaml", text)
    with pytest.raises(InputError, match=rf"card\.yaml line {line}: field 'memory_gib': must be > 0"):
        load_hardware(p)


def test_hardware_wrong_type(tmp_path):
    p = _write(tmp_path, "card.yaml", _hardware_yaml(peak_flops_tflops="lots"))
    with pytest.raises(InputError, match=r"card\.yaml line \d+: field 'peak_flops_tflops'"):
        load_hardware(p)


def test_hardware_unknown_field_is_refused(tmp_path):
    p = _write(tmp_path, "card.yaml", _hardware_yaml(default_blocksize=32))
    with pytest.raises(InputError, match="default_blocksize.*unknown field"):
        load_hardware(p)


def test_hardware_eta_above_one_is_refused(tmp_path):
    p = _write(tmp_path, "card.yaml", _hardware_yaml(eta_m=1.5))
    with pytest.raises(InputError, match="'eta_m'"):
        load_hardware(p)


def test_model_yaml_errors(tmp_path):
    base = yaml.safe_load((data_dir() / "models" / "llama-3.1-8b.yaml").read_text())
    broken = dict(base, num_key_value_heads=0)
    p = _write(tmp_path, "m.yaml", yaml.safe_dump(broken, sort_keys=False))
    with pytest.raises(InputError, match=r"m\.yaml line \d+: field 'num_key_value_heads'"):
        load_model(p)
    missing = {k: v for k, v in base.items() if k != "vocab_size"}
    p = _write(tmp_path, "m2.yaml", yaml.safe_dump(missing, sort_keys=False))
    with pytest.raises(InputError, match=r"m2\.yaml.*'vocab_size'"):
        load_model(p)
    p = _write(tmp_path, "m3.yaml", "name: [unclosed\n")
    with pytest.raises(InputError, match=r"m3\.yaml line \d+: not valid YAML"):
        load_model(p)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(InputError, match="unknown profile 'b300'.*ascend-910b-64g.*h100-80g"):
        load_hardware("b300")
    with pytest.raises(InputError, match="unknown profile 'gpt-5'.*llama-3.1-8b"):
        load_model("gpt-5")


def test_tp_that_does_not_divide_heads_names_file_and_field():
    m = load_model("qwen2.5-7b")
    with pytest.raises(InputError, match=r"qwen2\.5-7b\.yaml: field 'num_attention_heads' \(28\)"):
        m.check_tp(8)
    m.check_tp(4)
    with pytest.raises(InputError, match="num_key_value_heads"):
        _kv_only_model().check_tp(6)


def _kv_only_model() -> ModelProfile:
    # 48 attention heads divide by 6, 4 KV heads neither divide nor are divided by 6
    return ModelProfile(
        name="toy", description="", num_hidden_layers=2, hidden_size=48 * 64,
        num_attention_heads=48, num_key_value_heads=4, head_dim=64, intermediate_size=1024,
        vocab_size=1000, num_params=1, num_active_params=1,
    )
