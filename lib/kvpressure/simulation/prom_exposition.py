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
from collections.abc import Callable, Mapping
from functools import lru_cache
from itertools import accumulate, chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from kvpressure.simulation.prom_accounting import PromAccounting
    from kvpressure.simulation.prom_histogram import Histogram

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
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    return _format_value_cached(value)


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


@lru_cache(maxsize=1 << 16)
def count_text(n: int) -> str:
    """``format_value`` of a count (a non-negative int): ``N.0`` below a million, where the
    general rule has no exponent, so a count seen for the first time (a histogram's growing
    cumulative counts) costs one string format."""
    return f"{n}.0" if n < 1_000_000 else _format_value(n)


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


# A sample's value: a constant, written into the template, or read from the accounting.
Source = float | Callable[[Any], float]


def _value_producer(get: Callable[[Any], float]) -> Callable[[Any], list[str]]:
    """A sample's text from the accounting, at each scrape."""
    return lambda acc: [format_value(float(get(acc)))]


class _HistogramSlot:
    """A histogram's numbers as the template takes them (cumulative bucket counts, count,
    sum), formatted again only when an observation was added since the last rendering."""

    __slots__ = ("attr", "n", "total", "values")

    def __init__(self, attr: str) -> None:
        self.attr = attr
        self.n = -1
        self.total = 0.0
        self.values: list[str] = []

    def __call__(self, acc: PromAccounting) -> list[str]:
        h: Histogram = getattr(acc, self.attr)
        n, total, counts = h.numbers()
        if n != self.n or total != self.total:
            self.n, self.total = n, total
            self.values = [*map(count_text, accumulate(counts)), count_text(n),
                           format_value(total)]
        return self.values


class Exposition:
    """Renders the accounting's state as one scrape. A scrape's text is fixed but for its
    numbers, so it is laid out once as a template (every HELP/TYPE line, label set, bucket
    bound and ``_created`` sample written and JSON-escaped once); a rendering formats the
    numbers and joins them into it. A histogram no observation reached since the last
    rendering keeps its formatted numbers."""

    def __init__(self, model_name: str, engine: str, created_s: float,
                 cache_config: Mapping[str, Any]) -> None:
        self.base = {"engine": engine, "model_name": model_name}
        self.base_str = label_string(self.base)
        self.created = format_value(created_s)
        info = {str(k): _info_value(v) for k, v in cache_config.items()}
        info["engine"] = engine
        self.info_labels = label_string(info)
        # Built at the first rendering (the histograms' bounds come with the accounting):
        # literal text around the values, len(values) + 1 pieces, plain and JSON-escaped.
        self._plain: list[str] = []
        self._escaped: list[str] = []
        self._producers: list[Callable[[PromAccounting], list[str]]] = []
        self._last_values: list[str] = []
        self._last_escaped = ""

    # --- the template ----------------------------------------------------------------------
    def _build(self, acc: PromAccounting) -> None:
        lits = [""]
        producers = self._producers
        base, base_str, created = self.base, self.base_str, self.created

        def text(s: str) -> None:
            lits[-1] += s

        def family(name: str, kind: str, help_text: str,
                   rows: list[tuple[str, Source]]) -> None:
            text(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            for labels, source in rows:
                text(f"{name}{labels} ")
                if callable(source):
                    producers.append(_value_producer(source))
                    lits.append("\n")
                else:
                    text(f"{format_value(float(source))}\n")

        def counter(name: str, help_text: str, sources: Mapping[str, Source] | Source,
                    label: str | None = None, base_labels: Mapping[str, str] | None = None
                    ) -> None:
            b = base if base_labels is None else base_labels
            if label is None:
                rows = [(label_string(b), cast(Source, sources))]
            else:
                rows = [(label_string({**b, label: k}), v)
                        for k, v in cast(Mapping[str, Source], sources).items()]
            family(f"{name}_total", "counter", help_text, rows)
            cname = f"{name}_created"
            text(f"# HELP {cname} {help_text}\n# TYPE {cname} gauge\n")
            for labels, _ in rows:
                text(f"{cname}{labels} {created}\n")

        def gauge(name: str, help_text: str, source: Source) -> None:
            family(name, "gauge", help_text, [(base_str, source)])

        def histogram(name: str, help_text: str, attr: str) -> None:
            bounds = getattr(acc, attr).bounds
            text(f"# HELP {name} {help_text}\n# TYPE {name} histogram\n")
            before = [f"{name}_bucket{label_string({**base, 'le': format_value(b)})} "
                      for b in (*bounds, math.inf)]
            text(before[0])
            # One value a bucket, then the count and the sum: one literal after each.
            producers.append(_HistogramSlot(attr))
            lits.extend("\n" + b for b in before[1:])
            lits.append(f"\n{name}_count{base_str} ")
            lits.append(f"\n{name}_sum{base_str} ")
            lits.append(f"\n# HELP {name}_created {help_text}\n# TYPE {name}_created gauge\n"
                        f"{name}_created{base_str} {created}\n")

        _describe(counter, gauge, family, histogram, base, self.info_labels)
        self._plain = lits
        self._escaped = [json.dumps(lit)[1:-1] for lit in lits]

    def _values(self, acc: PromAccounting) -> list[str]:
        if not self._plain:
            self._build(acc)
        values: list[str] = []
        for produce in self._producers:
            values += produce(acc)
        return values

    # --- one scrape ------------------------------------------------------------------------
    def render(self, acc: PromAccounting) -> str:
        """One scrape in the Prometheus text format."""
        values = self._values(acc)
        return _fill(self._plain, values)

    def render_escaped(self, acc: PromAccounting) -> str:
        """``render()`` escaped as the inside of a JSON string (escaping is per character, so
        the template is escaped once and the numbers need none). An unchanged state gives the
        same string object, so that scrapes of it share their text."""
        values = self._values(acc)
        if values != self._last_values or not self._last_escaped:
            self._last_values = values
            self._last_escaped = _fill(self._escaped, values)
        return self._last_escaped


def _fill(literals: list[str], values: list[str]) -> str:
    """The literals with the values between them (one value fewer than literals)."""
    return literals[0] + "".join(chain.from_iterable(zip(values, literals[1:], strict=True)))


def _describe(counter: Callable[..., None], gauge: Callable[..., None],
              family: Callable[..., None], histogram: Callable[..., None],
              base: Mapping[str, str], info_labels: str) -> None:
    """Every family of a scrape, in the exporter's order: what it is called, what it holds,
    and where each sample's value comes from (a constant for what is not modelled)."""
    counter("vllm:estimated_flops_per_gpu", "Estimated floating-point operations per GPU "
            "(MFU accounting; not modelled, stays 0).", 0.0)
    counter("vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU (MFU "
            "accounting; not modelled, stays 0).", 0.0)
    counter("vllm:estimated_write_bytes_per_gpu", "Estimated bytes written per GPU (MFU "
            "accounting; not modelled, stays 0).", 0.0)
    gauge("vllm:num_requests_running", "Requests in the running list after the last step.",
          attrgetter("num_running"))
    gauge("vllm:num_requests_waiting", "Requests waiting for admission (all reasons).",
          attrgetter("num_waiting"))
    family("vllm:num_requests_waiting_by_reason", "gauge",
           "Waiting requests split by reason: capacity (no room) or deferred (held by a "
           "transient constraint); the two add up to vllm:num_requests_waiting.",
           [(label_string({**base, "reason": "capacity"}),
             lambda a: a.num_waiting - a.num_waiting_deferred),
            (label_string({**base, "reason": "deferred"}), attrgetter("num_waiting_deferred"))])
    family("vllm:engine_sleep_state", "gauge",
           "Sleep state of the engine (awake = 1 while serving).",
           [(label_string({**base, "sleep_state": s}), 1.0 if s == "awake" else 0.0)
            for s in SLEEP_STATES])
    gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
          attrgetter("kv_usage"))
    counter("vllm:prefix_cache_queries", "Tokens looked up in the prefix cache at first "
            "admissions.", attrgetter("prefix_cache_queries"))
    counter("vllm:prefix_cache_hits", "Tokens found in the prefix cache at first admissions.",
            attrgetter("prefix_cache_hits"))
    counter("vllm:external_prefix_cache_queries", "Tokens looked up through a KV connector "
            "(none here).", 0.0)
    counter("vllm:external_prefix_cache_hits", "Tokens found through a KV connector (none "
            "here).", 0.0)
    counter("vllm:mm_cache_queries", "Multimodal cache lookups (none here).", 0.0)
    counter("vllm:mm_cache_hits", "Multimodal cache hits (none here).", 0.0)
    counter("vllm:num_preemptions", "Preemptions, counted when the preempted request next "
            "emits output.", attrgetter("num_preemptions"))
    counter("vllm:prompt_tokens", "Prompt tokens, counted once per request at its first "
            "output.", attrgetter("prompt_tokens"))
    counter("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
            {"local_compute": attrgetter("prompt_local_compute"),
             "local_cache_hit": attrgetter("prompt_local_cache_hit"),
             "external_kv_transfer": 0.0}, label="source")
    counter("vllm:prompt_tokens_cached", "Prompt tokens served from a cache (local and "
            "external).", attrgetter("prompt_cached"))
    counter("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the tier that "
            "held them, counted at admission.",
            {s: (attrgetter("prefix_cache_hits") if s == "device" else 0.0)
             for s in CACHE_HIT_SOURCES}, label="source")
    counter("vllm:generation_tokens", "Tokens generated (one per output per request).",
            attrgetter("generation_tokens"))
    counter("vllm:request_success", "Finished requests by finish reason.",
            {r: (lambda a, r=r: a.request_success[r]) for r in FINISHED_REASONS},
            label="finished_reason")
    counter("vllm:admission_rejections", "Requests the frontend refused at a queue limit "
            "(none here).", dict.fromkeys(ADMISSION_REJECTION_REASONS, 0.0), label="reason",
            base_labels={"model_name": base["model_name"]})
    histogram("vllm:request_prompt_tokens", "Prompt length of finished requests.", "h_prompt")
    histogram("vllm:request_generation_tokens", "Generated tokens of finished requests.",
              "h_generation")
    histogram("vllm:iteration_tokens_total", "Tokens per step with output: prompt tokens of "
              "first outputs plus generated tokens.", "h_iteration")
    histogram("vllm:request_max_num_generation_tokens", "Largest generated length among a "
              "finished request's samples.", "h_max_generation")
    histogram("vllm:request_params_n", "The n sampling parameter of finished requests.", "h_n")
    histogram("vllm:request_params_max_tokens", "The max_tokens parameter of finished "
              "requests.", "h_max_tokens")
    histogram("vllm:time_to_first_token_seconds", "Seconds from arrival to first output.",
              "h_ttft")
    histogram("vllm:inter_token_latency_seconds", "Seconds between consecutive outputs of a "
              "request.", "h_itl")
    histogram("vllm:request_time_per_output_token_seconds", "Mean seconds per output token "
              "after the first, per finished request.", "h_tpot")
    histogram("vllm:e2e_request_latency_seconds", "Seconds from arrival to finish.", "h_e2e")
    histogram("vllm:request_queue_time_seconds", "Seconds from first queued to first "
              "scheduled.", "h_queue")
    histogram("vllm:request_inference_time_seconds", "Seconds from first scheduled to last "
              "token.", "h_inference")
    histogram("vllm:request_prefill_time_seconds", "Seconds from first scheduled to first "
              "token.", "h_prefill")
    histogram("vllm:request_decode_time_seconds", "Seconds from first to last token.",
              "h_decode")
    histogram("vllm:request_num_preemptions", "Preemptions per finished request.",
              "h_preemptions")
    histogram("vllm:request_prefill_kv_computed_tokens", "Prompt tokens computed at prefill "
              "(cache hits excluded), per finished request.", "h_prefill_kv")
    family("vllm:cache_config_info", "gauge", "KV-cache configuration of the engine.",
           [(info_labels, 1.0)])
