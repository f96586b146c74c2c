"""Accelerator profiles: memory, bandwidth, peak FLOPs, links and achievable fractions.

YAML files use unit-suffixed field names so that a number never stands without its unit:
``memory_gib`` (2**30 bytes; HBM stacks come in binary sizes, so a vendor's "64 GB" card holds
64 GiB) or ``memory_gb`` (10**9 bytes) for the nameplate, or ``memory`` with the unit in the
value (``memory: 80GiB``; a bare number there is refused), ``usable_memory_gib`` /
``usable_memory_gb`` / ``usable_memory`` for the total the runtime reports
(``torch.cuda.mem_get_info``; what vLLM multiplies by ``gpu_memory_utilization``, a few hundred MiB to ~3 GiB below the nameplate), ``hbm_bandwidth_gb_s`` (10**9 B/s), ``peak_flops_tflops``
(10**12 FLOP/s), ``link_bandwidth_per_direction_gb_s`` / ``link_bandwidth_aggregate_gb_s``,
``alpha_c_us``, ``t0_ms``, ``t_seq_us``, and the host's share of a request's path
(``simulation/request_path.py``): ``api_server_ms``, ``tokenize_us_per_token``,
``output_path_ms``. The dataclass holds SI base units (bytes, B/s, FLOP/s,
seconds) so the cost model never converts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.profiles.fields import (
    MAX_CARD_BYTES,
    FieldReader,
    load_sources,
    parse_size,
    read_yaml_with_lines,
)

GiB = 1 << 30
MiB = 1 << 20
GB = 10**9

# vLLM 0.33.0 engine/arg_utils.py::get_batch_defaults, OpenAI API-server context
# (what `vllm serve` uses), as (max_num_batched_tokens, max_num_seqs).
_BATCH_TIER_LARGE = (16384, 1024)  # device >= 160 GiB (B200/B300, MI300X)
_BATCH_TIER_HOPPER = (8192, 1024)  # device >= 70 GiB and not an A100 (H100, H200)
_BATCH_TIER_DEFAULT = (2048, 256)  # everything else (A100, L40S, 64 GB Ascend)
# The LLM-class (offline) context uses larger token budgets on the same tiers.
_BATCH_TIER_LLM_CLASS = {
    _BATCH_TIER_LARGE: (16384, 1024),
    _BATCH_TIER_HOPPER: (16384, 1024),
    _BATCH_TIER_DEFAULT: (8192, 256),
}

USAGE_CONTEXTS = ("api_server", "llm_class")

YAML_FIELDS = {
    "name", "description", "device_name", "num_cards", "memory", "memory_gib", "memory_gb",
    "usable_memory", "usable_memory_gib", "usable_memory_gb", "hbm_bandwidth_gb_s",
    "peak_flops_tflops", "peak_flops_total_tflops", "link_bandwidth_per_direction_gb_s",
    "link_bandwidth_aggregate_gb_s", "allreduce_bandwidth_gb_s", "allreduce_latency_us",
    "eta_f", "eta_a", "eta_m",
    "eta_c", "alpha_c_us", "t0_ms", "t_seq_us", "api_server_ms", "tokenize_us_per_token",
    "output_path_ms", "default_block_size", "batch_defaults",
    "graph_pool_in_kv_budget", "sources", "references",
}


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator card and the server it sits in. All values per card, SI units."""

    name: str
    description: str
    device_name: str
    """What the runtime reports as the device name; vLLM checks it for "a100"."""
    num_cards: int
    memory_bytes: int
    """Nameplate device memory per card."""
    usable_memory_bytes: int
    """Total memory the runtime reports (vLLM's ``total_memory`` in K1); nominal if unknown."""
    hbm_bandwidth: float
    """Peak device-memory bandwidth, B/s."""
    peak_flops: float
    """Dense BF16 peak of the matrix units, FLOP/s (the GEMM roofline)."""
    peak_flops_total: float
    """Vendor's dense BF16 figure, matrix + vector units, FLOP/s (== peak_flops if not split)."""
    link_bandwidth: float
    """Card-to-card bandwidth per direction, B/s (what a ring all-reduce step can use)."""
    link_bandwidth_aggregate: float
    """Vendor's aggregate card-to-card figure (both directions, all links), B/s."""
    allreduce_bandwidth_measured: dict[int, float]
    """Measured all-reduce bandwidth by group size (cards -> B/s); empty when not measured."""
    eta_f: float
    """Achievable fraction of ``peak_flops`` on large GEMMs."""
    eta_a: float
    """Achievable fraction of ``peak_flops`` in prefill attention kernels."""
    eta_m: float
    """Achievable fraction of ``hbm_bandwidth`` in memory-bound kernels."""
    eta_c: float
    """Achievable fraction of ``link_bandwidth`` for all-reduce when no measurement exists."""
    alpha_c: float
    """Per-call all-reduce latency, s."""
    t0: float
    """Fixed per-step cost (scheduler, input prep, sampler, launches), s."""
    t_seq: float
    """Per-sequence per-step CPU cost (detokenize, output processing), s."""
    default_block_size: int
    """Block size the platform picks when ``--block-size`` is unset (16 CUDA, 128 vllm-ascend)."""
    batch_defaults_override: tuple[int, int] | None = None
    """(max_num_batched_tokens, max_num_seqs) when the platform plugin replaces vLLM's tiers."""
    graph_pool_in_kv_budget: bool = True
    """vLLM 0.33.0's GPU worker takes its graph-pool estimate out of the KV budget (CUDA, ROCm,
    XPU); vllm-ascend's NPU worker sizes the pool without it."""
    api_server_s: float = 0.0
    """Client send to the engine core's input queue, tokenising aside (HTTP, input processing,
    IPC), s."""
    tokenize_s_per_token: float = 0.0
    """The API server's tokenising cost per prompt token, s."""
    output_s: float = 0.0
    """End of a step to the client reading its token (output processing, IPC, detokenising,
    streaming), s."""
    allreduce_latency_measured: dict[int, tuple[tuple[float, float], ...]] = field(
        default_factory=dict)
    """Measured time of one all-reduce by group size and message size (cards -> ((bytes, s),
    ...)); the cost model uses it in place of the ring formula for those group sizes."""
    sources: dict[str, str] = field(default_factory=dict)
    path: str | None = None

    # --- names the cost model reads -------------------------------------------------------
    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    @property
    def nameplate_memory_bytes(self) -> int:
        return self.memory_bytes

    def allreduce_bandwidth(self, tp: int) -> float:
        """Effective all-reduce bandwidth (B/s) of a ``tp``-card group for the ring formula.

        A measurement for that group size wins; otherwise the largest measured group not above
        ``tp``; otherwise ``eta_c * link_bandwidth``.
        """
        if tp in self.allreduce_bandwidth_measured:
            return self.allreduce_bandwidth_measured[tp]
        smaller = [n for n in self.allreduce_bandwidth_measured if n <= tp]
        if smaller:
            return self.allreduce_bandwidth_measured[max(smaller)]
        return self.eta_c * self.link_bandwidth

    def allreduce_latency(self, tp: int) -> tuple[tuple[float, float], ...]:
        """Measured ((bytes, s), ...) of one all-reduce on ``tp`` cards; empty if not measured
        for that group size (a table does not carry over to other sizes)."""
        return self.allreduce_latency_measured.get(tp, ())

    def batch_defaults(self, usage_context: str = "api_server") -> tuple[int, int]:
        """vLLM 0.33.0's (max_num_batched_tokens, max_num_seqs) defaults for this device.

        ``api_server`` is ``vllm serve``; ``llm_class`` is the offline ``LLM(...)`` class.
        """
        if usage_context not in USAGE_CONTEXTS:
            raise InputError(
                f"usage_context: unknown value {usage_context!r}; known: {', '.join(USAGE_CONTEXTS)}"
            )
        if self.batch_defaults_override is not None:
            return self.batch_defaults_override
        if self.usable_memory_bytes >= 160 * GiB:
            tier = _BATCH_TIER_LARGE
        elif self.usable_memory_bytes >= 70 * GiB and "a100" not in self.device_name.lower():
            tier = _BATCH_TIER_HOPPER
        else:
            tier = _BATCH_TIER_DEFAULT
        return tier if usage_context == "api_server" else _BATCH_TIER_LLM_CLASS[tier]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["allreduce_bandwidth_measured"] = {
            str(k): v for k, v in self.allreduce_bandwidth_measured.items()
        }
        d["allreduce_latency_measured"] = {
            str(k): [list(p) for p in v] for k, v in self.allreduce_latency_measured.items()
        }
        return d

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls, data: Any, source: str = "<hardware>", lines: dict[str, int] | None = None
    ) -> HardwareProfile:
        r = FieldReader(data, source, lines)
        r.reject_unknown(YAML_FIELDS)
        memory_bytes = _memory_bytes(r, "memory")
        usable = (
            _memory_bytes(r, "usable_memory")
            if any(r.has(f"usable_memory{u}") for u in ("", "_gib", "_gb"))
            else memory_bytes
        )
        if usable > memory_bytes:
            raise r.error("usable_memory_gib", "exceeds the nominal memory")
        peak = r.number("peak_flops_tflops") * 1e12
        per_dir = r.number("link_bandwidth_per_direction_gb_s") * GB
        aggregate = r.number("link_bandwidth_aggregate_gb_s", per_dir / GB * 2) * GB
        allreduce: dict[int, float] = {}
        for k, v in r.mapping("allreduce_bandwidth_gb_s").items():
            try:
                cards = int(k)
            except (TypeError, ValueError):
                raise r.error("allreduce_bandwidth_gb_s", f"key {k!r} is not a card count") from None
            if cards < 2 or isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise r.error(
                    "allreduce_bandwidth_gb_s",
                    f"entry {k!r}: {v!r} must map a card count >= 2 to a bandwidth > 0",
                )
            allreduce[cards] = float(v) * GB
        latency: dict[int, tuple[tuple[float, float], ...]] = {}
        for k, table in r.mapping("allreduce_latency_us").items():
            bad = r.error("allreduce_latency_us", f"entry {k!r} must map a card count >= 2 to "
                          "{message bytes: microseconds} with at least two sizes")
            try:
                cards = int(k)
                pairs = sorted((float(b), float(t) * 1e-6) for b, t in dict(table).items())
            except (TypeError, ValueError):
                raise bad from None
            if cards < 2 or len(pairs) < 2 or any(b <= 0 or t <= 0 for b, t in pairs):
                raise bad
            latency[cards] = tuple(pairs)
        override = None
        if r.has("batch_defaults"):
            bd = FieldReader(r.mapping("batch_defaults"), f"{r.where('batch_defaults')} batch_defaults")
            override = (bd.integer("max_num_batched_tokens"), bd.integer("max_num_seqs"))
        return cls(
            name=r.string("name"),
            description=r.string("description", ""),
            device_name=r.string("device_name", r.string("name")),
            num_cards=r.integer("num_cards", 1),
            memory_bytes=memory_bytes,
            usable_memory_bytes=usable,
            hbm_bandwidth=r.number("hbm_bandwidth_gb_s") * GB,
            peak_flops=peak,
            peak_flops_total=r.number("peak_flops_total_tflops", peak / 1e12) * 1e12,
            link_bandwidth=per_dir,
            link_bandwidth_aggregate=aggregate,
            allreduce_bandwidth_measured=allreduce,
            allreduce_latency_measured=latency,
            eta_f=r.number("eta_f", maximum=1.0),
            eta_a=r.number("eta_a", maximum=1.0),
            eta_m=r.number("eta_m", maximum=1.0),
            eta_c=r.number("eta_c", maximum=1.0),
            alpha_c=r.number("alpha_c_us", positive=False) * 1e-6,
            t0=r.number("t0_ms", positive=False) * 1e-3,
            t_seq=r.number("t_seq_us", positive=False) * 1e-6,
            default_block_size=_block_size(r),
            batch_defaults_override=override,
            graph_pool_in_kv_budget=r.boolean("graph_pool_in_kv_budget", True),
            api_server_s=r.number("api_server_ms", 0.0, positive=False) * 1e-3,
            tokenize_s_per_token=r.number("tokenize_us_per_token", 0.0, positive=False) * 1e-6,
            output_s=r.number("output_path_ms", 0.0, positive=False) * 1e-3,
            sources=load_sources(r),
            path=None if source.startswith("<") else source,
        )


KERNEL_BLOCK_MULTIPLE = 16
"""vLLM 0.33.0's CacheConfig takes any block_size > 0, but every attention backend of a GPU
(FlashAttention, FlashInfer, Triton, FlexAttention: ``get_supported_kernel_block_sizes``)
takes only multiples of 16, so another size ends in "No valid attention backend found"."""


def _memory_bytes(r: FieldReader, stem: str) -> int:
    """``memory: 80GiB`` (a size with its unit), ``memory_gib: 80`` or ``memory_gb: 80``."""
    given = [f for f in (stem, f"{stem}_gib", f"{stem}_gb") if r.has(f)]
    if len(given) > 1:
        raise r.error(given[1], f"give one of '{stem}', '{stem}_gib' or '{stem}_gb', not "
                                f"{' and '.join(repr(f) for f in given)}")
    if not given:
        raise InputError(f"{r.source}: missing required field '{stem}' (a size such as 80GiB; "
                         f"or '{stem}_gib' / '{stem}_gb')")
    field_name = given[0]
    if field_name == stem:
        value = r.raw(stem)
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise r.error(stem, f"a bare {value!r} names no unit; write {value}GiB (2**30 "
                                f"bytes) or {value}GB (10**9 bytes)")
        size = parse_size(value, f"{r.where(stem)}: field '{stem}'")
    else:
        unit = GiB if field_name.endswith("_gib") else GB
        size = int(round(r.number(field_name, maximum=MAX_CARD_BYTES / unit) * unit))
    if size <= 0:
        raise r.error(field_name, "must be > 0")
    return size


def _block_size(r: FieldReader) -> int:
    block = r.integer("default_block_size", 16)
    if block % KERNEL_BLOCK_MULTIPLE:
        raise r.error("default_block_size", f"{block} is no block size vLLM 0.33.0's attention "
                      f"backends take (a multiple of {KERNEL_BLOCK_MULTIPLE})")
    return block


def hardware_dir() -> Path:
    return data_dir() / "hardware"


def list_hardware() -> list[str]:
    """Names of the built-in hardware profiles (``data/hardware/*.yaml``)."""
    return sorted(p.stem for p in hardware_dir().glob("*.yaml"))


def load_hardware(name_or_path: str | Path | HardwareProfile) -> HardwareProfile:
    """A built-in profile by name, or a YAML file by path."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = hardware_dir() / f"{text}.yaml"
        if not path.is_file():
            known = ", ".join(list_hardware()) or "(none)"
            raise InputError(f"hardware: unknown profile {text!r}; known: {known}")
    elif not path.is_file():
        raise InputError(f"{path}: hardware profile file not found")
    data, lines = read_yaml_with_lines(path)
    return HardwareProfile.from_dict(data, str(path), lines)
