"""vLLM's iteration-details log lines read into a per-step frame (ingestion/iteration_log.py).

The data is 321 lines cut from a real vLLM 0.32.0 CPU server's log
(``--enable-logging-iteration-details``, 64 KV blocks of 32 tokens, closed loop of 6 clients):
the end of the previous level, the start of this one, a periodic stats line and steps that
resume preempted requests."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pytest

from kvpressure.errors import InputError
from kvpressure.ingestion.iteration_log import iteration_steps
from kvpressure.ingestion.prom_text import RunSamples
from kvpressure.ingestion.server_log import read_server_log

LOG = Path(__file__).parent / "data" / "real" / "vllm_0.32_cpu_iteration_details.log"


@pytest.fixture(scope="module")
def steps():
    return iteration_steps(LOG, year=2026, tz=_dt.UTC).set_index("iteration")


def test_every_step_line_is_one_row_in_order(steps):
    text = LOG.read_text().splitlines()
    assert len(steps) == sum("Iteration(" in line for line in text) == 293
    # vLLM numbers its steps one by one: the cut holds 3608..3900 without a hole.
    assert list(steps.index) == list(range(3608, 3901))
    assert (np.diff(steps["line"]) > 0).all()


def test_hand_read_lines(steps):
    # line 23: "Iteration(3623): 1 context requests, 250 context tokens, 0 generation
    # requests, 0 generation tokens, iteration elapsed time: 46.49 ms, CPU KV cache usage: 12.7%"
    s = steps.loc[3623]
    assert (s["line"], s["context_requests"], s["context_tokens"], s["generation_requests"],
            s["generation_tokens"]) == (23, 1, 250, 0, 0)
    assert s["elapsed_s"] == pytest.approx(0.04649)
    assert s["kv_cache_usage"] == pytest.approx(0.127)
    assert s["t"] == _dt.datetime(2026, 12, 1, 18, 4, 28, tzinfo=_dt.UTC).timestamp()
    assert s["engine"] == "0" and not s["dummy"]
    # line 37: four new prompts filling the 1024-token budget (one token left to a decode)
    s = steps.loc[3632]
    assert (s["num_prefill_tokens"], s["num_decode_tokens"]) == (1023, 1)
    assert s["elapsed_s"] == pytest.approx(0.18001)


def test_a_resumed_request_is_logged_as_generation_and_read_as_prefill(steps):
    # line 148: 5 generation requests, 239 generation tokens: 4 decoding requests (one token
    # each) and a preempted request resumed with 235 tokens to recompute (its own freed blocks
    # hit the prefix cache); read as 234 prefill tokens + 5 decode tokens.
    s = steps.loc[3739]
    assert (s["resumed_tokens"], s["num_prefill_tokens"], s["num_decode_tokens"]) == (234, 234, 5)
    # line 314: a new prompt (313 tokens) and a resumed request in the same step
    s = steps.loc[3895]
    assert (s["num_prefill_tokens"], s["num_decode_tokens"]) == (313 + 298, 4)
    # Without a resumed request the generation tokens are the decoding requests.
    plain = steps[steps["resumed_tokens"] == 0]
    assert (plain["generation_tokens"] == plain["generation_requests"]).all()
    assert (steps["num_prefill_tokens"] + steps["num_decode_tokens"]
            == steps["context_tokens"] + steps["generation_tokens"]).all()


def test_a_cut_line_is_named_by_file_and_line(tmp_path):
    lines = LOG.read_text().splitlines(keepends=True)
    lines[99] = lines[99][:150] + "\n"  # line 100 cut mid-message, as a killed writer leaves it
    bad = tmp_path / "server.log"
    bad.write_text("".join(lines))
    with pytest.raises(InputError, match=rf"{bad}: line 100: an iteration-details line"):
        iteration_steps(bad, year=2026, tz=_dt.UTC)


def test_a_log_without_iteration_details_gives_an_empty_frame(tmp_path):
    plain = tmp_path / "server.log"
    plain.write_text("".join(line for line in LOG.read_text().splitlines(keepends=True)
                             if "Iteration(" not in line))
    got = iteration_steps(plain, year=2026, tz=_dt.UTC)
    assert got.empty and "num_prefill_tokens" in got.columns


def test_the_server_log_reader_counts_the_step_lines_and_still_reads_the_stats_line():
    acc = RunSamples("load")
    info = read_server_log(LOG, acc, [], year=2026, tz=_dt.UTC)
    assert info["iteration_lines"] == 293
    assert info["stats_lines"] == 1
