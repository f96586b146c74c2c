"""``simulate|sweep EXPERIMENT --trace FILE`` and staged open loops, priced by the experiment's
cost model (hand-counted arrivals; the trace shaped as Mooncake and CSV users give it)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from kvpressure.cli import main
from kvpressure.simulation.workload import LoadStage, generate_requests, staged_arrivals

EXPERIMENT = """\
name: tiny
hardware: h100-80g
model: llama-3.1-8b
engine: {max_model_len: 4096}
workload:
  num_requests: 6
  seed: 3
  input_len: 200
  output_len: 20
  concurrency: [2]
"""


def test_constant_stages_are_evenly_spaced_and_cut_at_each_stage_end():
    # 2 req/s for 2 s, then 4 req/s for 1 s: 0, .5, 1, 1.5, then 2, 2.25, 2.5, 2.75.
    times, index = staged_arrivals([LoadStage(request_rate=2, duration_s=2),
                                    LoadStage(request_rate=4, duration_s=1)],
                                   math.inf, np.random.default_rng(0))
    assert times.tolist() == [0, 0.5, 1, 1.5, 2, 2.25, 2.5, 2.75]
    assert index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_poisson_stages_keep_each_stage_rate():
    times, index = staged_arrivals([LoadStage(request_rate=50, duration_s=40),
                                    LoadStage(request_rate=200, duration_s=10)],
                                   1.0, np.random.default_rng(1))
    assert np.all(np.diff(times) >= 0)
    for k, expected in ((0, 2000), (1, 2000)):
        assert abs(int((index == k).sum()) - expected) < 4 * math.sqrt(expected)


def test_a_staged_workload_draws_one_length_per_arrival():
    reqs = generate_requests({"num_requests": 1, "input_len": 10, "output_len": 5},
                             stages=[LoadStage(request_rate=3, duration_s=2)],
                             arrivals={"request_rate": 1, "burstiness": math.inf})
    assert [r["arrival_time_s"] for r in reqs] == pytest.approx([0, 1 / 3, 2 / 3, 1, 4 / 3,
                                                                 5 / 3])


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(EXPERIMENT)
    return path


def _requests(out):
    with (out / "requests.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_simulate_replays_a_mooncake_trace_at_its_own_times(experiment, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 1000, "input_length": 300, "output_length": 4, "hash_ids": [1]},
            {"timestamp": 1250, "input_length": 500, "output_length": 6, "hash_ids": [1, 2]},
            {"timestamp": 4000, "input_length": 100, "output_length": 2, "hash_ids": [3]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["simulate", str(experiment), "--trace", str(trace), "--trace-time-unit",
                 "ms", "--out", str(out), "--no-metrics"]) == 0
    reqs = _requests(out)
    assert [float(r["arrival_time_s"]) for r in reqs] == [0.0, 0.25, 3.0]
    assert [(int(r["prompt_len"]), int(r["output_len"])) for r in reqs] == [(300, 4), (500, 6),
                                                                           (100, 2)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 3
    # Each request's TTFT includes at least its own prefill step and the request path.
    assert all(float(r["ttft_s"]) > 0 for r in reqs)


def test_simulate_runs_stages_from_the_command_line(experiment, tmp_path):
    out = tmp_path / "out"
    assert main(["simulate", str(experiment), "--stages", "2:3,4:1", "--out", str(out),
                 "--no-metrics"]) == 0
    arrivals = [float(r["arrival_time_s"]) for r in _requests(out)]
    # Each stage's first arrival at its start (0 s, 3 s), none past the last stage's end.
    assert arrivals[0] == 0.0 and 3.0 in arrivals and max(arrivals) < 4.0
    assert arrivals == sorted(arrivals)
    # The experiment's seed fixes the Poisson draws: the same run gives the same bytes.
    out2 = tmp_path / "out2"
    assert main(["simulate", str(experiment), "--stages", "2:3,4:1", "--out", str(out2),
                 "--no-metrics"]) == 0
    assert (out / "requests.csv").read_bytes() == (out2 / "requests.csv").read_bytes()


@pytest.mark.parametrize("stages", ["8", "8:0", "x:3", "8:nan"])
def test_bad_stages_are_refused_naming_the_option(experiment, tmp_path, stages, capsys):
    assert main(["simulate", str(experiment), "--stages", stages, "--out",
                 str(tmp_path / "o")]) == 2
    assert "--stages" in capsys.readouterr().err


def test_a_missing_trace_is_refused(experiment, tmp_path, capsys):
    assert main(["simulate", str(experiment), "--trace", str(tmp_path / "no.csv"), "--out",
                 str(tmp_path / "o")]) == 2
    assert "--trace" in capsys.readouterr().err


def test_sweep_takes_the_trace_lengths_at_each_level(experiment, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len\n120,3\n80,5\n300,2\n")
    out = tmp_path / "sweep"
    assert main(["sweep", str(experiment), "--trace", str(trace), "--out", str(out),
                 "--jobs", "1"]) == 0
    with (out / "runs.csv").open() as fh:
        runs = list(csv.DictReader(fh))
    assert [int(r["num_requests"]) for r in runs] == [3]
