"""Stored bits per weight from a checkpoint's ``quantization_config``.

A quantized checkpoint stores the linear layers of its decoder blocks in fewer bits plus
per-group or per-channel scales; embeddings, the LM head, norms and (in every MoE model vLLM
0.33.0 serves) the router stay in 16 bits, as do the modules a config lists as not converted.
The figure kept here is the average number of stored bits per quantized weight, scales and
zero points included, so that ``params * bits / 8`` is what the loader allocates.

Recognised ``quant_method`` values: ``gptq``, ``awq`` (4/8-bit integer, per group),
``compressed-tensors`` (int8/fp8 W8A8, W4A16, fp8 block), ``fp8`` (per tensor or block),
``mxfp4`` (4-bit E2M1 with one E8M0 scale per 32), ``bitsandbytes`` (4-bit NF4/FP4 or 8-bit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpressure.errors import InputError

# Parts of a decoder model, as ``weights.py`` counts them.
COMPONENTS = ("embed", "lm_head", "attention", "mlp", "experts", "shared_experts", "router",
              "norms")
QUANTIZABLE = ("attention", "mlp", "experts", "shared_experts")
"""What a quantized checkpoint converts unless told otherwise; the rest stays in 16 bits."""

_NAME_TO_COMPONENT = (
    # (substring of a module name or pattern, component); first match wins
    ("lm_head", "lm_head"),
    ("embed", "embed"),
    ("wte", "embed"),
    ("shared_expert", "shared_experts"),
    ("experts", "experts"),
    ("router", "router"),
    ("mlp.gate", "router"),
    ("block_sparse_moe.gate", "router"),
    ("self_attn", "attention"),
    ("attn", "attention"),
    ("mlp", "mlp"),
)


@dataclass(frozen=True)
class Quantization:
    method: str
    bits: float
    """Stored bits per quantized weight, scales and zero points included."""
    kept_16bit: frozenset[str] = field(default_factory=frozenset)
    """Components a checkpoint leaves in 16 bits although they are quantizable."""
    quantized_extra: frozenset[str] = field(default_factory=frozenset)
    """Components quantized although they usually are not (GPTQ ``lm_head: true``)."""
    description: str = ""

    def bits_for(self, component: str, dense_bits: float) -> float:
        """Bits one weight of ``component`` takes in this checkpoint."""
        if component in self.quantized_extra:
            return self.bits
        if component in QUANTIZABLE and component not in self.kept_16bit:
            return self.bits
        return dense_bits


def _components_named(names: Any) -> frozenset[str]:
    found = set()
    for name in names or ():
        text = str(name).lower().removeprefix("re:")
        for needle, component in _NAME_TO_COMPONENT:
            if needle in text:
                found.add(component)
                break
    return frozenset(found)


def _group_overhead_bits(bits: int, group_size: int, *, zero_point: bool) -> float:
    """A 16-bit scale (and a packed zero point) per group of ``group_size`` weights."""
    if group_size is None or group_size <= 0:
        return 0.0  # per output channel: one scale per row, negligible per weight
    return (16 + (bits if zero_point else 0)) / group_size


def parse_quantization(config: Mapping[str, Any] | None, where: str) -> Quantization | None:
    """The ``quantization_config`` of a Hugging Face ``config.json`` (``None``: not quantized).

    An unknown method or a malformed field raises ``InputError`` naming ``where``.
    """
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise InputError(f"{where}: field 'quantization_config': expected a mapping")
    method = str(config.get("quant_method", "")).lower().replace("_", "-")

    def number(key: str, default: Any) -> Any:
        value = config.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InputError(f"{where}: field 'quantization_config.{key}': expected a number, "
                             f"got {value!r}")
        return value

    skipped = _components_named(config.get("modules_to_not_convert"))
    skipped |= _components_named(config.get("ignored_layers"))
    skipped |= _components_named(config.get("ignore"))
    skipped |= _components_named(config.get("llm_int8_skip_modules"))
    if method in ("gptq", "awq", "gptq-marlin", "awq-marlin"):
        bits = int(number("bits", number("w_bit", 4)))
        group = int(number("group_size", number("q_group_size", 128)))
        zero = True  # GPTQ and AWQ checkpoints store packed zero points even when symmetric
        extra = frozenset({"lm_head"}) if config.get("lm_head") else frozenset()
        return Quantization(method, bits + _group_overhead_bits(bits, group, zero_point=zero),
                            skipped, extra, f"{method} int{bits}, group {group}")
    if method == "compressed-tensors":
        return _compressed_tensors(config, skipped, where)
    if method == "fp8":
        block = config.get("weight_block_size")
        overhead = 32 / (block[0] * block[1]) if block else 0.0  # one fp32 scale per block
        return Quantization("fp8", 8 + overhead, skipped,
                            description="fp8" + (f" block {block[0]}x{block[1]}" if block else ""))
    if method == "mxfp4":
        return Quantization("mxfp4", 4 + 8 / 32, skipped,
                            description="mxfp4 (E2M1, one E8M0 scale per 32)")
    if method == "bitsandbytes":
        if config.get("load_in_8bit"):
            return Quantization("bitsandbytes", 8.0, skipped, description="bitsandbytes int8")
        if config.get("load_in_4bit"):
            # one absmax per 64 weights: fp32, or 8-bit with a second-level fp32 per 256 blocks
            nested = config.get("bnb_4bit_use_double_quant", False)
            overhead = (8 + 32 / 256) / 64 if nested else 32 / 64
            kind = str(config.get("bnb_4bit_quant_type", "fp4"))
            return Quantization("bitsandbytes", 4 + overhead, skipped,
                                description=f"bitsandbytes 4-bit {kind}")
        raise InputError(f"{where}: field 'quantization_config': bitsandbytes without "
                         "load_in_4bit or load_in_8bit")
    raise InputError(
        f"{where}: field 'quantization_config.quant_method': {method!r} is not recognised; "
        "known: gptq, awq, compressed-tensors, fp8, mxfp4, bitsandbytes"
    )


def _compressed_tensors(config: Mapping[str, Any], skipped: frozenset[str],
                        where: str) -> Quantization:
    groups = config.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise InputError(f"{where}: field 'quantization_config.config_groups': expected a "
                         "non-empty mapping")
    # Checkpoints use one scheme for every linear layer in practice; the first group decides.
    scheme = next(iter(groups.values()))
    weights = scheme.get("weights") if isinstance(scheme, Mapping) else None
    if not isinstance(weights, Mapping) or not isinstance(weights.get("num_bits"), int):
        raise InputError(f"{where}: field 'quantization_config.config_groups': no "
                         "weights.num_bits in the first group")
    bits = weights["num_bits"]
    strategy = str(weights.get("strategy", "tensor"))
    kind = str(weights.get("type", "int"))
    overhead = 0.0
    if strategy == "group":
        overhead = _group_overhead_bits(bits, int(weights.get("group_size") or 128),
                                        zero_point=not weights.get("symmetric", True))
    elif strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        overhead = 32 / (block[0] * block[1])
    acts = scheme.get("input_activations") if isinstance(scheme, Mapping) else None
    a_bits = acts.get("num_bits") if isinstance(acts, Mapping) else 16
    return Quantization("compressed-tensors", bits + overhead, skipped,
                        description=f"compressed-tensors w{bits}a{a_bits} {kind} {strategy}")
