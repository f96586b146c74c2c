"""The server's own step trace: vLLM's iteration-details log lines as one row per engine step.

A V1 server started with ``--enable-logging-iteration-details`` prints, for every engine step
that scheduled tokens, ``Iteration(I): A context requests, B context tokens, C generation
requests, D generation tokens, iteration elapsed time: E ms, CPU KV cache usage: U%``
(``log_lines`` reads the message). What the numbers mean, from vLLM's source
(``compute_iteration_details``, ``EngineCore.capture_iteration_details``):

* a request is a *context* request while it has no output token yet (a new prompt, or the next
  chunk of a chunked prompt); every other scheduled request is a *generation* request, and that
  includes a request **resumed after a preemption**: it already has output tokens, so the
  recompute of its prompt and output is logged as generation tokens. Without speculative
  decoding a decoding request schedules one token, so ``generation_tokens -
  generation_requests`` is the recompute of resumed requests (``resumed_tokens``), less one
  token per resumed request;
* the elapsed time is measured around the wait for the model's output only: the scheduling of
  the step and the processing of its output are outside it (with async scheduling, so is the
  part of the forward pass that overlapped the next step's scheduling);
* the line's time is the log's, to the second.

``iteration_steps`` returns the frame: ``t`` (unix seconds of the line), ``line``, ``engine``,
``iteration``, the four logged counts under vLLM's names, ``elapsed_s``, ``kv_cache_usage``,
``dummy`` (a data-parallel padding step), and the step's work in the simulation's terms
(``steps.csv``): ``resumed_tokens``, ``num_prefill_tokens`` (context tokens plus the resumed
recompute), ``num_decode_tokens``.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pandas as pd

from kvpressure.errors import InputError

COLUMNS = ("t", "line", "engine", "iteration", "context_requests", "context_tokens",
           "generation_requests", "generation_tokens", "elapsed_s", "kv_cache_usage", "dummy",
           "resumed_tokens", "num_prefill_tokens", "num_decode_tokens")


def iteration_steps(path: str | Path, *, year: int | None = None,
                    tz: _dt.tzinfo | None = None) -> pd.DataFrame:
    """One row per logged engine step of the server log at ``path`` (plain or gzip), in log
    order; an empty frame (with the columns) when the server did not log iteration details.

    A line that starts like an iteration line but does not parse (a log cut mid-line, an
    unknown format) is refused with its file and line number: a step trace with a hole would
    misstate the steps around it."""
    from kvpressure.ingestion.server_log import read_events

    path = Path(path)
    log = read_events(path, year=year, tz=tz)
    rows = []
    for ev in log.events:
        if ev.kind == "iteration_malformed":
            raise InputError(
                f"{path}: line {ev.stamp.line}: an iteration-details line that does not read as "
                "'Iteration(I): A context requests, B context tokens, C generation requests, D "
                "generation tokens, iteration elapsed time: E ms, ... KV cache usage: U%' "
                f"(got {ev.values['text']!r})")
        if ev.kind != "iteration":
            continue
        v = ev.values
        rows.append((ev.t, ev.stamp.line, v["engine"], v["iteration"], v["context_requests"],
                     v["context_tokens"], v["generation_requests"], v["generation_tokens"],
                     v["elapsed_ms"] / 1000.0,
                     np.nan if v["kv_cache_usage"] is None else v["kv_cache_usage"],
                     v["dummy"]))
    frame = pd.DataFrame(rows, columns=list(COLUMNS[:-3]))
    for col in ("line", "iteration", "context_requests", "context_tokens",
                "generation_requests", "generation_tokens"):
        frame[col] = frame[col].astype(np.int64)
    frame["dummy"] = frame["dummy"].astype(bool)
    frame["engine"] = frame["engine"].astype(object)
    excess = (frame["generation_tokens"] - frame["generation_requests"]).clip(lower=0)
    frame["resumed_tokens"] = excess
    frame["num_prefill_tokens"] = frame["context_tokens"] + excess
    frame["num_decode_tokens"] = frame["generation_tokens"] - excess
    return frame


def in_window(steps: pd.DataFrame, t_start: float, t_end: float) -> pd.DataFrame:
    """The steps logged within ``[t_start, t_end]``, widened by the second the log's times are
    rounded down to."""
    return steps[(steps["t"] >= np.floor(t_start)) & (steps["t"] <= t_end)]
