"""What vLLM 0.33.0's ``PrometheusStatLogger`` counts for a simulated run, and when.

``PromAccounting`` receives the engine's hooks (``recorder.py``) and keeps the same counters,
gauges and histograms as vLLM's exporter, moved at the moments vLLM moves them:

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

The scrape clock is the subclass's (``prom_view.PromRecorder``): an event stamped ``t`` is
applied after every scrape due strictly before ``t`` (``_flush_before``), so the hooks check
``_boundary``, the time of the next scrape. Alone, this class never scrapes.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import sub
from typing import Any

from kvpressure.simulation.prom_exposition import (
    FINISHED_REASONS,
    INTER_TOKEN_LATENCY_BUCKETS,
    ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS,
    REQUEST_PARAMS_N_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    request_tokens_buckets,
)
from kvpressure.simulation.prom_histogram import Histogram


def _floats(values: Sequence[float]) -> list[float]:
    """A list of floats: numpy arrays (timed runs) and lists (step-clock runs) alike, so this
    module needs no numpy on the light ``kvpressure simulate`` path. A list is taken as it
    is (the engine's step-clock times are floats already)."""
    if type(values) is list:
        return values
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else [float(v) for v in values]


class RequestStats:
    """What the frontend keeps per request (vLLM's ``RequestStateStats`` and friends)."""

    __slots__ = (
        "arrival", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts",
        "num_generation_tokens", "num_preemptions", "pending_preemptions", "prompt_len",
        "max_tokens", "cached_at_first_admission", "is_prefilling", "admitted", "stream_join",
        "key",
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
        # The accounting's stream count when it joined the decode stream
        # (PromAccounting._stream), -1 outside it: inside, last_token_ts and
        # num_generation_tokens lag (see there), and ``key`` is what stands for it there.
        self.stream_join = -1
        self.key: Any = None

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


class PromAccounting:
    """The exporter's counters, gauges and histograms, moved by the engine's hooks."""

    # The scrape clock's (the subclass's): no scrape is ever due here.
    _boundary = math.inf

    def __init__(self, *, max_model_len: int = 8192, enable_prefix_caching: bool = False
                 ) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        self._pending_leap: tuple[list[Any], list[float]] | None = None

        # per-request frontend state, by request id and by the request object itself (the
        # engine hands the same objects to every hook: a lookup without Python per request)
        self._reqs: dict[str, RequestStats] = {}
        self._by_req: dict[Any, RequestStats] = {}
        self._hashable = True  # every request so far could be a dict key
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
        self.h_prompt = Histogram(tok)
        self.h_generation = Histogram(tok)
        self.h_iteration = Histogram(ITERATION_TOKENS_BUCKETS)
        self.h_max_generation = Histogram(tok)
        self.h_n = Histogram(REQUEST_PARAMS_N_BUCKETS)
        self.h_max_tokens = Histogram(tok)
        self.h_ttft = Histogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self._h_itl = Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.h_tpot = Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.h_e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_preemptions = Histogram(REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.h_prefill_kv = Histogram(tok)

        # Inter-token gaps not yet in h_itl, in order, as runs (gap, how many requests).
        self._itl_vals: list[float] = []
        self._itl_counts: list[int] = []
        # The decode stream: the requests that emitted one token in every bulk step (plain
        # decode tokens, leapt steps) since they joined it, held as the request objects the
        # engine hands over (their states where requests cannot be dict keys). A member's
        # last_token_ts is _stream_t and its num_generation_tokens lags by _stream_count -
        # stream_join: a busy step then costs set operations in C, not a line of Python per
        # request, nor a lookup of each state. A member leaves (its fields brought up to
        # date) when it misses a bulk step or any other hook touches it.
        self._stream: set[Any] = set()
        self._stream_count = 0
        self._stream_t = 0.0

    def _flush_before(self, t: float) -> None:
        """Take the scrapes due strictly before ``t`` (the scrape clock's; none here)."""
        self._apply_pending_leap()

    @property
    def h_itl(self) -> Histogram:
        """The inter-token latency histogram, with every buffered gap observed."""
        self._observe_buffered_gaps()
        return self._h_itl

    def _observe_buffered_gaps(self) -> None:
        if self._itl_vals:
            self._h_itl.observe_runs(self._itl_vals, self._itl_counts)
            self._itl_vals = []
            self._itl_counts = []

    # --- engine hooks --------------------------------------------------------------------------
    def on_arrival(self, req: Any, t: float) -> None:
        """The request reached the engine at ``t`` (its QUEUED event)."""
        arrival = getattr(req, "arrival_time_s", None)
        arrival = t if arrival is None or (isinstance(arrival, float) and math.isnan(arrival)) \
            else float(arrival)
        prompt = int(getattr(req, "num_prompt_tokens", None) or req.prompt_len)
        max_tokens = int(getattr(req, "max_tokens", None) or req.output_len)
        st = RequestStats(min(arrival, t), t, prompt, max_tokens)
        self._reqs[_req_id(req)] = st
        try:
            self._by_req[req] = st
        except TypeError:  # not hashable: found by id instead
            self._hashable = False

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
        keys = self._keys(reqs)
        n = len(keys)
        if n:
            self._stream_step(keys, t, 1)
            self._iter_has_output = True
            self.generation_tokens += n
            self._iter_tokens += n

    def _keys(self, reqs: Iterable[Any]) -> list[Any]:
        """What stands for each of ``reqs`` in the stream: the request itself, or its state
        when requests cannot be dict keys (test doubles)."""
        if self._hashable:
            return reqs if type(reqs) is list else list(reqs)
        states = self._reqs
        return [states[_req_id(r)] for r in reqs]

    def _state(self, key: Any) -> RequestStats:
        return key if type(key) is RequestStats else self._by_req[key]

    def _leave_stream(self, st: RequestStats) -> None:
        """Bring a stream member's fields up to date and take it out of the stream."""
        st.num_generation_tokens += self._stream_count - st.stream_join
        st.last_token_ts = self._stream_t
        st.stream_join = -1
        self._stream.discard(st.key)

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

    def _stream_step(self, keys: list[Any], t: float, m: int) -> None:
        """Every request of ``keys`` (see ``_keys``) emits a token at ``t`` (the first of a
        run of steps): their inter-token gaps are buffered in ``keys`` order; members that
        missed the step leave the stream, newcomers join it. Advances the stream by ``m``
        steps ending at ``t`` (a leap advances it itself, by its number of steps)."""
        stream = self._stream
        if len(keys) == len(stream) and stream.issuperset(keys):
            # The batch is the stream (a batch holds each request once): one gap for all.
            self._buffer_gap(t - self._stream_t, len(keys))
        else:
            state = self._state
            cur = set(keys)
            newcomers = []
            for key in stream ^ cur:  # the members that left and the newcomers, in one pass
                if key in stream:
                    self._leave_stream(state(key))
                else:
                    newcomers.append((key, state(key)))
            if newcomers:
                st_t = self._stream_t
                if len(newcomers) * 8 < len(keys):
                    # A few newcomers among members (a request back from prefill or
                    # admission): the members' one gap in runs around them, found by
                    # identity scans in C rather than a line of Python per member.
                    common = t - st_t
                    prev = 0
                    for i, st in sorted((keys.index(key), st) for key, st in newcomers):
                        if i > prev:
                            self._buffer_gap(common, i - prev)
                        self._buffer_gap(t - st.last_token_ts, 1)
                        prev = i + 1
                    if prev < len(keys):
                        self._buffer_gap(common, len(keys) - prev)
                else:
                    self._buffer_gaps([t - (st.last_token_ts if st.stream_join < 0 else st_t)
                                       for st in map(state, keys)])
                count = self._stream_count
                for key, st in newcomers:
                    if st.pending_preemptions:
                        self.num_preemptions += st.take_preemptions()
                    # Its fields are current up to this step; from here on they lag.
                    st.stream_join = count
                    st.key = key
                self._stream = cur
            else:
                self._buffer_gap(t - self._stream_t, len(keys))
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
            self._pending_leap = (list(self._keys(reqs)), times)  # a copy: ours to keep

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
            end = max(bisect_right(times, self._boundary), start + 1)
            yield start, end
            start = end

    def _apply_pending_leap(self) -> None:
        """A leap whose ``on_steps_end`` never came: apply its tokens, split at scrapes."""
        if self._pending_leap is None:
            return
        keys, times = self._pending_leap
        self._pending_leap = None
        for start, end in self._segments(times):
            self._leap_segment(keys, times[start:end])

    def _leap_segment(self, keys: list[Any], times: list[float]) -> None:
        k = len(keys)
        if k == 0:
            return
        m = len(times)
        self.generation_tokens += k * m
        self.h_iteration.observe_repeated(float(k), m)
        first, last = times[0], times[-1]
        self._stream_step(keys, first, 0)
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
        which the accounting tracks itself from ``on_scheduled``."""
        if t > self._boundary or self._pending_leap is not None:
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

    def _finish_request(self, req: Any, st: RequestStats, t: float) -> None:
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
