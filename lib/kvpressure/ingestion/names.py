"""One canonical set of metric names across vLLM generations.

The canonical names are vLLM V1's wire names as 0.33.0 exposes them in the plain text format:
counters with ``_total`` (``vllm:num_preemptions_total``), histograms as ``_bucket`` (with an
``le`` label), ``_sum`` and ``_count``, gauges bare (``vllm:kv_cache_usage_perc``).

Spellings that reach us and what they become:

* ``vllm_num_requests_running``: a Prometheus server that scraped with OpenMetrics negotiation
  stores names with the colon escaped to ``_``; ``vllm_`` becomes ``vllm:``.
* ``vllm:num_preemptions`` typed counter (OpenMetrics family name, or a source that drops the
  suffix): ``_total`` is appended.
* ``vllm:num_preemptions_created``: the counter's creation time; not a series of its own
  (dropped unless asked for, its value is kept to tell where counters started).
* V0 and early V1 names that vLLM later renamed (``vllm:gpu_cache_usage_perc`` ->
  ``vllm:kv_cache_usage_perc``, ...); names that exist only in V0 (``vllm:num_requests_swapped``,
  ``vllm:cpu_cache_usage_perc``) are kept as they are, there is nothing to map them to.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "vllm:"
ESCAPED_PREFIX = "vllm_"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# The series the analysis reads, by canonical name (histograms by their base name).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
ITL = "vllm:inter_token_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
PROMPT_LENGTHS = "vllm:request_prompt_tokens"
GENERATION_LENGTHS = "vllm:request_generation_tokens"

# vLLM 0.33.0 families (its exporter, v1/metrics/loggers.py), by type. Counter bases are listed
# without ``_total``.
V1_COUNTERS = frozenset(
    {
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached",
        "vllm:prompt_tokens_cached_by_source",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:admission_rejections",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:external_prefix_cache_queries",
        "vllm:external_prefix_cache_hits",
        "vllm:mm_cache_queries",
        "vllm:mm_cache_hits",
        "vllm:corrupted_requests",
        "vllm:watermark_requests",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:estimated_flops_per_gpu",
        "vllm:estimated_read_bytes_per_gpu",
        "vllm:estimated_write_bytes_per_gpu",
    }
)
V1_GAUGES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:kv_cache_usage_perc",
        "vllm:engine_sleep_state",
        "vllm:cache_config_info",
        "vllm:lora_requests_info",
    }
)
V1_HISTOGRAMS = frozenset(
    {
        "vllm:iteration_tokens_total",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_n",
        "vllm:request_params_max_tokens",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_num_preemptions",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:kv_block_lifetime_seconds",
        "vllm:kv_block_idle_before_evict_seconds",
        "vllm:kv_block_reuse_gap_seconds",
    }
)

# Families renamed between generations: old family -> V1 family. Both sides are family names
# (counters without ``_total``), so samples keep their suffix.
RENAMED = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    # V0 and V1 up to ~0.10 observed the interval between consecutive tokens under this name;
    # later V1 calls the same observation inter_token_latency.
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}

# Present only in V0 (the engine with swapping and CPU blocks).
V0_ONLY = frozenset(
    {
        "vllm:num_requests_swapped",
        "vllm:cpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:cpu_prefix_cache_hit_rate",
        "vllm:avg_prompt_throughput_toks_per_s",
        "vllm:avg_generation_throughput_toks_per_s",
        "vllm:model_forward_time_milliseconds",
        "vllm:model_execute_time_milliseconds",
    }
)
# Early V1 (0.8-0.10) exported these before the renames above.
V1_EARLY = frozenset(
    {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"}
)
# Families that exist only in recent V1 exporters; their presence dates the source.
V1_RECENT = frozenset(
    {
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting_by_reason",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached_by_source",
        "vllm:engine_sleep_state",
        "vllm:admission_rejections",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_num_preemptions",
    }
)

# Families the analysis reads; everything else is carried along but not required.
CORE_FAMILIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
)
# Families ``--metrics core`` keeps: the ones above plus what the recompute estimate and the
# symptom checklist use.
ANALYSIS_FAMILIES = CORE_FAMILIES + (
    "vllm:num_requests_waiting_by_reason",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:cache_config_info",
    "vllm:iteration_tokens_total",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_num_preemptions",
    # V0 spellings of the same things survive the filter through RENAMED.
    "vllm:num_requests_swapped",
)

# Labels naming the scrape target rather than what is measured: dropped when single-valued.
TARGET_LABELS = ("model_name", "engine", "job", "instance")


@dataclass(frozen=True)
class NameInfo:
    """How one sample name was understood."""

    canonical: str | None  # None: not a series (a ``_created`` sample)
    family: str  # canonical family (counters without ``_total``)
    kind: str  # counter | gauge | histogram | info | unknown
    mapped_from: str | None  # the original spelling when it differed
    created: bool = False


def unescape(name: str) -> str:
    """``vllm_foo`` (a Prometheus server's escaped spelling) -> ``vllm:foo``."""
    if name.startswith(ESCAPED_PREFIX):
        return PREFIX + name[len(ESCAPED_PREFIX) :]
    return name


def _split_histogram(name: str, family_type: str | None) -> tuple[str, str] | None:
    typed = family_type in ("histogram", "gaugehistogram")
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            base = RENAMED.get(base, base)
            if base in V1_HISTOGRAMS or typed:
                return base, suffix
    return None


def canonical_name(sample_name: str, family_type: str | None = None) -> NameInfo:
    """The canonical V1 wire name of one sample name.

    ``family_type`` is the ``# TYPE`` of the family the sample appeared under (``None`` when the
    source carries no types, as the Prometheus HTTP API).
    """
    name = unescape(sample_name)
    original = sample_name

    if name.endswith("_created"):
        stem = name[: -len("_created")]
        return NameInfo(None, RENAMED.get(stem, stem), "counter", None, created=True)

    hist = _split_histogram(name, family_type)
    if hist is not None:
        base, suffix = hist
        canonical = base + suffix
        return NameInfo(canonical, base, "histogram", None if canonical == original else original)

    base = name[: -len("_total")] if name.endswith("_total") else name
    base = RENAMED.get(base, base)
    is_counter = base in V1_COUNTERS or (
        family_type == "counter" and base not in V1_GAUGES and base not in V1_HISTOGRAMS
    )
    if is_counter:
        canonical = base + "_total"
        kind = "counter"
    else:
        canonical = RENAMED.get(name, name)
        base = canonical
        if canonical in V1_GAUGES or family_type == "gauge":
            kind = "info" if canonical.endswith("_info") else "gauge"
        elif family_type in ("histogram", "summary"):
            kind = family_type
        else:
            kind = family_type or "unknown"
    return NameInfo(canonical, base, kind, None if canonical == original else original)


def written_family(name: str) -> str:
    """The family of a name as the source wrote it (unescaped, no ``_total`` or histogram
    suffix, not renamed): what generation detection looks at."""
    name = unescape(name)
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    if name.endswith("_total") and name not in V1_HISTOGRAMS:
        return name[: -len("_total")]
    return name


def detect_generation(families: set[str]) -> dict[str, object]:
    """Which vLLM generation a set of (original-spelling, unescaped) family names comes from."""
    v0 = sorted(families & V0_ONLY)
    early = sorted(families & V1_EARLY)
    recent = sorted(families & V1_RECENT)
    if v0:
        generation, why = "v0", v0
    elif early and not recent:
        generation, why = "v1-early", early
    elif recent:
        generation, why = "v1", recent
    elif any(f.startswith(PREFIX) for f in families):
        generation, why = "unknown-vllm", []
    else:
        generation, why = "not-vllm", []
    return {"generation": generation, "evidence": why}
