"""KV-pool sizing the way a vLLM 0.33.0 worker does it, with every intermediate visible.

Per rank of each pipeline stage (the TP ranks of a stage are alike); the engine takes the
smallest stage's block count:

    requested      = ceil(total_memory * gpu_memory_utilization)                      (K1)
    non_kv         = weights + non_torch + activation_peak                            (K2)
    available_kv   = requested - non_kv - cudagraph                                   (K3)
                     (or ``kv_cache_memory_bytes`` when given: utilization is then ignored)
    block_bytes    = the widest KV group's pages on the stage (``kv_layout.py``; a model
                     without sliding or mixed layers: layers * block_size * bytes/token)  (K4)
    num_gpu_blocks = min over stages of available_kv // block_bytes, or the override  (K5)
    check          = blocks_per_request * block_bytes <= available_kv - block_bytes     (K6)
    capacity       = floor(N / blocks_per_request * max_model_len) tokens              (K7)

``available_kv <= 0`` is not an input error: vLLM refuses to start ("No available memory for
the cache blocks"), and the sizing says so with 0 blocks (``refusal``).

vLLM measures ``weights``, ``non_torch``, ``activation_peak`` and ``cudagraph`` by profiling a
dummy forward pass; without a device they are estimated here (see ``estimate_activation`` and
the constants below). Pass the figures from a real startup log to reproduce its pool exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvpressure.errors import InputError
from kvpressure.profiles.fields import MAX_CARD_BYTES
from kvpressure.profiles.hardware import (
    KERNEL_BLOCK_MULTIPLE,
    GiB,
    HardwareProfile,
    MiB,
    load_hardware,
)
from kvpressure.profiles.kv_layout import FULL, MLA, SLIDING, LayerSpec, plan_layout
from kvpressure.profiles.model import SLIDING as SLIDING_ATTENTION
from kvpressure.profiles.model import ModelProfile, load_model
from kvpressure.profiles.weights import pp_layers

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py, 0.33.0

# Estimates for what vLLM's profiler would measure, per rank. Calibrated on the public vLLM
# startup logs of the llm-d-planner accuracy sweep (vLLM 0.19.0, H100 80GB, 57 runs of 29
# models: github.com/llm-d-incubation/llm-d-planner, accuracy/results/v0.19.0/logs), whose
# "Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory"
# and "CUDA graph pool memory: X GiB (actual), E GiB (estimated)" lines give each term.
NON_TORCH_SINGLE_BYTES = 256 * MiB
"""Runtime context and library workspaces of a lone rank: 0.24-0.27 GiB measured at TP 1."""
NON_TORCH_TP_BYTES = 2150 * MiB
"""With a TP group, NCCL and custom all-reduce buffers: 2.06-2.21 GiB measured at TP 2 and 4."""
CUDAGRAPH_BASE_BYTES = 200 * MiB
CUDAGRAPH_PER_LAYER_BYTES = 20 * MiB
"""vLLM 0.33.0 subtracts its graph-pool estimate (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
is on by default since 0.21). Measured estimates grow with depth: 0.61-0.84 GiB for 28-36
layer 7-8B models, 1.6-1.9 GiB for 80-layer 70B models."""
SAMPLER_FP32_COPIES = 3
"""The dummy sampler pass holds max_num_seqs rows of fp32 logits over the whole vocabulary
three times (logits, probabilities, a sorted copy): Llama-3.1-8B (128k vocabulary) peaks 1.12
GiB above CodeLlama-7B (32k) with the same body, which is 1024 x 96,240 x 4 B x 3."""


class KVPoolError(InputError):
    """The pool cannot be built: weights do not fit, no memory left, or max_model_len too long.

    ``largest_fitting_len`` is set when a shorter ``max_model_len`` would start.
    """

    def __init__(self, message: str, largest_fitting_len: int | None = None):
        super().__init__(message)
        self.largest_fitting_len = largest_fitting_len


@dataclass(frozen=True)
class KVPoolSizing:
    hardware: str
    model: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_dtype_bytes: int
    # memory per rank, bytes (of the stage that decides the pool)
    total_memory_bytes: int
    requested_bytes: int
    weights_bytes: int
    non_torch_bytes: int
    activation_forward_bytes: int
    activation_sampler_bytes: int
    activation_peak_bytes: int
    non_kv_bytes: int
    cudagraph_bytes: int
    available_kv_bytes: int
    # pages and blocks
    kv_bytes_per_token: int
    kv_heads_per_rank: int
    page_size_bytes: int
    block_bytes: int
    num_gpu_blocks_computed: int
    num_gpu_blocks: int
    kv_pool_bytes: int
    # derived
    usable_blocks: int
    usable_tokens: int
    blocks_per_max_len_request: int
    kv_cache_size_tokens: int
    max_concurrency: float
    estimated: tuple[str, ...]
    """Which memory components are estimates rather than given figures."""
    pipeline_parallel_size: int = 1
    deciding_stage: int = 0
    """The pipeline stage with the fewest blocks (its figures fill the fields above)."""
    nameplate_memory_bytes: int = 0
    kv_groups: tuple[dict[str, Any], ...] = ()
    """vLLM's KV-cache groups: kind, window, block_size, page_bytes, layers, blocks/request."""
    stages: tuple[dict[str, Any], ...] = ()
    """Per pipeline stage: layers, weights, available KV bytes, block bytes, blocks."""
    refusal: str | None = None
    """vLLM's message when it would refuse to start for want of KV memory (then 0 blocks)."""
    warnings: tuple[str, ...] = ()

    def safe_concurrency(self, avg_seq_len: float, *, half_filled_tail: bool = False) -> int:
        return safe_concurrency(self, avg_seq_len, half_filled_tail=half_filled_tail)

    def memory_breakdown(self) -> list[dict[str, Any]]:
        """Rows (component, bytes, GiB, share of the card) for tables."""
        rows = [
            ("total device memory", self.total_memory_bytes),
            ("requested (x utilization)", self.requested_bytes),
            ("weights", self.weights_bytes),
            ("non-torch (runtime, collectives)", self.non_torch_bytes),
            ("activation peak", self.activation_peak_bytes),
            ("graph capture", self.cudagraph_bytes),
            ("KV pool (num_gpu_blocks x block)", self.kv_pool_bytes),
            # a KV budget given directly may exceed what the request leaves: nothing is unused
            ("left unused in the request", max(0, self.requested_bytes - self.non_kv_bytes
                                                - self.cudagraph_bytes - self.kv_pool_bytes)),
        ]
        return [
            {
                "component": name,
                "bytes": value,
                "GiB": value / GiB,
                "share_of_card": value / self.total_memory_bytes,
            }
            for name, value in rows
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["estimated"] = list(self.estimated)
        d["warnings"] = list(self.warnings)
        d["kv_groups"] = [dict(g) for g in self.kv_groups]
        d["stages"] = [dict(x) for x in self.stages]
        return d


def estimate_activation(model: ModelProfile, tp: int, max_num_batched_tokens: int,
                        max_num_seqs: int) -> tuple[int, int]:
    """(forward, sampler) parts of the activation peak of vLLM's profiling run, bytes per rank.

    forward = max_num_batched_tokens * (hidden + 2 * I / tp) * dtype_bytes, where I is the
      widest MLP a token passes through: the dense ``intermediate_size``, or ``top_k *
      moe_intermediate_size`` for routed experts (the fused-MoE intermediate cache);
    sampler = max_num_seqs * vocab_size * 4 B * SAMPLER_FP32_COPIES (logits gathered to the
      full vocabulary on every rank).
    The hidden states stay alive while the sampler runs: the peak is their sum (Llama-3.1-8B:
    0.50 + 1.47 = 1.97 GiB for 1.89 measured; CodeLlama-7B 0.40 + 0.37 = 0.77 for 0.77;
    Qwen2.5-72B at TP 2: 0.58 + 1.74 = 2.32 for 2.29).
    """
    widths = []
    if not model.is_moe or model.num_dense_layers:
        widths.append(model.intermediate_size)
    if model.is_moe:
        widths.append(model.num_experts_per_tok * model.moe_intermediate_size)
    inter = max(widths)
    forward = math.ceil(
        max_num_batched_tokens * (model.hidden_size + 2 * inter / tp) * model.dtype_bytes
    )
    sampler = max_num_seqs * model.vocab_size * 4 * SAMPLER_FP32_COPIES
    return forward, sampler


def estimate_non_torch(tp: int) -> int:
    return NON_TORCH_TP_BYTES if tp > 1 else NON_TORCH_SINGLE_BYTES


def estimate_cudagraph(num_layers: int) -> int:
    """Graph-pool estimate vLLM 0.33.0 subtracts, for a rank holding ``num_layers`` layers."""
    return CUDAGRAPH_BASE_BYTES + CUDAGRAPH_PER_LAYER_BYTES * num_layers


def resolve_batch_limits(
    hardware: HardwareProfile,
    max_model_len: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    *,
    enable_chunked_prefill: bool = True,
    usage_context: str = "api_server",
) -> tuple[int, int]:
    """vLLM 0.33.0's ``_set_default_max_num_seqs_and_batched_tokens_args`` and its checks."""
    default_tokens, default_seqs = hardware.batch_defaults(usage_context)
    for name, given in (("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
        if given is not None:
            _positive_int(name, given)
    seqs = max_num_seqs if max_num_seqs is not None else default_seqs
    if max_num_batched_tokens is None:
        tokens = default_tokens
        if not enable_chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    else:
        tokens = max_num_batched_tokens
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    _positive_int("max_num_batched_tokens", tokens)
    _positive_int("max_num_seqs", seqs)
    if tokens < seqs:
        raise InputError(
            f"max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs}), as vLLM requires"
        )
    if not enable_chunked_prefill and tokens < max_model_len:
        raise InputError(
            f"max_num_batched_tokens ({tokens}) must be >= max_model_len ({max_model_len}) "
            "when chunked prefill is disabled"
        )
    return tokens, seqs


def size_kv_pool(
    hardware: HardwareProfile | str,
    model: ModelProfile | str,
    tp: int = 1,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int | None = None,
    kv_cache_dtype_bytes: int | None = None,
    *,
    pp: int = 1,
    num_gpu_blocks_override: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    enable_chunked_prefill: bool = True,
    async_scheduling: bool = True,
    usage_context: str = "api_server",
    weights_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    activation_bytes: int | None = None,
    cudagraph_bytes: int | None = None,
    total_memory_bytes: int | None = None,
) -> KVPoolSizing:
    """Size the KV pool as vLLM 0.33.0 does at startup, for ``tp`` x ``pp`` ranks.

    ``max_model_len`` None uses the model's ``max_position_embeddings``; -1 (vLLM's "auto")
    starts there and shrinks to the longest length that fits. ``max_num_batched_tokens`` and
    ``max_num_seqs`` None take vLLM's device-tier defaults for ``usage_context``.
    ``block_size`` None takes the platform default (16 CUDA, 128 vllm-ascend).
    ``weights_bytes``, ``non_torch_bytes``, ``activation_bytes``, ``cudagraph_bytes`` (per rank)
    replace the estimates with measured figures; ``total_memory_bytes`` replaces the card's
    runtime total. ``async_scheduling`` (0.33.0's default) doubles the tokens in flight that
    sliding-window layers reserve for. A measured ``weights_bytes`` applies to every stage.
    Raises ``KVPoolError`` (an ``InputError``) when weights do not fit or ``max_model_len`` is
    too long; a budget of zero or less gives 0 blocks and ``refusal``.
    """
    hw = load_hardware(hardware)
    mdl = load_model(model)
    mdl.check_tp(tp)
    pp_layers(mdl.num_hidden_layers, pp, 0)  # validates pp
    if tp > hw.num_cards:  # pipeline stages may sit on other servers; a TP group may not
        raise InputError(
            f"tensor_parallel_size: {tp} exceeds the {hw.num_cards} cards of hardware {hw.name!r}"
        )
    util = gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
        raise InputError(f"gpu_memory_utilization: must be in (0, 1], got {util!r}")
    block = hw.default_block_size if block_size is None else block_size
    _positive_int("block_size", block)
    if block % KERNEL_BLOCK_MULTIPLE:
        raise InputError(f"block_size: {block} is refused by vLLM 0.33.0's attention backends "
                         f"(each takes a multiple of {KERNEL_BLOCK_MULTIPLE}: 16, 32, 64, 128...)")
    kv_dtype = mdl.dtype_bytes if kv_cache_dtype_bytes is None else kv_cache_dtype_bytes
    if kv_dtype not in (1, 2, 4):
        raise InputError(f"kv_cache_dtype_bytes: must be 1, 2 or 4, got {kv_dtype!r}")
    auto_len = max_model_len == -1
    if max_model_len is None or auto_len:
        if mdl.max_position_embeddings is None:
            raise InputError(
                f"max_model_len: not given and model {mdl.name!r} has no max_position_embeddings"
            )
        max_model_len = mdl.max_position_embeddings
    _positive_int("max_model_len", max_model_len)
    tokens, seqs = resolve_batch_limits(
        hw, max_model_len, max_num_batched_tokens, max_num_seqs,
        enable_chunked_prefill=enable_chunked_prefill, usage_context=usage_context,
    )
    in_flight = tokens * ((2 if pp == 1 else pp) if async_scheduling else pp)

    estimated: list[str] = []
    warnings: list[str] = []
    total = hw.usable_memory_bytes if total_memory_bytes is None else total_memory_bytes
    _positive_int("total_memory_bytes", total)
    if total > MAX_CARD_BYTES:
        raise InputError(f"total_memory_bytes: {total:.3g} is more than any card holds (at most "
                         f"{MAX_CARD_BYTES >> 40} TiB)")
    requested = math.ceil(total * util)
    measured_weights = weights_bytes
    if weights_bytes is None:
        estimated.append("weights")
    if non_torch_bytes is None:
        non_torch_bytes = estimate_non_torch(tp)
        estimated.append("non_torch")
    fwd, sampler = estimate_activation(mdl, tp, tokens, seqs)
    measured_activation = activation_bytes
    if activation_bytes is None:
        estimated.append("activation")
    measured_graphs = cudagraph_bytes
    if cudagraph_bytes is None and hw.graph_pool_in_kv_budget:
        estimated.append("cudagraph")
    for label, value in (("weights_bytes", weights_bytes), ("non_torch_bytes", non_torch_bytes),
                         ("activation_bytes", activation_bytes),
                         ("cudagraph_bytes", cudagraph_bytes)):
        if value is not None:
            _non_negative_int(label, value)
            if value > total:
                raise InputError(f"{label}: {value / GiB:.2f} GiB is more than the card's "
                                 f"{total / GiB:.2f} GiB of memory")

    layout = plan_layout(layer_specs(mdl, tp, kv_dtype), block)
    where = f"hardware {hw.name!r}, model {mdl.name!r}, tensor_parallel_size {tp}" + (
        f", pipeline_parallel_size {pp}" if pp > 1 else "")
    if kv_cache_memory_bytes is not None:
        _positive_int("kv_cache_memory_bytes", kv_cache_memory_bytes)
        if kv_cache_memory_bytes > MAX_CARD_BYTES:
            raise InputError(f"kv_cache_memory_bytes: {kv_cache_memory_bytes:.3g} is more than "
                             f"any card holds (at most {MAX_CARD_BYTES >> 40} TiB)")
        if kv_cache_memory_bytes > total:
            warnings.append(
                f"kv_cache_memory_bytes {kv_cache_memory_bytes / GiB:.2f} GiB is more than the "
                f"card's {total / GiB:.2f} GiB: vLLM would run out of memory allocating it")

    stages: list[dict[str, Any]] = []
    for rank in range(pp):
        layers = pp_layers(mdl.num_hidden_layers, pp, rank)
        w = measured_weights if measured_weights is not None else mdl.weight_bytes_per_rank(
            tp, pp, rank)
        if measured_activation is not None:
            act = measured_activation
        else:  # only the last stage samples
            act = fwd + sampler if rank == pp - 1 else fwd
        if measured_graphs is not None:
            graphs = measured_graphs
        else:
            graphs = estimate_cudagraph(len(layers)) if hw.graph_pool_in_kv_budget else 0
        if kv_cache_memory_bytes is not None:
            available = kv_cache_memory_bytes
        else:
            if w > requested:
                raise KVPoolError(
                    f"{where}: weights need {w / GiB:.2f} GiB per rank, more than the "
                    f"{requested / GiB:.2f} GiB requested ({total / GiB:.2f} GiB x "
                    f"gpu_memory_utilization {util}); raise tensor_parallel_size or use a "
                    "smaller or quantized model"
                )
            available = requested - (w + non_torch_bytes + act) - graphs
        bpb = layout.bytes_per_block(layers)
        stages.append({"stage": rank, "layers": [layers.start, layers.stop], "weights_bytes": w,
                       "activation_peak_bytes": act, "cudagraph_bytes": graphs,
                       "available_kv_bytes": available,
                       "block_bytes": bpb, "num_gpu_blocks": max(0, available) // bpb})
    decide = min(stages, key=lambda x: (x["num_gpu_blocks"], x["stage"]))
    weights_bytes, activation_bytes = decide["weights_bytes"], decide["activation_peak_bytes"]
    cudagraph_bytes = decide["cudagraph_bytes"]
    available, block_bytes = decide["available_kv_bytes"], decide["block_bytes"]
    non_kv = weights_bytes + non_torch_bytes + activation_bytes
    computed = decide["num_gpu_blocks"]

    refusal = None
    per_req = layout.blocks_per_request(max_model_len, in_flight)
    if min(x["available_kv_bytes"] for x in stages) <= 0:
        refusal = (
            f"{where}: No available memory for the cache blocks (vLLM refuses to start): "
            f"requested {requested / GiB:.2f} GiB - weights {weights_bytes / GiB:.2f} - "
            f"non-torch {non_torch_bytes / GiB:.2f} - activation {activation_bytes / GiB:.2f} - "
            f"graphs {cudagraph_bytes / GiB:.2f} = {available / GiB:.2f} GiB. Try increasing "
            "gpu_memory_utilization or tensor_parallel_size, or lowering max_num_batched_tokens."
        )
        computed = 0
    else:
        if num_gpu_blocks_override is not None:
            _positive_int("num_gpu_blocks_override", num_gpu_blocks_override)
            wanted = num_gpu_blocks_override * max(x["block_bytes"] for x in stages)
            if wanted > total:  # as for kv_cache_memory_bytes: the pool is shown, with why
                warnings.append(
                    f"num_gpu_blocks_override {num_gpu_blocks_override:,} blocks take "
                    f"{wanted / GiB:,.2f} GiB, more than the card's {total / GiB:.2f} GiB: vLLM "
                    "would run out of memory allocating them")
        # every stage must hold one max_model_len request besides the null block
        budgets = [(num_gpu_blocks_override * x["block_bytes"]
                    if num_gpu_blocks_override is not None else x["available_kv_bytes"])
                   - x["block_bytes"] for x in stages]
        check = min(budgets)

        def fits(length: int) -> bool:
            need = layout.blocks_per_request(length, in_flight)
            return all(need * x["block_bytes"] <= b for x, b in zip(stages, budgets, strict=True))

        if not fits(max_model_len):
            largest = _largest_fitting(fits, max_model_len)
            if auto_len and largest > 0:
                max_model_len = largest
                per_req = layout.blocks_per_request(max_model_len, in_flight)
            else:
                needed = per_req * block_bytes
                hint = (f"Based on the available memory, the largest max_model_len that fits "
                        f"is {largest}. " if largest > 0 else "")
                raise KVPoolError(
                    f"{where}: max_model_len: to serve at least one request of {max_model_len} "
                    f"tokens, {needed / GiB:.2f} GiB of KV cache is needed, more than the "
                    f"{max(check, 0) / GiB:.2f} GiB available. {hint}Lower max_model_len or "
                    "raise gpu_memory_utilization.",
                    largest_fitting_len=largest or None,
                )

    n = computed if num_gpu_blocks_override is None or refusal else num_gpu_blocks_override
    first = layout.groups[0]
    stage_layers = pp_layers(mdl.num_hidden_layers, pp, decide["stage"])
    return KVPoolSizing(
        hardware=hw.name,
        model=mdl.name,
        tensor_parallel_size=tp,
        gpu_memory_utilization=float(util),
        block_size=block,
        max_model_len=max_model_len,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        kv_cache_dtype_bytes=kv_dtype,
        total_memory_bytes=total,
        requested_bytes=requested,
        weights_bytes=weights_bytes,
        non_torch_bytes=non_torch_bytes,
        activation_forward_bytes=fwd,
        activation_sampler_bytes=sampler,
        activation_peak_bytes=activation_bytes,
        non_kv_bytes=non_kv,
        cudagraph_bytes=cudagraph_bytes,
        available_kv_bytes=available,
        kv_bytes_per_token=mdl.kv_bytes_per_token(tp, kv_dtype, stage_layers),
        kv_heads_per_rank=mdl.kv_heads_per_rank(tp),
        page_size_bytes=first.page_bytes,
        block_bytes=block_bytes,
        num_gpu_blocks_computed=computed,
        num_gpu_blocks=n,
        kv_pool_bytes=n * block_bytes,
        usable_blocks=max(0, n - 1),
        usable_tokens=max(0, n - 1) * block,
        blocks_per_max_len_request=per_req,
        kv_cache_size_tokens=int(n / per_req * max_model_len),
        max_concurrency=n / per_req,
        estimated=tuple(estimated),
        pipeline_parallel_size=pp,
        deciding_stage=decide["stage"],
        nameplate_memory_bytes=hw.memory_bytes,
        kv_groups=tuple(
            {"kind": g.kind, "window": g.window, "block_size": g.block_size,
             "page_bytes": g.page_bytes, "num_layers": len(g.layers),
             "blocks_per_request": g.blocks_per_request(max_model_len, in_flight)}
            for g in layout.groups),
        stages=tuple(stages),
        refusal=refusal,
        warnings=tuple(warnings),
    )


def layer_specs(model: ModelProfile, tp: int, kv_dtype_bytes: int) -> list[LayerSpec]:
    """One KV spec per attention layer, per rank."""
    specs = []
    for i in range(model.num_hidden_layers):
        per_token = model.kv_bytes_per_token_of_layer(i, tp, kv_dtype_bytes)
        if model.use_mla:
            specs.append(LayerSpec(MLA, per_token))
        elif model.layer_type(i) == SLIDING_ATTENTION:
            specs.append(LayerSpec(SLIDING, per_token, model.sliding_window))
        else:
            specs.append(LayerSpec(FULL, per_token))
    return specs


def _largest_fitting(fits: Any, upper: int) -> int:
    """vLLM's binary search for the longest max_model_len that fits (0: not even 1 token)."""
    if not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def safe_concurrency(
    sizing: KVPoolSizing, avg_seq_len: float, *, half_filled_tail: bool = False
) -> int:
    """Sequences of ``avg_seq_len`` tokens (prompt + output) that hold KV at the same time.

    Every sequence holds whole blocks, so one of exactly ``avg_seq_len`` tokens takes
    ``cdiv(avg_seq_len, B)`` of the ``N - 1`` usable blocks (the null block is never handed out):
    ``floor((N - 1) / cdiv(avg_seq_len, B))``. With ``half_filled_tail`` the lengths are taken
    as spread around the average, so a sequence's last block is on average half full and it
    holds ``avg_seq_len / B + 1/2`` blocks: ``floor((N - 1) / (avg_seq_len / B + 0.5))``.
    Both count sequences at their full length; growing sequences hold fewer blocks early on.
    """
    if isinstance(avg_seq_len, bool) or not isinstance(avg_seq_len, int | float) or avg_seq_len <= 0:
        raise InputError(f"avg_seq_len: must be > 0, got {avg_seq_len!r}")
    usable = sizing.num_gpu_blocks - 1
    groups = sizing.kv_groups or ({"kind": FULL, "window": None,
                                   "block_size": sizing.block_size},)
    whole = half = 0.0
    for g in groups:
        bs = g["block_size"]
        blocks, tail = math.ceil(avg_seq_len / bs), avg_seq_len / bs + 0.5
        if g["kind"] == SLIDING and g["window"]:
            cap = math.ceil((g["window"] - 1) / bs) + 1  # out-of-window blocks are freed
            blocks, tail = min(blocks, cap), min(tail, cap)
        whole += blocks
        half += tail
    if half_filled_tail:
        return max(0, math.floor(usable / half))
    return max(0, int(usable // whole))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name}: must be a positive integer, got {value!r}")


def _non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name}: must be a non-negative integer, got {value!r}")


def safe_concurrency_grid(
    hardware: HardwareProfile | str,
    model: ModelProfile | str,
    avg_seq_lens: list[int],
    utilizations: list[float],
    **size_kwargs: Any,
) -> list[dict[str, Any]]:
    """One row per (gpu_memory_utilization, avg_seq_len): the pool and the sequences that fit.

    ``size_kwargs`` go to ``size_kv_pool`` (tp, max_model_len, block_size, ...).
    """
    rows = []
    for util in utilizations:
        sizing = size_kv_pool(hardware, model, gpu_memory_utilization=util, **size_kwargs)
        for n in avg_seq_lens:
            rows.append({
                "gpu_memory_utilization": util,
                "avg_seq_len": n,
                "num_gpu_blocks": sizing.num_gpu_blocks,
                "safe_concurrency": safe_concurrency(sizing, n),
                "safe_concurrency_half_filled_tail": safe_concurrency(
                    sizing, n, half_filled_tail=True
                ),
            })
    return rows
