"""What ``kvpressure collect`` sends beyond a closed loop: request-rate levels' send times, a
dataset's requests, a trace's times, lengths and shared prefixes (the files as users have them,
cut small); the options' refusals."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from kvpressure.commands import collect as collect_cmd
from kvpressure.errors import InputError
from kvpressure.live.load import (
    TRACE_BLOCK,
    parse_rates,
    read_dataset,
    read_trace,
    send_times,
    trace_prompt,
)
from kvpressure.live.runner import CollectOptions

DATA = Path(__file__).parent / "data" / "rates"


def test_poisson_sends_average_the_rate_and_constant_sends_are_even():
    times = send_times(4000, 2.0, seed=3, stream=1)
    gaps = np.diff(times)
    assert times[0] == 0.0 and len(times) == 4000
    # Exponential gaps (gamma shape 1): mean 1/rate and a standard deviation as large.
    assert np.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert np.std(gaps) == pytest.approx(0.5, rel=0.08)
    # Burstier (shape 0.25): the same mean, twice the spread.
    bursty = np.diff(send_times(4000, 2.0, burstiness=0.25, seed=3, stream=1))
    assert np.mean(bursty) == pytest.approx(0.5, rel=0.1)
    assert np.std(bursty) == pytest.approx(1.0, rel=0.12)
    assert send_times(4, 2.0, arrivals="constant") == [0.0, 0.5, 1.0, 1.5]
    assert send_times(50, 2.0, seed=3, stream=1) == times[:50]  # seeded: the same every run


def test_rates_are_parsed_and_bad_ones_refused():
    assert parse_rates("0.5,1,2") == [0.5, 1.0, 2.0]
    for bad in ("0,1", "1,1", "fast", "inf"):
        with pytest.raises(InputError, match="--request-rate"):
            parse_rates(bad)


def test_a_mooncake_trace_gives_its_times_lengths_and_shared_prefixes():
    trace = read_trace(DATA / "mooncake_trace.jsonl")
    assert len(trace) == 10
    assert [r.t_s for r in trace[:3]] == [0.0, 0.25, 0.6]
    assert (trace[1].input_len, trace[1].output_len, trace[1].hash_ids) == (160, 20, (1,))
    prompts = [trace_prompt(r, k, 0, (10, 1000)) for k, r in enumerate(trace)]
    assert [len(p) for p in prompts] == [r.input_len for r in trace]
    # Requests 0, 2 and 7 carry hash id 0: the shorter prompt is the longer one's prefix.
    assert prompts[0] == prompts[2] and prompts[7] == prompts[0][:80]
    assert prompts[0][:64] != prompts[5][:64]  # another hash id, another block


def test_bad_trace_lines_are_refused_naming_the_line(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    for line, match in (('{"timestamp": 0, "input_length": 5}', "line 1: no 'output_length'"),
                        ('{"timestamp": -1, "input_length": 5, "output_length": 2}',
                         "timestamp"),
                        (f'{{"timestamp": 0, "input_length": {TRACE_BLOCK + 1}, '
                         '"output_length": 2, "hash_ids": [1]}', "longer than its 1 hash")):
        path.write_text(line + "\n")
        with pytest.raises(InputError, match=match):
            read_trace(path)


def test_datasets_of_token_counts_prompts_and_conversations():
    counts = read_dataset(DATA / "token_counts.jsonl", 64)
    assert [(r.input_len, r.output_len) for r in counts[:2]] == [(40, 9), (130, 17)]
    chats = read_dataset(DATA / "sharegpt.json", 64)
    assert len(chats) == 3
    # The first human turn is the prompt, the reply after it gives the output length.
    assert chats[1].text == "Name two ways to lower the memory one sequence takes."
    assert chats[1].reply == "A shorter maximum model length, or a smaller block size."
    assert chats[2].text.startswith("Why does throughput fall")


def test_a_bad_dataset_line_is_refused_naming_it(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"input_length": 4, "output_length": 2}\n{"output_length": 3}\n')
    with pytest.raises(InputError, match="line 2: no prompt"):
        read_dataset(path, 8)
    # a number past Python's integer limit is no JSON syntax error, and still named by line
    path.write_text('{"input_length": 4, "output_length": 2}\n{"input_length": '
                    + "9" * 5000 + ', "output_length": 2}\n')
    with pytest.raises(InputError, match="line 2: not JSON"):
        read_dataset(path, 8)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": ' + "9" * 5000 + ', "input_length": 5, "output_length": 2}\n')
    with pytest.raises(InputError, match="line 1: not JSON"):
        read_trace(trace)


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    collect_cmd.add_arguments(parser)
    argv = ["http://127.0.0.1:1", "--out", "x"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parser.parse_args(argv)


def test_the_level_options_name_one_kind_of_level():
    assert collect_cmd._level_options(_args(levels="2,4")) == {"levels": [2, 4]}
    # --max-concurrency alone is the closed loop's clients, as vllm bench serve reads it ...
    assert collect_cmd._level_options(_args(max_concurrency="2,4")) == {"levels": [2, 4]}
    # ... and the cap on requests in flight of rate levels.
    assert collect_cmd._level_options(_args(request_rate="1,2", max_concurrency=8)) == {
        "levels": [], "max_concurrency": 8, "request_rates": [1.0, 2.0]}
    for kw, match in (({}, "give the levels"),
                      ({"levels": "2", "max_concurrency": "4"}, "give one"),
                      ({"request_rate": "1", "max_concurrency": "2,4"}, "one cap"),
                      ({"levels": "2", "request_rate": "1"}, "one kind of level")):
        with pytest.raises(InputError, match=match):
            collect_cmd._level_options(_args(**kw))


def test_the_plan_names_each_level_and_checks_refuse_mixtures(tmp_path: Path):
    opts = CollectOptions(url="u", out=tmp_path, levels=[], request_rates=[0.5, 2.0],
                          max_concurrency=4)
    opts.check()
    assert [(lv.name, lv.concurrency, lv.request_rate) for lv in opts.plan()] == [
        ("r0.5", 4, 0.5), ("r2", 4, 2.0)]
    assert opts.requests_at(opts.plan()[1]) == 60  # about 30 s of load at 2 requests/s
    trace = CollectOptions(url="u", out=tmp_path, levels=[], trace=DATA / "mooncake_trace.jsonl")
    trace.check()
    assert [lv.name for lv in trace.plan()] == ["trace"]
    for bad, match in (({"levels": [2], "request_rates": [1.0]}, "one kind of level"),
                       ({"levels": [], "request_rates": [1.0], "burstiness": 0.0},
                        "--burstiness"),
                       ({"levels": [], "request_rates": [1.0], "arrivals": "uniform"},
                        "--arrivals"),
                       ({"levels": [], "trace": DATA / "mooncake_trace.jsonl",
                         "dataset": DATA / "token_counts.jsonl"}, "give one")):
        with pytest.raises(InputError, match=match):
            CollectOptions(url="u", out=tmp_path, **bad).check()
