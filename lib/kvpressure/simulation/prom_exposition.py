"""How vLLM 0.33.0's ``/metrics`` writes what the accounting holds: the families it exports
(names, types, HELP texts, label sets), the bucket layouts of its histograms, and the text
format of ``prometheus_client.generate_latest`` (``_created`` samples as separate gauges,
labels sorted, Go-style floats), so that any Prometheus parser reads a simulated scrape.
HELP texts are our own words; names, types, labels and buckets are vLLM 0.33.0's.

What is counted, and when, is ``prom_accounting.py``'s business; this module only renders it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpressure.simulation.prom_accounting import Histogram, PromAccounting

# --- vLLM 0.33.0's bucket families (v1/metrics/buckets.py) --------------------------------------
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                               2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """1-2-5 series up to ``max_model_len`` (vLLM's ``request_tokens`` family)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


# --- label sets ---------------------------------------------------------------------------------
WAITING_REASONS = ("capacity", "deferred")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

MODELLED_FAMILIES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
    "vllm:prompt_tokens", "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_cached_by_source", "vllm:generation_tokens", "vllm:request_success",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total", "vllm:request_max_num_generation_tokens",
    "vllm:request_params_n", "vllm:request_params_max_tokens",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_num_preemptions", "vllm:request_prefill_kv_computed_tokens",
    "vllm:cache_config_info",
)
"""Families whose values the simulation produces. The others are exported with the values a
plain text-only server without connectors, multimodal input or MFU accounting shows (zeros,
``engine_sleep_state{awake}`` = 1)."""


# --- values and labels as the client library writes them ----------------------------------------
def format_value(value: float) -> str:
    """A sample value or ``le`` bound written as vLLM's exporter (prometheus_client) writes it:
    see ``_format_value``. Memoised (bucket counts and bounds repeat from scrape to scrape),
    except for zeros, whose sign the cache would merge."""
    return _format_value(value) if value == 0 else _format_value_cached(value)


def _format_value(value: float) -> str:
    """A sample value or ``le`` bound written as vLLM's exporter (prometheus_client) writes it:
    Python's shortest repr, ``+Inf``/``-Inf``/``NaN``, and the exponent form Go uses once a
    positive number has seven or more integer digits (``1.234567e+06``). Written here rather
    than imported so that ``kvpressure simulate`` does not load the whole client library."""
    value = float(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    point = text.find(".")
    if value > 0 and point > 6:
        digits = (text[:point] + text[point + 1:]).rstrip("0")
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e+{point - 1:02d}"
    return text


_format_value_cached = lru_cache(maxsize=1 << 16)(_format_value)


def label_string(pairs: Mapping[str, str]) -> str:
    """``{k="v",...}`` with the labels sorted and escaped as the client library does."""
    return _labels_cached(tuple(sorted((str(k), str(v)) for k, v in pairs.items())))


@lru_cache(maxsize=4096)
def _labels_cached(pairs: tuple[tuple[str, str], ...]) -> str:
    inner = ",".join(
        '{}="{}"'.format(k, str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
        for k, v in pairs
    )
    return "{" + inner + "}" if inner else ""


def _info_value(value: Any) -> str:
    # vLLM renders config values with str(): True/False, None, 0.9
    return "None" if value is None else str(value)


# A rendered family: (the values it shows, its text, its text escaped inside a JSON string).
Part = tuple[Any, str, str]


class Exposition:
    """Renders the accounting's state as one scrape, family by family. A family whose values
    did not change since the last rendering is reused as is (between two scrapes most
    families, every per-request histogram until a request finishes, stay the same), and the
    fixed text around a histogram's numbers is built once."""

    def __init__(self, model_name: str, engine: str, created_s: float,
                 cache_config: Mapping[str, Any]) -> None:
        self.base = {"engine": engine, "model_name": model_name}
        self.base_str = label_string(self.base)
        self.created = format_value(created_s)
        info = {str(k): _info_value(v) for k, v in cache_config.items()}
        info["engine"] = engine
        self.info_labels = label_string(info)
        self._cache: dict[str, Part] = {}
        self._histogram_frames: dict[str, tuple[str, list[str], str, str, str]] = {}
        self._waiting_labels = [label_string({**self.base, "reason": r})
                                for r in WAITING_REASONS]
        self._sleep_labels = [label_string({**self.base, "sleep_state": s})
                              for s in SLEEP_STATES]

    # --- one family ------------------------------------------------------------------------
    def _reuse(self, out: list[Part], name: str, key: Any) -> bool:
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            out.append(hit)
            return True
        return False

    def _family(self, out: list[Part], name: str, kind: str, help_text: str,
                samples: list[tuple[str, str, float]], created_labels: list[str] | None = None,
                key: Any = None) -> None:
        if key is None:
            key = tuple((labels, v) for _, labels, v in samples)
            if self._reuse(out, name, key):
                return
        text = [f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"]
        for sname, labels, value in samples:
            text.append(f"{sname}{labels} {format_value(value)}\n")
        if created_labels is not None:
            stem = name.removesuffix("_total") if kind == "counter" else name
            cname = f"{stem}_created"
            text.append(f"# HELP {cname} {help_text}\n# TYPE {cname} gauge\n")
            for labels in created_labels:
                text.append(f"{cname}{labels} {self.created}\n")
        joined = "".join(text)
        entry = (key, joined, json.dumps(joined)[1:-1])
        self._cache[name] = entry
        out.append(entry)

    def _counter(self, out: list[Part], name: str, help_text: str,
                 values: Mapping[str, float] | float, label: str | None = None,
                 base_labels: Mapping[str, str] | None = None) -> None:
        fam = f"{name}_total"
        key = (float(values),) if label is None else tuple(values.items())
        if self._reuse(out, fam, key):
            return
        b = self.base if base_labels is None else base_labels
        if label is None:
            labels = [label_string(b)]
            samples = [(fam, labels[0], float(values))]
        else:
            labels = [label_string({**b, label: k}) for k in values]
            samples = [(fam, lab, float(v)) for lab, v in zip(labels, values.values(), strict=True)]
        self._family(out, fam, "counter", help_text, samples, labels, key=key)

    def _gauge(self, out: list[Part], name: str, help_text: str, value: float) -> None:
        self._family(out, name, "gauge", help_text, [(name, self.base_str, float(value))])

    def _histogram(self, out: list[Part], name: str, help_text: str, h: Histogram) -> None:
        key = (h.n, h.total)
        if self._reuse(out, name, key):
            return
        frame = self._histogram_frames.get(name)
        if frame is None:
            # The fixed text around the numbers: header, one "name_bucket{le} " prefix per
            # bucket (each after the previous line's newline), count/sum/_created lines.
            base = self.base_str
            bucket = f"{name}_bucket"
            prefixes = [("\n" if i else "") + f"{bucket}{labels} "
                        for i, labels in enumerate(self._bucket_labels(h.bounds))]
            frame = (f"# HELP {name} {help_text}\n# TYPE {name} histogram\n", prefixes,
                     f"\n{name}_count{base} ", f"\n{name}_sum{base} ",
                     f"\n# HELP {name}_created {help_text}\n# TYPE {name}_created gauge\n"
                     f"{name}_created{base} {self.created}\n")
            self._histogram_frames[name] = frame
        header, prefixes, count_pre, sum_pre, tail = frame
        # Cumulative counts are non-negative ints: the memoised formatter is exact for them
        # (no negative zero to tell apart).
        buckets = "".join(map(str.__add__, prefixes,
                              map(_format_value_cached, accumulate(h.counts))))
        joined = (f"{header}{buckets}{count_pre}{format_value(h.n)}"
                  f"{sum_pre}{format_value(h.total)}{tail}")
        entry = (key, joined, json.dumps(joined)[1:-1])
        self._cache[name] = entry
        out.append(entry)

    def _bucket_labels(self, bounds: Sequence[float]) -> list[str]:
        return [label_string({**self.base, "le": format_value(b)}) for b in (*bounds, math.inf)]

    # --- one scrape ------------------------------------------------------------------------
    def parts(self, acc: PromAccounting) -> list[Part]:
        """Every family of one scrape of ``acc``, in the exporter's order."""
        out: list[Part] = []
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        zero = 0.0
        counter(out, "vllm:estimated_flops_per_gpu", "Estimated floating-point operations per "
                "GPU (MFU accounting; not modelled, stays 0).", zero)
        counter(out, "vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU (MFU "
                "accounting; not modelled, stays 0).", zero)
        counter(out, "vllm:estimated_write_bytes_per_gpu", "Estimated bytes written per GPU "
                "(MFU accounting; not modelled, stays 0).", zero)
        gauge(out, "vllm:num_requests_running", "Requests in the running list after the last "
              "step.", acc.num_running)
        gauge(out, "vllm:num_requests_waiting", "Requests waiting for admission (all reasons).",
              acc.num_waiting)
        self._family(out, "vllm:num_requests_waiting_by_reason", "gauge",
                     "Waiting requests split by reason: capacity (no room) or deferred (held "
                     "by a transient constraint); the two add up to vllm:num_requests_waiting.",
                     [("vllm:num_requests_waiting_by_reason", labels, float(v))
                      for labels, v in zip(self._waiting_labels,
                                           (acc.num_waiting - acc.num_waiting_deferred,
                                            acc.num_waiting_deferred), strict=True)])
        self._family(out, "vllm:engine_sleep_state", "gauge",
                     "Sleep state of the engine (awake = 1 while serving).",
                     [("vllm:engine_sleep_state", labels, 1.0 if s == "awake" else 0.0)
                      for labels, s in zip(self._sleep_labels, SLEEP_STATES, strict=True)])
        gauge(out, "vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
              acc.kv_usage)
        counter(out, "vllm:prefix_cache_queries", "Tokens looked up in the prefix cache at "
                "first admissions.", acc.prefix_cache_queries)
        counter(out, "vllm:prefix_cache_hits", "Tokens found in the prefix cache at first "
                "admissions.", acc.prefix_cache_hits)
        counter(out, "vllm:external_prefix_cache_queries", "Tokens looked up through a KV "
                "connector (none here).", zero)
        counter(out, "vllm:external_prefix_cache_hits", "Tokens found through a KV connector "
                "(none here).", zero)
        counter(out, "vllm:mm_cache_queries", "Multimodal cache lookups (none here).", zero)
        counter(out, "vllm:mm_cache_hits", "Multimodal cache hits (none here).", zero)
        counter(out, "vllm:num_preemptions", "Preemptions, counted when the preempted request "
                "next emits output.", acc.num_preemptions)
        counter(out, "vllm:prompt_tokens", "Prompt tokens, counted once per request at its "
                "first output.", acc.prompt_tokens)
        counter(out, "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came "
                "from.", {"local_compute": acc.prompt_local_compute,
                          "local_cache_hit": acc.prompt_local_cache_hit,
                          "external_kv_transfer": 0}, label="source")
        counter(out, "vllm:prompt_tokens_cached", "Prompt tokens served from a cache (local "
                "and external).", acc.prompt_cached)
        counter(out, "vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the "
                "tier that held them, counted at admission.",
                {s: (acc.prefix_cache_hits if s == "device" else 0) for s in CACHE_HIT_SOURCES},
                label="source")
        counter(out, "vllm:generation_tokens", "Tokens generated (one per output per request).",
                acc.generation_tokens)
        counter(out, "vllm:request_success", "Finished requests by finish reason.",
                acc.request_success, label="finished_reason")
        counter(out, "vllm:admission_rejections", "Requests the frontend refused at a queue "
                "limit (none here).", dict.fromkeys(ADMISSION_REJECTION_REASONS, 0),
                label="reason", base_labels={"model_name": self.base["model_name"]})
        histogram(out, "vllm:request_prompt_tokens", "Prompt length of finished requests.",
                  acc.h_prompt)
        histogram(out, "vllm:request_generation_tokens", "Generated tokens of finished "
                  "requests.", acc.h_generation)
        histogram(out, "vllm:iteration_tokens_total", "Tokens per step with output: prompt "
                  "tokens of first outputs plus generated tokens.", acc.h_iteration)
        histogram(out, "vllm:request_max_num_generation_tokens", "Largest generated length "
                  "among a finished request's samples.", acc.h_max_generation)
        histogram(out, "vllm:request_params_n", "The n sampling parameter of finished "
                  "requests.", acc.h_n)
        histogram(out, "vllm:request_params_max_tokens", "The max_tokens parameter of finished "
                  "requests.", acc.h_max_tokens)
        histogram(out, "vllm:time_to_first_token_seconds", "Seconds from arrival to first "
                  "output.", acc.h_ttft)
        histogram(out, "vllm:inter_token_latency_seconds", "Seconds between consecutive "
                  "outputs of a request.", acc.h_itl)
        histogram(out, "vllm:request_time_per_output_token_seconds", "Mean seconds per output "
                  "token after the first, per finished request.", acc.h_tpot)
        histogram(out, "vllm:e2e_request_latency_seconds", "Seconds from arrival to finish.",
                  acc.h_e2e)
        histogram(out, "vllm:request_queue_time_seconds", "Seconds from first queued to first "
                  "scheduled.", acc.h_queue)
        histogram(out, "vllm:request_inference_time_seconds", "Seconds from first scheduled to "
                  "last token.", acc.h_inference)
        histogram(out, "vllm:request_prefill_time_seconds", "Seconds from first scheduled to "
                  "first token.", acc.h_prefill)
        histogram(out, "vllm:request_decode_time_seconds", "Seconds from first to last token.",
                  acc.h_decode)
        histogram(out, "vllm:request_num_preemptions", "Preemptions per finished request.",
                  acc.h_preemptions)
        histogram(out, "vllm:request_prefill_kv_computed_tokens", "Prompt tokens computed at "
                  "prefill (cache hits excluded), per finished request.", acc.h_prefill_kv)
        self._family(out, "vllm:cache_config_info", "gauge", "KV-cache configuration of the "
                     "engine.", [("vllm:cache_config_info", self.info_labels, 1.0)])
        return out

    def render(self, acc: PromAccounting) -> str:
        """One scrape in the Prometheus text format."""
        return "".join(part[1] for part in self.parts(acc))

    def render_escaped(self, acc: PromAccounting) -> str:
        """``render()`` escaped as the inside of a JSON string (escaping is per character, so
        each family's escaped text is kept with it)."""
        return "".join(part[2] for part in self.parts(acc))
