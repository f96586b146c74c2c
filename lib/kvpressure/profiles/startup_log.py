"""What a vLLM startup log says about the KV pool, V1 (0.33.0) and V0 formats.

Read fields (any may be missing; missing stays ``None``):

* V1: ``Model loading took X GiB memory``, ``Available KV cache memory: X GiB``,
  ``GPU KV cache size: N tokens``, ``Maximum concurrency for M tokens per request: Cx``, the
  ``Free memory on device (F/T GiB) ... Actual usage is A GiB ... P GiB for peak activation,
  and G GiB for CUDAGraph memory`` line, ``CUDA graph pool memory: X GiB (actual)`` and the
  engine's config line (``max_seq_len``, ``tensor_parallel_size``, ``pipeline_parallel_size``).
* V0 (and early V1): ``total_gpu_memory (T GiB) x gpu_memory_utilization (U) = R GiB``,
  ``model weights take W GiB; non_torch_memory takes N GiB; PyTorch activation peak memory
  takes P GiB; the rest of the memory reserved for KV Cache is K GiB`` (one line or the
  tabular form), ``Loading model weights took X GB``, ``# GPU blocks: N, # CPU blocks: M``.

vLLM prints memory rounded to 0.01 GiB, so a figure read here stands for an interval of
+-0.005 GiB (``ROUNDING_BYTES``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError

GiB = 1 << 30
ROUNDING_BYTES = int(0.005 * GiB)

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


@dataclass
class StartupLog:
    path: str
    format: str  # "v1" or "v0"
    total_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    requested_gib: float | None = None
    weights_gib: float | None = None
    non_torch_gib: float | None = None
    activation_peak_gib: float | None = None
    consumed_gib: float | None = None
    """V1: weights + non-torch, as one figure."""
    cudagraph_gib: float | None = None
    """Graph pool actually captured."""
    cudagraph_estimate_gib: float | None = None
    """What the profiler estimated for the graph pool (what 0.21+ subtracts from the KV
    budget by default)."""
    available_kv_gib: float | None = None
    num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    model: str | None = None
    vllm_version: str | None = None

    def subtracts_graph_estimate(self) -> bool:
        """vLLM 0.21 made the graph-pool estimate part of the KV budget by default; logs of
        earlier releases did not subtract it (unknown version: assumed to)."""
        if not self.vllm_version:
            return True
        parts = re.findall(r"\d+", self.vllm_version)[:2]
        return len(parts) < 2 or (int(parts[0]), int(parts[1])) >= (0, 21)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PATTERNS: list[tuple[str, str, Any]] = [
    ("weights_gib", r"Model loading took " + _NUM + r" ?GiB", float),
    ("weights_gib", r"Loading model weights took " + _NUM + r" ?GB", float),
    ("weights_gib", r"model weights take " + _NUM + r" ?GiB", float),
    ("non_torch_gib", r"non_torch_memory(?: takes)?\s+" + _NUM + r" ?GiB", float),
    ("activation_peak_gib", r"PyTorch activation peak memory(?: takes)?\s+" + _NUM + r" ?GiB",
     float),
    ("available_kv_gib", r"Available KV cache memory: " + _NUM + r" ?GiB", float),
    ("available_kv_gib", r"reserved for KV Cache is " + _NUM + r" ?GiB", float),
    ("available_kv_gib", r"available_kv_cache_memory\s+" + _NUM + r" ?GiB", float),
    ("total_memory_gib", r"total_gpu_memory \(" + _NUM + r" ?GiB\)", float),
    ("total_memory_gib", r"total_gpu_memory\s+" + _NUM + r" ?GiB", float),
    ("gpu_memory_utilization", r"gpu_memory_utilization \(" + _NUM + r"\)", float),
    ("requested_gib", r"gpu_memory_utilization \([0-9.]+\) = " + _NUM + r" ?GiB", float),
    ("num_gpu_blocks", r"# (?:GPU|CUDA|cuda|NPU|npu) blocks: " + _NUM, int),
    ("kv_cache_size_tokens", r"KV cache size: " + _NUM + r" tokens", int),
    ("max_concurrency", r"Maximum concurrency for [0-9,]+ tokens per request: " + _NUM + "x",
     float),
    ("max_concurrency_len", r"Maximum concurrency for " + _NUM + " tokens per request", int),
    ("cudagraph_gib", r"CUDA graph pool memory: " + _NUM + r" ?GiB \(actual\)", float),
    ("cudagraph_estimate_gib", r"GiB \(actual\), " + _NUM + r" ?GiB \(estimated\)", float),
    ("weights_gib", r"Actual usage is " + _NUM + r" ?GiB for weight", float),
    ("non_torch_gib", _NUM + r" ?GiB for non-torch memory", float),
    ("total_memory_gib", r"memory snapshot: .*?total_memory=" + _NUM + r" ?GiB", float),
    ("requested_gib", r"worker requested memory: " + _NUM + r" ?GiB", float),
    ("gpu_memory_utilization", r"'gpu_memory_utilization': " + _NUM, float),
    ("vllm_version", r"LLM engine \(v([0-9][^)]*)\)", str),
    ("cudagraph_gib", r"and " + _NUM + r" ?GiB for CUDAGraph memory", float),
    ("activation_peak_gib", _NUM + r" ?GiB for peak activation", float),
    ("consumed_gib", r"Actual usage is " + _NUM + r" ?GiB for consumed memory", float),
    ("total_memory_gib", r"Free memory on device \([0-9.]+/" + _NUM + r" ?GiB\)", float),
    ("gpu_memory_utilization", r"Desired GPU memory utilization is \(" + _NUM + ",", float),
    ("requested_gib", r"Desired GPU memory utilization is \([0-9.]+, " + _NUM + r" ?GiB\)",
     float),
    ("max_model_len", r"max_seq_len=" + _NUM, int),
    ("tensor_parallel_size", r"tensor_parallel_size=" + _NUM, int),
    ("pipeline_parallel_size", r"pipeline_parallel_size=" + _NUM, int),
    ("model", r"with config: model='([^']+)'", str),
]


def read_startup_log(path: str | Path) -> StartupLog:
    """Parse a startup log; the first occurrence of each field wins (rank 0 prints first).

    A file with none of the KV-pool lines is refused with a message naming it.
    """
    from kvpressure.user_files import read_user_text

    path = Path(path)
    text = read_user_text(path, "startup log")
    fmt = "v0" if re.search(r"# (?:GPU|CUDA|cuda|NPU|npu) blocks:|total_gpu_memory", text) \
        and "Available KV cache memory" not in text else "v1"
    log = StartupLog(path=str(path), format=fmt)
    for field_name, pattern, kind in _PATTERNS:
        if getattr(log, field_name) is not None:
            continue
        m = re.search(pattern, text)
        if m:
            raw = m.group(1)
            setattr(log, field_name, raw if kind is str else kind(raw.replace(",", "")))
    if log.available_kv_gib is None and log.num_gpu_blocks is None \
            and log.kv_cache_size_tokens is None:
        raise InputError(
            f"{path}: no KV-pool line found (expected 'Available KV cache memory', 'GPU KV "
            "cache size', '# GPU blocks' or the memory profiling lines of a vLLM startup log)"
        )
    if log.consumed_gib is not None and log.weights_gib is not None \
            and log.non_torch_gib is None:
        log.non_torch_gib = round(max(0.0, log.consumed_gib - log.weights_gib), 2)
    if log.max_model_len is None and log.max_concurrency_len is not None:
        log.max_model_len = log.max_concurrency_len
    return log


def blocks_from_tokens(tokens: int, max_model_len: int, blocks_per_request: int) -> int | None:
    """The block count behind V1's ``KV cache size: N tokens``
    (``int(num_blocks / blocks_per_request * max_model_len)``), or None if none gives N."""
    guess = tokens * blocks_per_request // max_model_len
    for n in range(max(0, guess - 2), guess + 3):
        if int(n / blocks_per_request * max_model_len) == tokens:
            return n
    return None
