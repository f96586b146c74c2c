"""Model profiles: the shapes that decide weight bytes, KV bytes per token and step cost.

Field names follow Hugging Face ``config.json`` (``num_hidden_layers``, ``hidden_size``, ...), so
a profile YAML reads like a trimmed config; short aliases (``layers``, ``hidden``, ``heads``,
``kv_heads``) are properties. Parameter counts in YAML are in billions (``params_billion``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.profiles.fields import (
    FieldReader,
    load_sources,
    read_json,
    read_yaml_with_lines,
)
from kvpressure.profiles.quantization import Quantization, parse_quantization

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


YAML_FIELDS = {
    "name", "description", "hf_repo", "model_type", "num_hidden_layers", "hidden_size",
    "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
    "params_billion", "active_params_billion", "dtype", "weight_dtype",
    "max_position_embeddings", "tie_word_embeddings", "attention_bias", "num_experts",
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
    "first_k_dense_replace", "use_mla", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "q_lora_rank", "num_local_experts", "shared_expert_intermediate_size",
    "layer_types", "sliding_window", "sliding_window_pattern", "global_head_dim",
    "num_global_key_value_heads", "quantization_config", "sources", "references",
}

FULL, SLIDING = "full_attention", "sliding_attention"
VOCAB_PADDING = 64
"""vLLM pads the vocabulary of its embedding and LM head to a multiple of 64 before the TP
split (``DEFAULT_VOCAB_PADDING_SIZE``)."""


def dtype_bytes(name: str, where: str = "dtype") -> int:
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise InputError(f"{where}: unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelProfile:
    name: str
    description: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    """Dense MLP width (the dense layers of a MoE model use it too)."""
    vocab_size: int
    num_params: int
    num_active_params: int
    dtype: str = "bfloat16"
    """Activation / KV dtype (vLLM's ``kv_cache_dtype=auto`` follows it)."""
    weight_dtype: str = "bfloat16"
    """Dtype of the served weights (an FP8 checkpoint stores 1 byte per parameter)."""
    max_position_embeddings: int | None = None
    hf_repo: str | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    """Leading layers with a dense MLP in a MoE model (DeepSeek's ``first_k_dense_replace``)."""
    # multi-head latent attention
    use_mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    shared_expert_intermediate_size: int = 0
    """Width of the one shared expert of Qwen-MoE-style models (0: none or DeepSeek-style)."""
    # attention layout
    layer_types: tuple[str, ...] = ()
    """Per layer ``full_attention`` or ``sliding_attention``; empty: all full."""
    sliding_window: int | None = None
    global_head_dim: int = 0
    """Head width of the full-attention layers when it differs from the sliding ones."""
    num_global_key_value_heads: int = 0
    quantization: Quantization | None = None
    sources: dict[str, str] = field(default_factory=dict)
    path: str | None = None

    # --- aliases ------------------------------------------------------------------------------
    @property
    def layers(self) -> int:
        return self.num_hidden_layers

    @property
    def hidden(self) -> int:
        return self.hidden_size

    @property
    def heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def params(self) -> int:
        return self.num_params

    @property
    def active_params(self) -> int:
        return self.num_active_params

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def weight_dtype_bytes(self) -> int:
        return dtype_bytes(self.weight_dtype)

    # --- memory -------------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        """All stored weights, whole model (MoE: every expert is resident): the parameter
        count at ``weight_dtype``, or, for a quantized checkpoint, each part at its stored bits.
        What one rank loads is ``weight_bytes_per_rank``."""
        if self.quantization is None:
            return self.num_params * self.weight_dtype_bytes
        return self.weight_bytes_per_rank(1)

    def weight_bytes_per_rank(self, tp: int = 1, pp: int = 1, pp_rank: int | None = None) -> int:
        """Weights one rank holds (``weights.py``): linear layers split ``tp`` ways, norms and
        routers replicated, the pipeline stage's layers only. ``pp_rank`` None: the largest
        stage."""
        from kvpressure.profiles.weights import stage_weight_bytes

        _check_tp_value(tp)
        if pp_rank is None:
            return max(stage_weight_bytes(self, tp, pp, r) for r in range(pp))
        return stage_weight_bytes(self, tp, pp, pp_rank)

    def active_weight_bytes_per_rank(self, tp: int = 1) -> int:
        """Weights a decode step touches per rank when few experts are hit (dense: all)."""
        _check_tp_value(tp)
        if self.quantization is None or not self.num_params:
            return math.ceil(self.num_active_params * self.weight_dtype_bytes / tp)
        return math.ceil(self.weight_bytes * self.num_active_params / self.num_params / tp)

    def kv_heads_per_rank(self, tp: int = 1, *, full_layer: bool = False) -> int:
        """vLLM's ``get_num_kv_heads``: MLA keeps one latent head on every rank; otherwise KV
        heads are split and, when fewer than ``tp``, replicated (at least one per rank).

        A pure formula, like vLLM's: whether ``tp`` is allowed at all is ``check_tp``'s job."""
        _check_tp_value(tp)
        if self.use_mla:
            return 1
        heads = self.num_key_value_heads
        if full_layer and self.num_global_key_value_heads:
            heads = self.num_global_key_value_heads
        return max(1, heads // tp)

    def kv_head_size(self, *, full_layer: bool = False) -> tuple[int, int]:
        """(K width, V width) per KV head. MLA stores the latent plus RoPE key and no V."""
        if self.use_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim, 0
        if full_layer and self.global_head_dim:
            return self.global_head_dim, self.global_head_dim
        return self.head_dim, self.head_dim

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def kv_bytes_per_token_of_layer(self, layer: int, tp: int = 1,
                                    kv_dtype_bytes: int | None = None) -> int:
        full = self.layer_type(layer) == FULL
        k, v = self.kv_head_size(full_layer=full)
        nbytes = kv_dtype_bytes if kv_dtype_bytes is not None else self.dtype_bytes
        return self.kv_heads_per_rank(tp, full_layer=full) * (k + v) * nbytes

    def kv_bytes_per_token_per_layer(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """Of the first layer (all layers alike in a model without per-layer head widths)."""
        return self.kv_bytes_per_token_of_layer(0, tp, kv_dtype_bytes)

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None,
                           layers: range | None = None) -> int:
        """KV bytes one token occupies on one TP rank, over ``layers`` (default all), as if
        every layer kept every token (sliding layers keep only their window)."""
        layers = range(self.num_hidden_layers) if layers is None else layers
        return sum(self.kv_bytes_per_token_of_layer(i, tp, kv_dtype_bytes) for i in layers)

    def check_tp(self, tp: int) -> None:
        """vLLM's checks: attention heads divide across TP; KV heads divide or are replicated."""
        where = self.path or f"model {self.name}"
        _check_tp_value(tp)
        if self.num_attention_heads % tp:
            raise InputError(
                f"{where}: field 'num_attention_heads' ({self.num_attention_heads}) is not "
                f"divisible by tensor_parallel_size {tp}"
            )
        kv = self.num_key_value_heads
        if not self.use_mla and (kv % tp if kv >= tp else tp % kv):
            raise InputError(
                f"{where}: field 'num_key_value_heads' ({kv}) and tensor_parallel_size {tp}: "
                f"one must divide the other"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["quantization"] = (None if self.quantization is None else {
            "method": self.quantization.method, "bits": self.quantization.bits,
            "kept_16bit": sorted(self.quantization.kept_16bit),
            "description": self.quantization.description})
        d["weight_bytes"] = self.weight_bytes
        d["kv_bytes_per_token"] = self.kv_bytes_per_token(1)
        return d

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls, data: Any, source: str = "<model>", lines: dict[str, int] | None = None
    ) -> ModelProfile:
        """From a profile YAML mapping (``params_billion`` given) or an HF config mapping."""
        r = FieldReader(data, source, lines)
        r.reject_unknown(YAML_FIELDS)
        return _build(r, hf=False)

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelProfile:
        """From a Hugging Face ``config.json`` (Llama, Qwen2/3, Qwen3-MoE, Mistral, DeepSeek-V3).

        Parameter counts are estimated from the shapes (``estimate_params``).
        """
        path = Path(path)
        data = read_json(path)
        if isinstance(data, dict) and isinstance(data.get("text_config"), dict):
            data = {**data["text_config"], "_name_or_path": data.get("_name_or_path")}
        r = FieldReader(data, str(path))
        default_name = path.parent.name if path.name == "config.json" else path.stem
        return _build(r, hf=True, name=name or str(data.get("_name_or_path") or default_name))


def _check_tp_value(tp: object) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"tensor_parallel_size: must be an integer >= 1, got {tp!r}")


def _build(r: FieldReader, *, hf: bool, name: str | None = None) -> ModelProfile:
    layers = r.integer("num_hidden_layers")
    hidden = r.integer("hidden_size")
    heads = r.integer("num_attention_heads")
    kv_heads = r.integer("num_key_value_heads", heads)
    use_mla = bool(r.data.get("use_mla")) or r.has("kv_lora_rank")
    if not use_mla and heads % kv_heads:
        # vLLM's Attention layer: each KV head serves a whole group of query heads
        raise r.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads "
                                             f"{heads} (grouped-query attention)")
    head_dim = r.integer("head_dim", 0, minimum=0) or 0
    if not head_dim and use_mla:
        # MLA's query-key width: the non-positional part plus the decoupled RoPE part.
        head_dim = r.integer("qk_nope_head_dim") + r.integer("qk_rope_head_dim")
    if not head_dim:
        if hidden % heads:
            raise r.error("head_dim", f"missing and hidden_size {hidden} / {heads} heads is fractional")
        head_dim = hidden // heads
    if hf:
        dtype = r.string("torch_dtype", None) or r.string("dtype", "bfloat16")
    else:
        dtype = r.string("dtype", "bfloat16")
    dtype_bytes(dtype, f"{r.where('dtype')}: field 'dtype'")
    weight_dtype = dtype
    quant = parse_quantization(r.data.get("quantization_config"), r.where("quantization_config"))
    if quant is not None and int(quant.bits) == 8:
        weight_dtype = "float8_e4m3" if "fp8" in quant.description or "float" in \
            quant.description else "int8"
    if r.has("weight_dtype"):
        weight_dtype = r.string("weight_dtype")
        dtype_bytes(weight_dtype, f"{r.where('weight_dtype')}: field 'weight_dtype'")

    # Each family names its expert count differently (DeepSeek, Mixtral / gpt-oss, Qwen-MoE).
    num_experts = (r.integer("n_routed_experts", 0, minimum=0)
                   or r.integer("num_local_experts", 0, minimum=0)
                   or r.integer("num_experts", 0, minimum=0))
    model_type = str(r.data.get("model_type", ""))
    fields: dict[str, Any] = dict(
        name=name if name is not None else r.string("name"),
        description=r.string("description", ""),
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=r.integer("intermediate_size"),
        vocab_size=r.integer("vocab_size"),
        num_params=0,
        num_active_params=0,
        dtype=dtype,
        weight_dtype=weight_dtype,
        max_position_embeddings=r.integer("max_position_embeddings", None),
        hf_repo=r.string("hf_repo", None) if not hf else r.data.get("_name_or_path") or None,
        tie_word_embeddings=r.boolean("tie_word_embeddings", False),
        attention_bias=r.boolean("attention_bias", model_type in ("qwen2", "qwen2_moe")),
        num_experts=num_experts,
        use_mla=use_mla,
        quantization=quant,
        global_head_dim=r.integer("global_head_dim", 0, minimum=0),
        num_global_key_value_heads=r.integer("num_global_key_value_heads", 0, minimum=0),
        sources={} if hf else load_sources(r),
        path=None if r.source.startswith("<") else r.source,
    )
    fields.update(_attention_layout(r, layers, model_type))
    if num_experts:
        # Mixtral and gpt-oss give the expert width as intermediate_size and have no dense MLP.
        expert_width = r.integer("moe_intermediate_size", 0, minimum=0) or fields[
            "intermediate_size"]
        fields.update(
            num_experts_per_tok=r.integer("num_experts_per_tok"),
            moe_intermediate_size=expert_width,
            num_shared_experts=r.integer("n_shared_experts", 0, minimum=0),
            shared_expert_intermediate_size=r.integer("shared_expert_intermediate_size", 0,
                                                      minimum=0),
            num_dense_layers=r.integer("first_k_dense_replace", 0, minimum=0),
        )
        if fields["num_experts_per_tok"] > num_experts:
            raise r.error("num_experts_per_tok", f"exceeds the {num_experts} experts")
    if use_mla:
        fields.update(
            kv_lora_rank=r.integer("kv_lora_rank"),
            qk_rope_head_dim=r.integer("qk_rope_head_dim"),
            qk_nope_head_dim=r.integer("qk_nope_head_dim"),
            v_head_dim=r.integer("v_head_dim"),
            q_lora_rank=r.integer("q_lora_rank", 0, minimum=0),
        )
    model = ModelProfile(**fields)
    total, active = estimate_params(model)
    if hf:
        return replace(model, num_params=total, num_active_params=active)
    params = round(r.number("params_billion") * 1e9)
    active_params = (
        round(r.number("active_params_billion") * 1e9) if r.has("active_params_billion") else None
    )
    if active_params is None:
        active_params = active if num_experts else params
    if active_params > params:
        raise r.error("active_params_billion", "exceeds params_billion")
    return replace(model, num_params=params, num_active_params=active_params)


def _attention_layout(r: FieldReader, layers: int, model_type: str) -> dict[str, Any]:
    """Which layers attend over a sliding window, as vLLM 0.33.0 reads the config:
    ``layer_types`` when given; else Gemma's ``sliding_window_pattern`` (every n-th layer
    full); else a ``sliding_window`` with ``use_sliding_window`` (or a Mistral-family config,
    which has no such switch) makes every layer sliding."""
    window = r.integer("sliding_window", None) if r.data.get("sliding_window") else None
    types = r.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(
            t not in (FULL, SLIDING) for t in types
        ):
            raise r.error("layer_types", f"expected {layers} entries, each {FULL!r} or "
                                         f"{SLIDING!r}")
        if SLIDING in types and window is None:
            raise r.error("sliding_window", "missing while layer_types has sliding layers")
        return {"layer_types": tuple(types), "sliding_window": window if SLIDING in types
                else None}
    if window is None:
        return {}
    pattern = r.integer("sliding_window_pattern", 0, minimum=0)
    if pattern:
        return {"layer_types": tuple(FULL if (i + 1) % pattern == 0 else SLIDING
                                     for i in range(layers)), "sliding_window": window}
    if r.data.get("use_sliding_window") or (
        model_type in ("mistral", "mixtral") and r.data.get("use_sliding_window") is None
    ):
        return {"layer_types": (SLIDING,) * layers, "sliding_window": window}
    return {}


def estimate_params(m: ModelProfile) -> tuple[int, int]:
    """(total, active) parameter counts from the shapes (``weights.param_counts``).

    Per layer, with H = hidden, n_h / n_kv heads, d = head_dim:
      attention (GQA)  H*n_h*d (q) + 2*H*n_kv*d (k, v) + n_h*d*H (o) [+ n_h*d + 2*n_kv*d biases]
      attention (MLA)  H*r_q + r_q*n_h*(d_nope+d_rope)   (q; without q_lora: H*n_h*(d_nope+d_rope))
                       + H*(r_kv + d_rope) + r_kv*n_h*(d_nope+d_v) (kv) + n_h*d_v*H (o) + r_q + r_kv
      dense MLP        3*H*I (gate, up, down)
      MoE MLP          E*3*H*I_e routed + S*3*H*I_e shared (or 3*H*I_s + H for one Qwen-style
                       shared expert and its gate) + H*E router; active uses top-k for E
      norms            2*H
    plus embeddings V*H, LM head V*H unless tied, final norm H (unpadded vocabulary here).
    Multi-token-prediction heads that some checkpoints ship (DeepSeek-V3) are not served and
    not counted.
    """
    from kvpressure.profiles.weights import param_counts

    counts = param_counts(m)
    total = counts.total()
    inactive = 0
    if m.is_moe and m.num_experts:
        per_expert = 3 * m.hidden_size * m.moe_intermediate_size
        inactive = counts.moe_layers * (m.num_experts - m.num_experts_per_tok) * per_expert
    return total, total - inactive


# --- loaders ------------------------------------------------------------------------------------
def models_dir() -> Path:
    return data_dir() / "models"


def list_models() -> list[str]:
    """Names of the built-in model profiles (``data/models/*.yaml``)."""
    return sorted(p.stem for p in models_dir().glob("*.yaml"))


def load_model(name_or_path: str | Path | ModelProfile) -> ModelProfile:
    """A built-in profile by name, a profile YAML, or a Hugging Face ``config.json``
    (a file ending in ``.json`` or a folder holding ``config.json``)."""
    if isinstance(name_or_path, ModelProfile):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelProfile.from_hf_config(path / "config.json")
    if text.endswith(".json"):
        if not path.is_file():
            raise InputError(f"{path}: model config file not found")
        return ModelProfile.from_hf_config(path)
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = models_dir() / f"{text}.yaml"
        if not path.is_file():
            known = ", ".join(list_models()) or "(none)"
            raise InputError(f"model: unknown profile {text!r}; known: {known}")
    elif not path.is_file():
        raise InputError(f"{path}: model profile file not found")
    data, lines = read_yaml_with_lines(path)
    return ModelProfile.from_dict(data, str(path), lines)
