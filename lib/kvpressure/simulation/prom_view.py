"""The Prometheus view of a simulated run: what vLLM 0.33.0's ``/metrics`` would have shown.

``PromRecorder`` receives the engine's hooks and keeps the same counters, gauges and histograms
as vLLM's ``PrometheusStatLogger``, moved at the moments vLLM moves them:

* Engine events (QUEUED, SCHEDULED, PREEMPTED) travel with a request's *next output*; so
  ``vllm:num_preemptions_total`` grows only when the preempted request emits again, and a
  request's queue time uses its first QUEUED and first SCHEDULED timestamps.
* Prompt accounting (``prompt_tokens``, ``prompt_tokens_by_source``, ``prompt_tokens_cached``)
  is frozen at the first admission and counted once, with the request's first output.
* Prefix-cache queries and hits count first admissions only (re-admissions after preemption
  go to fields no exporter reads) and only with prefix caching on.
* ``generation_tokens`` grows by the new tokens of every output; ``iteration_tokens_total``
  takes one observation per step with at least one output: the prompt tokens computed for the
  requests whose first output is in that step plus the tokens generated in it. Recompute is
  invisible in every token counter, as on a real server.
* Gauges hold the scheduler state after the step's outputs were applied.
* Per-request histograms (E2E, queue, prefill, decode, inference, TPOT, prompt and generation
  lengths, preemptions, KV tokens computed at prefill) are observed when the request finishes.

Timestamps: a step's outputs carry the time the step ended; TTFT and E2E run from the
request's arrival, ITL between consecutive outputs of one request.

Scrapes are taken every ``scrape_interval_s`` of simulated time (at ``k * interval``, showing
every event stamped at or before that instant) plus a final one when the run ends. Each is one
line of ``metrics.prom.jsonl``: ``{"t": seconds, "text": "<Prometheus text format>"}``, written
in the exposition format of ``prometheus_client.generate_latest`` (``_created`` samples as
separate gauges, labels sorted, Go-style floats) so that any Prometheus parser reads it.
HELP texts are our own words; names, types, labels and buckets are vLLM 0.33.0's.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import accumulate, chain, groupby, repeat
from operator import sub
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError

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

# A ``metrics.prom.jsonl`` of more scrapes than this (tens of gigabytes) is refused: the run
# asks for an unreasonable file, not for a longer wait. Idle stretches cost no memory per
# scrape (one rendering shared by the whole stretch), so the bound is on the output alone.
MAX_SCRAPES = 500_000


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


class _Histogram:
    """Cumulative-bucket histogram with prometheus_client's ``le`` rule (value <= bound)."""

    __slots__ = ("bounds", "counts", "total", "n")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound (+Inf)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def observe_repeated(self, value: float, times: int) -> None:
        """``times`` observations of one value (added one by one, as a server would)."""
        if times <= 0:
            return
        self.counts[bisect_left(self.bounds, value)] += times
        # The sum is accumulated value by value (in C): float addition is not associative,
        # and the exporter's _sum is the running sum.
        self.total = deque(accumulate(repeat(value, times), initial=self.total), maxlen=1)[0]
        self.n += times

    def observe_runs(self, values: list[float], times: list[int]) -> None:
        """``times[i]`` observations of ``values[i]``, in order."""
        bounds, counts = self.bounds, self.counts
        for v, c in zip(values, times):  # noqa: B905 (parallel lists)
            counts[bisect_left(bounds, v)] += c
        seq = chain.from_iterable(map(repeat, values, times))
        self.total = deque(accumulate(seq, initial=self.total), maxlen=1)[0]
        self.n += sum(times)


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


def _floats(values: Sequence[float]) -> list[float]:
    """Plain floats: numpy arrays (timed runs) and lists (step-clock runs) alike, so this
    module needs no numpy on the light ``kvpressure simulate`` path."""
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else [float(v) for v in values]


class _RequestStats:
    """What the frontend keeps per request (vLLM's ``RequestStateStats`` and friends)."""

    __slots__ = (
        "arrival", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts",
        "num_generation_tokens", "num_preemptions", "pending_preemptions", "prompt_len",
        "max_tokens", "cached_at_first_admission", "is_prefilling", "admitted", "stream_join",
    )

    def __init__(self, arrival: float, queued: float, prompt_len: int, max_tokens: int):
        self.arrival = arrival
        self.queued_ts = queued
        self.scheduled_ts: float | None = None
        self.first_token_ts = 0.0
        self.last_token_ts = 0.0
        self.num_generation_tokens = 0
        self.num_preemptions = 0
        self.pending_preemptions = 0
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.cached_at_first_admission = 0
        self.is_prefilling = True
        self.admitted = False
        # The recorder's stream count when it joined the decode stream (PromRecorder._stream),
        # -1 outside it: inside, last_token_ts and num_generation_tokens lag (see there).
        self.stream_join = -1

    def take_preemptions(self) -> int:
        """The preemptions not yet reported: vLLM ships a PREEMPTED event with the request's
        next output, so they count from then on."""
        n = self.pending_preemptions
        self.num_preemptions += n
        self.pending_preemptions = 0
        return n


def _req_id(req: Any) -> str:
    try:
        return req.request_id
    except AttributeError:
        return str(req.id)


def _labels(pairs: Mapping[str, str]) -> str:
    return _labels_cached(tuple(sorted((str(k), str(v)) for k, v in pairs.items())))


@lru_cache(maxsize=4096)
def _labels_cached(pairs: tuple[tuple[str, str], ...]) -> str:
    inner = ",".join(
        '{}="{}"'.format(k, str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
        for k, v in pairs
    )
    return "{" + inner + "}" if inner else ""


class PromRecorder:
    """Records a simulated run as vLLM 0.33.0's Prometheus exporter would see it.

    ``cache_config`` holds the ``vllm:cache_config_info`` labels (at least ``num_gpu_blocks``,
    ``block_size``, ``gpu_memory_utilization``, ``enable_prefix_caching``); prefix-cache
    counters move only when ``enable_prefix_caching`` is true there.

    ``time_origin_s`` is the engine clock's reading when the run starts (0 for timed runs; 1.0
    for the fixed clock of step-level runs): scrapes fall at ``time_origin_s + k *
    scrape_interval_s`` and their ``t`` is counted from it. ``epoch_s`` is added to the origin
    for the ``_created`` samples (the wall-clock time the metrics were created).
    """

    def __init__(
        self,
        model_name: str = "simulated",
        *,
        scrape_interval_s: float = 5.0,
        max_model_len: int = 8192,
        cache_config: Mapping[str, Any] | None = None,
        engine: str = "0",
        epoch_s: float = 0.0,
        time_origin_s: float = 0.0,
    ) -> None:
        if not scrape_interval_s > 0:
            raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s!r}")
        self.model_name = model_name
        self.engine = str(engine)
        self.scrape_interval_s = float(scrape_interval_s)
        self.epoch_s = float(epoch_s)
        self.time_origin_s = float(time_origin_s)
        config = dict(cache_config or {})
        self.enable_prefix_caching = bool(config.get("enable_prefix_caching", False))
        self.cache_config = {
            "block_size": 16,
            "cache_dtype": "auto",
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.92,
            "num_gpu_blocks": None,
            "num_gpu_blocks_override": None,
            "prefix_caching_hash_algo": "sha256",
            **config,
        }
        self.scrapes = ScrapeLog(self.time_origin_s, self.scrape_interval_s)
        self._next_scrape_k = 1
        self._boundary = self.time_origin_s + self.scrape_interval_s
        self._last_t = self.time_origin_s
        self._closed = False
        self._pending_leap: tuple[list[_RequestStats], list[float]] | None = None

        # per-request frontend state, by request id and by the request object itself (the
        # engine hands the same objects to every hook: a lookup without Python per request)
        self._reqs: dict[str, _RequestStats] = {}
        self._by_req: dict[Any, _RequestStats] = {}
        # the step being assembled
        self._iter_has_output = False
        self._iter_tokens = 0
        self._step_queries = 0
        self._step_hits = 0
        # gauges
        self.num_running = 0
        self.num_waiting = 0
        self.num_waiting_deferred = 0
        self.kv_usage = 0.0
        # counters
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.prompt_local_compute = 0
        self.prompt_local_cache_hit = 0
        self.prompt_cached = 0
        self.generation_tokens = 0
        self.request_success = dict.fromkeys(FINISHED_REASONS, 0)
        # histograms
        tok = request_tokens_buckets(max_model_len)
        self.h_prompt = _Histogram(tok)
        self.h_generation = _Histogram(tok)
        self.h_iteration = _Histogram(ITERATION_TOKENS_BUCKETS)
        self.h_max_generation = _Histogram(tok)
        self.h_n = _Histogram(REQUEST_PARAMS_N_BUCKETS)
        self.h_max_tokens = _Histogram(tok)
        self.h_ttft = _Histogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self._h_itl = _Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.h_tpot = _Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.h_e2e = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_queue = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_inference = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_prefill = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_decode = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_preemptions = _Histogram(REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.h_prefill_kv = _Histogram(tok)

        self._base = {"engine": self.engine, "model_name": self.model_name}
        self._base_str = _labels(self._base)
        self._bucket_label_cache: dict[tuple[float, ...], list[str]] = {}
        self._family_cache: dict[str, tuple[Any, str, str]] = {}
        self._histogram_frames: dict[str, tuple[str, list[str], str, str, str]] = {}
        # Inter-token gaps not yet in h_itl, in order, as runs (gap, how many requests).
        self._itl_vals: list[float] = []
        self._itl_counts: list[int] = []
        # The decode stream: the states that emitted one token in every bulk step (plain
        # decode tokens, leapt steps) since they joined it. Their last_token_ts is _stream_t
        # and their num_generation_tokens lags by _stream_count - stream_join: a busy step
        # then costs set operations in C, not a line of Python per request. A state leaves
        # (its fields brought up to date) when it misses a bulk step or any other hook
        # touches it.
        self._stream: set[_RequestStats] = set()
        self._stream_batch: list[_RequestStats] | None = None
        self._stream_count = 0
        self._stream_t = 0.0
        # (requests, their states) of the last bulk hooks: see _states_of.
        self._last_batches: list[tuple[list[Any], list[_RequestStats]]] = []

    @property
    def h_itl(self) -> _Histogram:
        """The inter-token latency histogram, with every buffered gap observed."""
        self._observe_buffered_gaps()
        return self._h_itl

    def _observe_buffered_gaps(self) -> None:
        if self._itl_vals:
            self._h_itl.observe_runs(self._itl_vals, self._itl_counts)
            self._itl_vals = []
            self._itl_counts = []

    @classmethod
    def for_step_clock(cls, scenario: Any, t0: float = 1.0, dt: float = 0.015625,
                       scrape_every_steps: int = 50) -> PromRecorder:
        """The Prometheus view of a step-level workload under the engine's fixed clock (step k
        at ``t0 + k * dt``), scraped every ``scrape_every_steps`` steps like the reference
        runs' own metrics."""
        s = scenario.settings
        return cls(
            scenario.name or "simulated",
            scrape_interval_s=scrape_every_steps * dt,
            max_model_len=s.max_model_len,
            cache_config={"num_gpu_blocks": s.num_gpu_blocks, "block_size": s.block_size,
                          "enable_prefix_caching": s.enable_prefix_caching},
            time_origin_s=t0,
        )

    # --- scrape clock ------------------------------------------------------------------------
    @property
    def next_scrape_time(self) -> float:
        """Engine-clock time of the next periodic scrape."""
        return self._boundary

    def _advance_boundary(self) -> None:
        self._next_scrape_k += 1
        # k * interval, not a running sum: no drift over thousands of scrapes
        self._boundary = self.time_origin_s + self._next_scrape_k * self.scrape_interval_s

    def _last_due(self, t: float, inclusive: bool) -> int:
        """The last scrape index ``k`` whose boundary lies before ``t`` (at or before it when
        ``inclusive``), by the same float expression as ``_advance_boundary``."""
        origin, dt = self.time_origin_s, self.scrape_interval_s

        def due(k: int) -> bool:
            b = origin + k * dt
            return b <= t if inclusive else b < t

        k = max(self._next_scrape_k - 1, int((t - origin) / dt))
        while due(k + 1):
            k += 1
        while k >= self._next_scrape_k and not due(k):
            k -= 1
        return k

    def _scrape_due(self, t: float, inclusive: bool) -> None:
        """Take the scrapes due before ``t``. Nothing happens between them (every event is
        applied before its own time's scrapes are taken), so they all show one state: it is
        rendered once, whatever the number of scrapes, and an idle stretch costs O(1)."""
        if not (self._boundary <= t if inclusive else self._boundary < t):
            return
        last = self._last_due(t, inclusive)
        count = last - self._next_scrape_k + 1
        text = self._render_escaped()
        self._check_size(count, self.time_origin_s + last * self.scrape_interval_s, len(text))
        self.scrapes.add_periodic(self._next_scrape_k, count, text)
        self._next_scrape_k = last
        self._advance_boundary()

    def _flush_before(self, t: float) -> None:
        """Scrape every boundary strictly before ``t``: an event at ``t`` is not in them."""
        self._apply_pending_leap()
        self._scrape_due(t, False)

    def maybe_scrape(self, t: float) -> None:
        """Called after a step's outputs (stamped ``t``) were applied: take every scrape due at
        or before ``t``."""
        self._apply_pending_leap()
        self._scrape_due(t, True)
        if t > self._last_t:
            self._last_t = t

    def finish(self, t: float | None = None) -> None:
        """The run ended at ``t``: take the due scrapes and a final one (once)."""
        if self._closed:
            return
        t = self._last_t if t is None else t
        self.maybe_scrape(t)
        if not self.scrapes or self.scrapes[-1]["t"] < t - self.time_origin_s:
            text = self._render_escaped()
            self._check_size(1, t, len(text))
            self.scrapes.add_final(float(t) - self.time_origin_s, text)
        self._closed = True

    close = finish

    # --- engine hooks --------------------------------------------------------------------------
    def on_arrival(self, req: Any, t: float) -> None:
        """The request reached the engine at ``t`` (its QUEUED event)."""
        arrival = getattr(req, "arrival_time_s", None)
        arrival = t if arrival is None or (isinstance(arrival, float) and math.isnan(arrival)) \
            else float(arrival)
        prompt = int(getattr(req, "num_prompt_tokens", None) or req.prompt_len)
        max_tokens = int(getattr(req, "max_tokens", None) or req.output_len)
        st = _RequestStats(min(arrival, t), t, prompt, max_tokens)
        self._reqs[_req_id(req)] = st
        try:
            self._by_req[req] = st
        except TypeError:  # not hashable: found by id instead
            pass

    def on_scheduled(
        self, req: Any, t: float, num_tokens: int | None = None, hit_tokens: int | None = None,
        first_admission: bool | None = None,
    ) -> None:
        """The request was admitted to RUNNING by the ``schedule()`` of the step starting at
        ``t``. ``num_tokens`` (L) and ``hit_tokens`` (prefix-cache hit) default to the request's
        ``num_tokens`` and ``prefix_hit_tokens_at_admission``."""
        st = self._reqs[_req_id(req)]
        if st.scheduled_ts is None:
            st.scheduled_ts = t
        if first_admission is None:
            first_admission = not st.admitted and int(getattr(req, "num_preemptions", 0)) == 0
        st.admitted = True
        if not first_admission:
            return
        hit = int(hit_tokens if hit_tokens is not None
                  else getattr(req, "prefix_hit_tokens_at_admission", 0) or 0)
        st.cached_at_first_admission = hit
        if self.enable_prefix_caching:
            length = int(num_tokens if num_tokens is not None else req.num_tokens)
            self._step_queries += length
            self._step_hits += hit

    def on_preempted(self, req: Any, t: float) -> None:
        st = self._reqs[_req_id(req)]
        if st.stream_join >= 0:
            self._leave_stream(st)
        st.pending_preemptions += 1

    def on_output(self, req: Any, t: float, new_tokens: int = 1, finished: bool = False) -> None:
        """One output of one request, stamped ``t`` (the end of its step)."""
        if t > self._boundary or self._pending_leap is not None:
            self._flush_before(t)
        st = self._reqs[_req_id(req)]
        if st.stream_join >= 0:
            self._leave_stream(st)
        self._iter_has_output = True
        self.generation_tokens += new_tokens
        self._iter_tokens += new_tokens
        if st.pending_preemptions:
            self.num_preemptions += st.take_preemptions()
        if st.is_prefilling:
            computed = st.prompt_len - st.cached_at_first_admission
            self.prompt_tokens += st.prompt_len
            self.prompt_local_compute += computed
            self.prompt_local_cache_hit += st.cached_at_first_admission
            self.prompt_cached += st.cached_at_first_admission
            self._iter_tokens += computed
            self.h_ttft.observe(t - st.arrival)
            st.first_token_ts = t
            st.is_prefilling = False
        else:
            # the hottest line of a run: buffered, bucketed in bulk before the next scrape
            self._itl_vals.append(t - st.last_token_ts)
            self._itl_counts.append(1)
        st.last_token_ts = t
        st.num_generation_tokens += new_tokens
        if finished:
            self._finish_request(req, st, t)

    def on_decode_tokens(self, reqs: Iterable[Any], t: float) -> None:
        """``on_output`` of one decode token (neither first nor last) for each of ``reqs``, all
        stamped ``t`` within one step: the bulk form of the hottest path of a run."""
        if t > self._boundary or self._pending_leap is not None:
            self._flush_before(t)
        sts = self._states_of(reqs)
        n = len(sts)
        if n:
            self._stream_step(sts, t, 1, self._buffer_gaps, self._buffer_gap)
        if n:
            self._iter_has_output = True
            self.generation_tokens += n
            self._iter_tokens += n

    def _states_of(self, reqs: Iterable[Any]) -> list[_RequestStats]:
        """The frontend states of ``reqs``; the batch of one step is usually the batch of an
        earlier one (the same requests decoding on), so the last answers are kept."""
        reqs = reqs if isinstance(reqs, list) else list(reqs)
        batches = self._last_batches
        for batch, sts in batches:
            if len(batch) == len(reqs) and batch == reqs:  # identity of each request, in C
                return sts
        try:
            sts = list(map(self._by_req.__getitem__, reqs))
        except (KeyError, TypeError):  # requests that are not hashable (test doubles)
            states = self._reqs
            sts = [states[_req_id(r)] for r in reqs]
        # Two batches: a plain step's decoding head of ``running`` and a leap's whole batch
        # alternate.
        batches.insert(0, (reqs, sts))
        del batches[2:]
        return sts

    def _leave_stream(self, st: _RequestStats) -> None:
        """Bring a stream member's fields up to date and take it out of the stream."""
        st.num_generation_tokens += self._stream_count - st.stream_join
        st.last_token_ts = self._stream_t
        st.stream_join = -1
        self._stream.discard(st)
        self._stream_batch = None

    def _buffer_gaps(self, values: list[float]) -> None:
        for gap, same in groupby(values):  # mostly one gap shared by most of the batch
            self._buffer_gap(gap, len(list(same)))

    def _buffer_gap(self, value: float, times: int) -> None:
        vals = self._itl_vals
        if vals and vals[-1] == value:
            # the same gap as the run before it (consecutive steps of a fixed clock): one run
            self._itl_counts[-1] += times
        else:
            vals.append(value)
            self._itl_counts.append(times)

    def _stream_step(self, sts: list[_RequestStats], t: float, m: int, observe,
                     observe_repeated) -> None:
        """Every state of ``sts`` emits a token at ``t`` (the first of a run of steps): their
        inter-token gaps go to ``observe`` (a list) or ``observe_repeated`` (one gap for
        all), in ``sts`` order; members that missed the step
        leave the stream, newcomers join it. Advances the stream by ``m`` steps ending at
        ``t`` (a leap advances it itself, by its number of steps)."""
        stream = self._stream
        if sts is self._stream_batch or (len(sts) == len(stream) and stream.issuperset(sts)):
            # The batch is the stream (a batch holds each request once): one gap for all,
            # added one by one in C.
            observe_repeated(t - self._stream_t, len(sts))
            self._stream_batch = sts
        else:
            cur = set(sts)
            for st in stream - cur:
                self._leave_stream(st)
            newcomers = cur - stream
            if newcomers:
                st_t = self._stream_t
                observe([t - (st.last_token_ts if st.stream_join < 0 else st_t) for st in sts])
                count = self._stream_count
                for st in newcomers:
                    if st.pending_preemptions:
                        self.num_preemptions += st.take_preemptions()
                    # Its fields are current up to this step; from here on they lag.
                    st.stream_join = count
                stream |= newcomers
            else:
                observe_repeated(t - self._stream_t, len(sts))
            self._stream_batch = sts
        if m:
            self._stream_count += m
            self._stream_t = t

    def on_decode_leap(self, reqs: Iterable[Any], times: Sequence[float]) -> None:
        """Each request in ``reqs`` emitted one token at each of ``times`` (consecutive pure
        decode steps, in order; none of them finishes a request or admits one).

        Held until the matching ``on_steps_end`` brings the per-step gauges, so that a scrape
        falling inside the leap shows the state of the step before it."""
        self._apply_pending_leap()
        times = _floats(times)
        if times:
            self._pending_leap = (self._states_of(reqs), times)

    def on_steps_end(self, times: Sequence[float], num_running: Sequence[int],
                     num_waiting: Sequence[int], num_waiting_deferred: Sequence[int],
                     kv_usage: Sequence[float], prefix_queries: Sequence[int],
                     prefix_hits: Sequence[int]) -> None:
        """``on_step_end`` for a run of leapt steps (one entry per step)."""
        times = _floats(times)
        pending = self._pending_leap
        self._pending_leap = None
        for start, end in self._segments(times):
            if pending is not None:
                self._leap_segment(pending[0], times[start:end])
            last = end - 1
            self.num_running = int(num_running[last])
            self.num_waiting = int(num_waiting[last])
            self.num_waiting_deferred = int(num_waiting_deferred[last])
            self.kv_usage = float(kv_usage[last])

    def _segments(self, times: list[float]) -> Iterable[tuple[int, int]]:
        """Split a run of step times at the scrape boundaries, taking each scrape that falls
        before a segment first (so a scrape shows the state of the step before it)."""
        start = 0
        while start < len(times):
            self._flush_before(times[start])
            end = max(bisect_right(times, self.next_scrape_time), start + 1)
            yield start, end
            start = end

    def _apply_pending_leap(self) -> None:
        """A leap whose ``on_steps_end`` never came: apply its tokens, split at scrapes."""
        if self._pending_leap is None:
            return
        states, times = self._pending_leap
        self._pending_leap = None
        for start, end in self._segments(times):
            self._leap_segment(states, times[start:end])

    def _leap_segment(self, states: list[_RequestStats], times: list[float]) -> None:
        k = len(states)
        if k == 0:
            return
        m = len(times)
        self.generation_tokens += k * m
        self.h_iteration.observe_repeated(float(k), m)
        first, last = times[0], times[-1]
        self._stream_step(states, first, 0, self._buffer_gaps, self._buffer_gap)
        self._stream_count += m
        self._stream_t = last
        # each step of the leap: k requests see the same gap, in step order as a server would
        for gap, same in groupby(map(sub, times[1:], times[:-1])):
            self._buffer_gap(gap, k * len(list(same)))

    def on_step_end(
        self,
        t: float,
        num_running: int,
        num_waiting: int,
        num_waiting_deferred: int = 0,
        kv_usage: float = 0.0,
        prefix_queries: int | None = None,
        prefix_hits: int | None = None,
    ) -> None:
        """The step's outputs were applied at ``t``: vLLM's SchedulerStats and IterationStats
        for the step reach the exporter. ``prefix_queries``/``prefix_hits`` are the step's
        totals over new *and* resumed admissions; the exporter counts only first admissions,
        which the recorder tracks itself from ``on_scheduled``."""
        self._flush_before(t)
        # The step's inter-token gaps stay buffered (in order, with the leaps' ones) until the
        # next rendering: one bulk observation per scrape instead of one per step.
        if self._iter_has_output:
            self.h_iteration.observe(self._iter_tokens)
        self._iter_has_output = False
        self._iter_tokens = 0
        self.num_running = int(num_running)
        self.num_waiting = int(num_waiting)
        self.num_waiting_deferred = int(num_waiting_deferred)
        self.kv_usage = float(kv_usage)
        self.prefix_cache_queries += self._step_queries
        self.prefix_cache_hits += self._step_hits
        self._step_queries = 0
        self._step_hits = 0

    def _finish_request(self, req: Any, st: _RequestStats, t: float) -> None:
        self.request_success["length"] += 1
        scheduled = st.scheduled_ts if st.scheduled_ts is not None else st.queued_ts
        decode_time = st.last_token_ts - st.first_token_ts
        self.h_e2e.observe(t - st.arrival)
        self.h_queue.observe(scheduled - st.queued_ts)
        self.h_prefill.observe(st.first_token_ts - scheduled)
        self.h_inference.observe(st.last_token_ts - scheduled)
        self.h_decode.observe(decode_time)
        self.h_preemptions.observe(st.num_preemptions)
        self.h_prefill_kv.observe(st.prompt_len - max(st.cached_at_first_admission, 0))
        self.h_prompt.observe(st.prompt_len)
        self.h_generation.observe(st.num_generation_tokens)
        n_out = st.num_generation_tokens - 1
        self.h_tpot.observe(decode_time / n_out if n_out > 0 else 0)
        self.h_max_generation.observe(st.num_generation_tokens)
        self.h_n.observe(1)
        if st.max_tokens:
            self.h_max_tokens.observe(st.max_tokens)
        del self._reqs[_req_id(req)]
        try:
            self._by_req.pop(req, None)
        except TypeError:
            pass
        self._last_batches.clear()

    # --- exposition ----------------------------------------------------------------------------
    def _bucket_labels(self, bounds: tuple[float, ...]) -> list[str]:
        cached = self._bucket_label_cache.get(bounds)
        if cached is None:
            cached = [_labels({**self._base, "le": format_value(b)})
                      for b in (*bounds, math.inf)]
            self._bucket_label_cache[bounds] = cached
        return cached

    def _check_size(self, count: int, t: float, text_len: int) -> None:
        if len(self.scrapes) + count > MAX_SCRAPES:
            # Refused as soon as it is known: the file alone would be tens of gigabytes.
            n = len(self.scrapes) + count
            raise InputError(
                f"scrape_interval_s {self.scrape_interval_s:g}: the run reaches "
                f"{float(t) - self.time_origin_s:.4g} s of simulated time, {n:,} scrapes "
                f"(~{n * text_len / 1e9:,.3g} GB of metrics.prom.jsonl; at most "
                f"{MAX_SCRAPES:,}); "
                "raise scrape_interval_s, shorten the idle gaps, or leave the metrics out "
                "(--no-metrics)")

    def render(self) -> str:
        """The current state in the Prometheus text format."""
        return "".join(part[1] for part in self._render_parts())

    def _render_escaped(self) -> str:
        """``render()`` escaped as the inside of a JSON string (escaping is per character,
        so each family's escaped text is kept with it)."""
        return "".join(part[2] for part in self._render_parts())

    def _render_parts(self) -> list[tuple[Any, str, str]]:
        """Each family as (its values, text, JSON-escaped text). A family whose values did
        not change since the last rendering is reused as is: between two scrapes most
        families (every per-request histogram until a request finishes) stay the same."""
        self._observe_buffered_gaps()
        out: list[tuple[Any, str, str]] = []
        cache = self._family_cache
        base = self._base_str
        created = format_value(self.epoch_s + self.time_origin_s)

        def reuse(name: str, key: Any) -> bool:
            hit = cache.get(name)
            if hit is not None and hit[0] == key:
                out.append(hit)
                return True
            return False

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]],
                   created_labels: list[str] | None = None, key: Any = None) -> None:
            if key is None:
                key = tuple((labels, v) for _, labels, v in samples)
                if reuse(name, key):
                    return
            text = [f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"]
            for sname, labels, value in samples:
                text.append(f"{sname}{labels} {format_value(value)}\n")
            if created_labels is not None:
                stem = name.removesuffix("_total") if kind == "counter" else name
                cname = f"{stem}_created"
                text.append(f"# HELP {cname} {help_text}\n# TYPE {cname} gauge\n")
                for labels in created_labels:
                    text.append(f"{cname}{labels} {created}\n")
            joined = "".join(text)
            entry = (key, joined, json.dumps(joined)[1:-1])
            cache[name] = entry
            out.append(entry)

        def counter(name: str, help_text: str, values: Mapping[str, float] | float,
                    label: str | None = None, base_labels: Mapping[str, str] | None = None
                    ) -> None:
            fam = f"{name}_total"
            key = (float(values),) if label is None else tuple(values.items())
            if reuse(fam, key):
                return
            b = self._base if base_labels is None else base_labels
            if label is None:
                labels = [_labels(b)]
                samples = [(fam, labels[0], float(values))]
            else:
                labels = [_labels({**b, label: k}) for k in values]
                samples = [(fam, lab, float(v))
                           for lab, v in zip(labels, values.values(), strict=True)]
            family(fam, "counter", help_text, samples, labels, key=key)

        def gauge(name: str, help_text: str, value: float) -> None:
            family(name, "gauge", help_text, [(name, base, float(value))])

        def histogram(name: str, help_text: str, h: _Histogram) -> None:
            key = (h.n, h.total)
            if reuse(name, key):
                return
            frame = self._histogram_frames.get(name)
            if frame is None:
                # The fixed text around the numbers: header, one "name_bucket{le} " prefix per
                # bucket (each after the previous line's newline), count/sum/_created lines.
                bucket = f"{name}_bucket"
                prefixes = [("\n" if i else "") + f"{bucket}{labels} "
                            for i, labels in enumerate(self._bucket_labels(h.bounds))]
                frame = (f"# HELP {name} {help_text}\n# TYPE {name} histogram\n", prefixes,
                         f"\n{name}_count{base} ", f"\n{name}_sum{base} ",
                         f"\n# HELP {name}_created {help_text}\n# TYPE {name}_created gauge\n"
                         f"{name}_created{base} {created}\n")
                self._histogram_frames[name] = frame
            header, prefixes, count_pre, sum_pre, tail = frame
            # Cumulative counts are non-negative ints: the memoised formatter is exact for
            # them (no negative zero to tell apart).
            buckets = "".join(map(str.__add__, prefixes,
                                  map(_format_value_cached, accumulate(h.counts))))
            joined = (f"{header}{buckets}{count_pre}{format_value(h.n)}"
                      f"{sum_pre}{format_value(h.total)}{tail}")
            entry = (key, joined, json.dumps(joined)[1:-1])
            cache[name] = entry
            out.append(entry)

        zero = 0.0
        counter("vllm:estimated_flops_per_gpu", "Estimated floating-point operations per GPU "
                "(MFU accounting; not modelled, stays 0).", zero)
        counter("vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU (MFU "
                "accounting; not modelled, stays 0).", zero)
        counter("vllm:estimated_write_bytes_per_gpu", "Estimated bytes written per GPU (MFU "
                "accounting; not modelled, stays 0).", zero)
        gauge("vllm:num_requests_running", "Requests in the running list after the last step.",
              self.num_running)
        gauge("vllm:num_requests_waiting", "Requests waiting for admission (all reasons).",
              self.num_waiting)
        family("vllm:num_requests_waiting_by_reason", "gauge",
               "Waiting requests split by reason: capacity (no room) or deferred (held by a "
               "transient constraint); the two add up to vllm:num_requests_waiting.",
               [("vllm:num_requests_waiting_by_reason", _labels({**self._base, "reason": r}), v)
                for r, v in (("capacity", self.num_waiting - self.num_waiting_deferred),
                             ("deferred", self.num_waiting_deferred))])
        family("vllm:engine_sleep_state", "gauge",
               "Sleep state of the engine (awake = 1 while serving).",
               [("vllm:engine_sleep_state", _labels({**self._base, "sleep_state": s}),
                 1.0 if s == "awake" else 0.0) for s in SLEEP_STATES])
        gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
              self.kv_usage)
        counter("vllm:prefix_cache_queries", "Tokens looked up in the prefix cache at first "
                "admissions.", self.prefix_cache_queries)
        counter("vllm:prefix_cache_hits", "Tokens found in the prefix cache at first "
                "admissions.", self.prefix_cache_hits)
        counter("vllm:external_prefix_cache_queries", "Tokens looked up through a KV connector "
                "(none here).", zero)
        counter("vllm:external_prefix_cache_hits", "Tokens found through a KV connector (none "
                "here).", zero)
        counter("vllm:mm_cache_queries", "Multimodal cache lookups (none here).", zero)
        counter("vllm:mm_cache_hits", "Multimodal cache hits (none here).", zero)
        counter("vllm:num_preemptions", "Preemptions, counted when the preempted request next "
                "emits output.", self.num_preemptions)
        counter("vllm:prompt_tokens", "Prompt tokens, counted once per request at its first "
                "output.", self.prompt_tokens)
        counter("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
                {"local_compute": self.prompt_local_compute,
                 "local_cache_hit": self.prompt_local_cache_hit,
                 "external_kv_transfer": 0}, label="source")
        counter("vllm:prompt_tokens_cached", "Prompt tokens served from a cache (local and "
                "external).", self.prompt_cached)
        counter("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the tier that "
                "held them, counted at admission.",
                {s: (self.prefix_cache_hits if s == "device" else 0) for s in CACHE_HIT_SOURCES},
                label="source")
        counter("vllm:generation_tokens", "Tokens generated (one per output per request).",
                self.generation_tokens)
        counter("vllm:request_success", "Finished requests by finish reason.",
                self.request_success, label="finished_reason")
        counter("vllm:admission_rejections", "Requests the frontend refused at a queue limit "
                "(none here).", dict.fromkeys(ADMISSION_REJECTION_REASONS, 0), label="reason",
                base_labels={"model_name": self.model_name})
        histogram("vllm:request_prompt_tokens", "Prompt length of finished requests.",
                  self.h_prompt)
        histogram("vllm:request_generation_tokens", "Generated tokens of finished requests.",
                  self.h_generation)
        histogram("vllm:iteration_tokens_total", "Tokens per step with output: prompt tokens of "
                  "first outputs plus generated tokens.", self.h_iteration)
        histogram("vllm:request_max_num_generation_tokens", "Largest generated length among a "
                  "finished request's samples.", self.h_max_generation)
        histogram("vllm:request_params_n", "The n sampling parameter of finished requests.",
                  self.h_n)
        histogram("vllm:request_params_max_tokens", "The max_tokens parameter of finished "
                  "requests.", self.h_max_tokens)
        histogram("vllm:time_to_first_token_seconds", "Seconds from arrival to first output.",
                  self.h_ttft)
        histogram("vllm:inter_token_latency_seconds", "Seconds between consecutive outputs of a "
                  "request.", self.h_itl)
        histogram("vllm:request_time_per_output_token_seconds", "Mean seconds per output token "
                  "after the first, per finished request.", self.h_tpot)
        histogram("vllm:e2e_request_latency_seconds", "Seconds from arrival to finish.",
                  self.h_e2e)
        histogram("vllm:request_queue_time_seconds", "Seconds from first queued to first "
                  "scheduled.", self.h_queue)
        histogram("vllm:request_inference_time_seconds", "Seconds from first scheduled to last "
                  "token.", self.h_inference)
        histogram("vllm:request_prefill_time_seconds", "Seconds from first scheduled to first "
                  "token.", self.h_prefill)
        histogram("vllm:request_decode_time_seconds", "Seconds from first to last token.",
                  self.h_decode)
        histogram("vllm:request_num_preemptions", "Preemptions per finished request.",
                  self.h_preemptions)
        histogram("vllm:request_prefill_kv_computed_tokens", "Prompt tokens computed at prefill "
                  "(cache hits excluded), per finished request.", self.h_prefill_kv)
        info = {str(k): _info_value(v) for k, v in self.cache_config.items()}
        info["engine"] = self.engine
        family("vllm:cache_config_info", "gauge", "KV-cache configuration of the engine.",
               [("vllm:cache_config_info", _labels(info), 1.0)])
        return out

    # --- output ----------------------------------------------------------------------------
    def to_jsonl(self) -> str:
        return "".join(self.scrapes.jsonl_lines())

    def write(self, path: str | Path) -> Path:
        """Write ``metrics.prom.jsonl`` (``path`` may be the file or its folder), streamed:
        a long idle stretch is never held in memory as text."""
        path = Path(path)
        if path.is_dir():
            path = path / "metrics.prom.jsonl"
        if not self._closed:
            self.finish()
        with path.open("wb", buffering=1 << 20) as fh:
            for head, body in self.scrapes.jsonl_parts():
                fh.write(head)
                fh.write(body)
        return path


class ScrapeLog(Sequence):
    """The scrapes of a run as a sequence of ``{"t", "text"}`` dicts, stored as runs: each
    periodic run is (first index ``k``, count, text) with ``t = (origin + k * interval) -
    origin`` (the boundary's own expression, so times are those of scrapes taken one by one),
    and the final scrape has its own ``t``. A run of a million idle scrapes is one entry. The
    text is kept as written in the file (JSON-escaped) and unescaped when read here."""

    def __init__(self, origin: float, interval: float) -> None:
        self.origin = origin
        self.interval = interval
        # (first k or None for a final scrape, count, t of a final scrape, text)
        self.runs: list[tuple[int | None, int, float, str]] = []
        self._starts: list[int] = []
        self._len = 0

    def add_periodic(self, k: int, count: int, text: str) -> None:
        if count > 0:
            self._starts.append(self._len)
            self.runs.append((k, count, 0.0, text))
            self._len += count

    def add_final(self, t: float, text: str) -> None:
        self._starts.append(self._len)
        self.runs.append((None, 1, t, text))
        self._len += 1

    def __len__(self) -> int:
        return self._len

    def _t(self, k: int) -> float:
        return float(self.origin + k * self.interval) - self.origin

    def _run_items(self, run: tuple[int | None, int, float, str], lo: int, hi: int):
        k, _count, t, escaped = run
        text = json.loads('"' + escaped + '"')
        if k is None:
            yield {"t": t, "text": text}
            return
        for j in range(lo, hi):
            yield {"t": self._t(k + j), "text": text}

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("scrape index out of range")
        r = bisect_right(self._starts, index) - 1
        return next(self._run_items(self.runs[r], index - self._starts[r],
                                    index - self._starts[r] + 1))

    def __iter__(self):
        for run in self.runs:
            yield from self._run_items(run, 0, run[1])

    def jsonl_lines(self) -> Iterable[str]:
        """The lines of ``metrics.prom.jsonl``, as ``json.dumps(scrape, separators=(", ",
        ": "))`` writes them."""
        for head, body in self.jsonl_parts():
            yield (head + body).decode("ascii")

    def jsonl_parts(self) -> Iterable[tuple[bytes, bytes]]:
        """Each line as its ``{"t": ...`` head and its text part (escaped once per run and
        shared by the run's lines; JSON escaping leaves only ASCII)."""
        for k, count, t, escaped in self.runs:
            body = (', "text": "' + escaped + '"}\n').encode("ascii")
            if k is None:
                yield ('{"t": ' + json.dumps(t)).encode("ascii"), body
            else:
                for j in range(count):
                    yield ('{"t": ' + json.dumps(self._t(k + j))).encode("ascii"), body


def _info_value(value: Any) -> str:
    # vLLM renders config values with str(): True/False, None, 0.9
    return "None" if value is None else str(value)
