"""Seeded request generation: reproducibility, distribution statistics, arrivals, traces."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvpressure.errors import InputError
from kvpressure.simulation.workload import Z90, generate_requests, parse_workload


def _spec(**kw):
    base = {"num_requests": 2000, "seed": 5, "input_len": 1000, "output_len": 100}
    base.update(kw)
    return base


def _lengths(reqs, key="prompt_len"):
    return np.array([r[key] for r in reqs])


def test_same_seed_same_requests_other_seed_other_requests():
    spec = _spec(input_len={"type": "uniform", "low": 10, "high": 5000},
                 output_len={"type": "lognormal", "median": 200, "p90": 800})
    a = generate_requests(spec)
    b = generate_requests(spec)
    c = generate_requests({**spec, "seed": 6})
    assert a == b
    assert _lengths(a).tolist() != _lengths(c).tolist()
    assert [r["id"] for r in a[:3]] == ["r0", "r1", "r2"]


def test_uniform_inclusive_bounds_and_mean():
    reqs = generate_requests(_spec(num_requests=20000,
                                   input_len={"type": "uniform", "low": 100, "high": 199}))
    x = _lengths(reqs)
    assert x.min() == 100 and x.max() == 199
    assert x.mean() == pytest.approx(149.5, abs=1.0)


def test_lognormal_median_p90():
    reqs = generate_requests(_spec(num_requests=20000,
                                   input_len={"type": "lognormal", "median": 2000, "p90": 6000}))
    x = _lengths(reqs)
    assert np.median(x) == pytest.approx(2000, rel=0.03)
    assert np.quantile(x, 0.9) == pytest.approx(6000, rel=0.05)


def test_lognormal_mean_sigma_and_clipping():
    reqs = generate_requests(_spec(num_requests=40000,
                                   output_len={"type": "lognormal", "mean": 500, "sigma": 0.5}))
    assert _lengths(reqs, "output_len").mean() == pytest.approx(500, rel=0.02)
    clipped = generate_requests(_spec(input_len={"type": "lognormal", "median": 1000,
                                                 "p90": 1000 * math.exp(Z90 * 1.0),
                                                 "min": 300, "max": 3000}))
    x = _lengths(clipped)
    assert x.min() == 300 and x.max() == 3000


def test_normal_is_clipped():
    reqs = generate_requests(_spec(input_len={"type": "normal", "mean": 500, "std": 400,
                                              "min": 100, "max": 900}))
    x = _lengths(reqs)
    assert x.min() >= 100 and x.max() <= 900
    assert (x == 100).any() and (x == 900).any()


def test_empirical_from_file_and_csv_column(tmp_path):
    (tmp_path / "lengths.txt").write_text("# observed\n120\n450\n\n999\n")
    (tmp_path / "lens.csv").write_text("prompt,other\n7,1\n8,1\n9,1\n")
    spec = _spec(input_len={"type": "empirical", "path": "lengths.txt"},
                 output_len={"type": "empirical", "path": "lens.csv", "column": "prompt"})
    reqs = generate_requests(spec, base_dir=tmp_path)
    assert set(_lengths(reqs)) == {120, 450, 999}
    assert set(_lengths(reqs, "output_len")) == {7, 8, 9}
    with pytest.raises(InputError, match="no column 'missing'"):
        generate_requests(_spec(input_len={"type": "empirical", "path": "lens.csv",
                                           "column": "missing"}), base_dir=tmp_path)
    (tmp_path / "bad.txt").write_text("12\nabc\n")
    with pytest.raises(InputError, match="bad.txt line 2"):
        generate_requests(_spec(input_len={"type": "empirical", "path": "bad.txt"}),
                          base_dir=tmp_path)


def test_prefix_groups_share_and_prompt_composition():
    reqs = generate_requests(_spec(num_requests=10000, prefix_groups={
        "sys": {"share": 0.3, "length": 512}, "rag": {"share": 0.2, "length": 2048}}))
    groups = [r.get("prefix_group") for r in reqs]
    assert groups.count("sys") / len(reqs) == pytest.approx(0.3, abs=0.02)
    assert groups.count("rag") / len(reqs) == pytest.approx(0.2, abs=0.02)
    for r in reqs:
        if r.get("prefix_group") == "rag":
            assert r["prefix_len"] == 2048 and r["prompt_len"] == 2048 + 1000
        elif r.get("prefix_group") is None:
            assert "prefix_len" not in r and r["prompt_len"] == 1000


def test_priorities_follow_weights_and_streams_are_independent():
    spec = _spec(num_requests=8000, input_len={"type": "uniform", "low": 1, "high": 9999})
    with_prio = generate_requests({**spec, "priority": {"values": [0, 5], "weights": [3, 1]}})
    assert [r["priority"] for r in with_prio].count(5) / 8000 == pytest.approx(0.25, abs=0.02)
    # adding priorities leaves the lengths unchanged (each aspect has its own stream)
    plain = generate_requests(spec)
    assert _lengths(plain).tolist() == _lengths(with_prio).tolist()


def test_poisson_and_bursty_arrivals():
    spec = _spec(num_requests=20001)
    poisson = _arrival_gaps(generate_requests(spec, arrivals={"request_rate": 4.0}))
    assert poisson.mean() == pytest.approx(0.25, rel=0.03)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential
    bursty = _arrival_gaps(generate_requests(spec, arrivals={"request_rate": 4.0,
                                                             "burstiness": 0.25}))
    assert bursty.mean() == pytest.approx(0.25, rel=0.05)
    # gamma(shape k): coefficient of variation 1/sqrt(k) = 2
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)
    burst = generate_requests(_spec(num_requests=5), arrivals={"request_rate": math.inf})
    assert [r["arrival_time_s"] for r in burst] == [0.0] * 5
    # arrival times do not disturb the lengths
    assert _lengths(generate_requests(spec)).tolist() == _lengths(
        generate_requests(spec, arrivals={"request_rate": 4.0})).tolist()


def _arrival_gaps(reqs):
    t = np.array([r["arrival_time_s"] for r in reqs])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    return np.diff(t)


def test_trace_replay_csv(tmp_path):
    (tmp_path / "trace.csv").write_text(
        "request_id,input_len,output_len,timestamp,priority,prefix_group,prefix_len\n"
        "a,100,10,1000.5,0,,\n"
        "b,200,20,1000.0,1,sys,64\n"
        "c,300,30,1002.0,0,sys,64\n"
    )
    reqs = generate_requests({"trace": {"path": "trace.csv", "time_scale": 2.0}},
                             base_dir=tmp_path)
    assert [r["id"] for r in reqs] == ["b", "a", "c"]  # by arrival time
    assert [r["arrival_time_s"] for r in reqs] == [0.0, 1.0, 4.0]  # shifted and scaled
    assert reqs[0] == {"id": "b", "prompt_len": 200, "output_len": 20, "priority": 1,
                       "prefix_group": "sys", "prefix_len": 64, "arrival_time_s": 0.0}
    closed = generate_requests({"trace": {"path": "trace.csv", "use_arrivals": False}},
                               base_dir=tmp_path)
    assert [r["id"] for r in closed] == ["a", "b", "c"] and "arrival_time_s" not in closed[0]


def test_trace_replay_jsonl_and_errors(tmp_path):
    lines = [{"prompt_len": 5, "output_len": 2}, {"prompt_len": 6, "output_len": 3}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    reqs = generate_requests({"trace": {"path": "t.jsonl"}, "num_requests": 1},
                             base_dir=tmp_path)
    assert reqs == [{"id": "r0", "prompt_len": 5, "output_len": 2}]
    (tmp_path / "bad.jsonl").write_text('{"prompt_len": 5}\n')
    with pytest.raises(InputError, match=r"bad.jsonl line 1: missing field 'output_len'"):
        generate_requests({"trace": {"path": "bad.jsonl"}}, base_dir=tmp_path)
    (tmp_path / "neg.csv").write_text("prompt_len,output_len\n10,-3\n")
    with pytest.raises(InputError, match=r"neg.csv line 2: field 'output_len': must be >= 1"):
        generate_requests({"trace": {"path": "neg.csv"}}, base_dir=tmp_path)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"num_requests": 0, "input_len": 5, "output_len": 5}, "workload.num_requests"),
        ({"num_requests": 5, "input_len": {"type": "uniform", "low": 9, "high": 3},
          "output_len": 5}, "workload.input_len"),
        ({"num_requests": 5, "input_len": {"type": "lognormal", "median": 100},
          "output_len": 5}, "workload.input_len"),
        ({"num_requests": 5, "input_len": {"type": "zipf"}, "output_len": 5},
         "workload.input_len"),
        ({"num_requests": 5, "input_len": 5, "output_len": 5,
          "prefix_groups": {"a": {"share": 0.7, "length": 8}, "b": {"share": 0.6, "length": 8}}},
         "add up to 1.3"),
        ({"num_requests": 5, "input_len": 5}, "output_len"),
        ({"num_requests": 5, "input_len": 5, "output_len": 5, "seeed": 1}, "workload.seeed"),
    ],
)
def test_bad_parameters_name_the_field(spec, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        parse_workload(spec)


def test_bad_arrivals_name_the_field():
    with pytest.raises(InputError, match="request_rate"):
        generate_requests(_spec(num_requests=3), arrivals={"request_rate": 0})
