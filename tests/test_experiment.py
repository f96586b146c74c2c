"""Experiment files: validation errors, pool sizing from the profiles, points and variants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.profiles.kvpool import size_kv_pool
from kvpressure.simulation.experiment import (
    experiment_from_dict,
    list_experiments,
    load_experiment,
    repeat_seeds,
)

SMALL = {
    "name": "t",
    "hardware": "h100-80g",
    "model": "llama-3.1-8b",
    "engine": {"max_model_len": 8192, "enable_prefix_caching": False},
    "workload": {"num_requests": 20, "seed": 3, "input_len": {"type": "uniform", "low": 500,
                                                                "high": 4000},
                 "output_len": 64, "concurrency": [2, 8]},
    "comparison": {"parameter": "max_num_seqs", "values": [4, 1024]},
}


def _write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_builtin_experiments_load_and_size_the_pool_like_vllm():
    assert {"seed_case", "seed_case_v033_defaults", "ci_small"} <= set(list_experiments())
    exp = load_experiment(data_dir() / "experiments" / "seed_case.yaml")
    assert exp.path.name == "seed_case.yaml"
    direct = size_kv_pool("ascend-910b-64g", "llama-3.1-70b", 8, gpu_memory_utilization=0.9,
                          max_model_len=32768)
    settings = exp.settings()
    assert settings["num_gpu_blocks"] == direct.num_gpu_blocks
    # the card's API-server defaults and vllm-ascend's block size
    assert (settings["max_num_batched_tokens"], settings["max_num_seqs"]) == (2048, 256)
    assert settings["block_size"] == 128
    assert settings["scheduler_reserve_full_isl"] is False
    assert "scheduler_reserve_full_isl" in exp.description


def test_points_replay_one_request_set_and_carry_the_settings(tmp_path):
    exp = load_experiment(_write(tmp_path, SMALL))
    s2, cm = exp.build_point(concurrency=2)
    s8, _ = exp.build_point(concurrency=8)
    assert s2.mode == s8.mode == "closed"
    assert (s2.concurrency, s8.concurrency) == (2, 8)
    assert [(r.id, r.prompt_len, r.output_len) for r in s2.requests] == [
        (r.id, r.prompt_len, r.output_len) for r in s8.requests]
    assert len(s2.requests) == 20
    assert s2.settings.num_gpu_blocks == exp.pool().num_gpu_blocks
    assert s2.settings.max_num_batched_tokens == 8192  # H100 API-server default
    assert cm.geometry.name == "llama-3.1-8b"
    # the focus level defaults to the largest
    assert exp.build_point()[0].concurrency == 8


def test_overrides_resize_the_pool_or_replace_it(tmp_path):
    exp = load_experiment(_write(tmp_path, SMALL))
    base = exp.build_point(concurrency=2)[0].settings.num_gpu_blocks
    more = exp.build_point(concurrency=2, overrides={"gpu_memory_utilization": 0.95})[0]
    assert more.settings.num_gpu_blocks > base
    fixed = exp.build_point(concurrency=2, overrides={"num_gpu_blocks": 3000})[0]
    assert fixed.settings.num_gpu_blocks == 3000
    seqs = exp.build_point(concurrency=2, overrides={"max_num_seqs": 4, "policy": "priority"})[0]
    assert seqs.settings.max_num_seqs == 4 and seqs.settings.policy == "priority"
    with pytest.raises(InputError, match="max_num_sequences"):
        exp.build_point(concurrency=2, overrides={"max_num_sequences": 4})
    with pytest.raises(InputError, match="engine.gpu_memory_utilization"):
        exp.build_point(concurrency=2, overrides={"gpu_memory_utilization": 1.5})


def test_point_gives_a_recorder(tmp_path):
    exp = load_experiment(_write(tmp_path, SMALL))
    point = exp.point(overrides={"max_num_seqs": 4})
    assert point.scenario.settings.max_num_seqs == 4
    assert point.recorder.cache_config["num_gpu_blocks"] == point.settings["num_gpu_blocks"]
    assert point.variant == "max_num_seqs=4"


def test_variants_baseline_first_and_remedies(tmp_path):
    data = dict(SMALL, remedies=[{"parameter": "scheduler_reserve_full_isl",
                                  "values": [True, False]}])
    exp = load_experiment(_write(tmp_path, data))
    # H100 default max_num_seqs is 1024, so that value is the baseline and not repeated;
    # reserve_full_isl defaults to true, so only false is a remedy
    assert exp.variants() == {"baseline": {}, "max_num_seqs=4": {"max_num_seqs": 4}}
    assert list(exp.variants(include_remedies=True)) == [
        "baseline", "max_num_seqs=4", "scheduler_reserve_full_isl=false"]
    assert exp.remedies() == {"scheduler_reserve_full_isl=false":
                              {"scheduler_reserve_full_isl": False}}


def test_comparison_seeds_are_the_base_seed_then_derived_ones(tmp_path):
    exp = load_experiment(_write(tmp_path, SMALL))
    assert exp.seeds == [3]  # no seeds asked: the experiment's own only
    data = dict(SMALL, comparison={**SMALL["comparison"], "seeds": 4})
    exp = load_experiment(_write(tmp_path, data))
    seeds = exp.seeds
    assert seeds[0] == 3 and len(set(seeds)) == 4
    assert seeds == repeat_seeds(3, 4) and repeat_seeds(3, 2) == seeds[:2]  # fixed by the seed
    assert repeat_seeds(4, 2)[1] != seeds[1]
    # Each seed draws its own request set; the base seed's is the experiment's.
    base = exp.point(concurrency=2, seed=seeds[0]).scenario.requests
    other = exp.point(concurrency=2, seed=seeds[1], with_recorder=False)
    assert [r.prompt_len for r in base] == [r.prompt_len for r in exp.point(2).scenario.requests]
    assert [r.prompt_len for r in other.scenario.requests] != [r.prompt_len for r in base]
    assert other.recorder is None and other.scenario.seed == seeds[1]
    # The built-in experiments ask for three.
    assert all(len(load_experiment(n).seeds) == 3 for n in ("seed_case", "ci_small"))


def test_open_loop_points_have_arrival_times(tmp_path):
    data = dict(SMALL, workload={**SMALL["workload"], "concurrency": None,
                                 "request_rates": [1.0, 4.0]})
    del data["workload"]["concurrency"]
    exp = load_experiment(_write(tmp_path, data))
    slow = exp.build_point(request_rate=1.0)[0]
    fast = exp.build_point(request_rate=4.0)[0]
    assert slow.mode == "open"
    t_slow = [r.arrival_time_s for r in slow.requests]
    t_fast = [r.arrival_time_s for r in fast.requests]
    # same gaps drawn, scaled by the rate
    assert t_fast[1:] == pytest.approx([t / 4 for t in t_slow[1:]])
    assert [r.prompt_len for r in slow.requests] == [r.prompt_len for r in fast.requests]
    with pytest.raises(InputError, match="request rate"):
        exp.build_point(concurrency=4)


def test_prompts_longer_than_max_model_len_are_refused(tmp_path):
    exp = load_experiment(_write(tmp_path, SMALL))
    full = exp.build_point(concurrency=2)[0]
    short = exp.build_point(concurrency=2, overrides={"max_model_len": 2048})[0]
    expected = sum(1 for r in full.requests if r.prompt_len >= 2048)
    assert expected > 0
    assert len(short.requests) == len(full.requests) - expected
    assert short.annotations["refused_requests"] == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hardware": "tpu-v9"}, "unknown profile 'tpu-v9'"),
        ({"tensor_parallel_size": 0}, "field 'tensor_parallel_size'"),
        ({"engine": {"max_num_seq": 4}}, "field 'engine.max_num_seq'"),
        ({"engine": {"scheduling_policy": "lifo"}}, "field 'engine.scheduling_policy'"),
        ({"workload": {"num_requests": 5, "input_len": 10, "output_len": 5}},
         "concurrency"),
        ({"workload": {"num_requests": 5, "input_len": 10, "output_len": 5,
                       "concurrency": [4], "request_rates": [1.0]}}, "give one of concurrency"),
        ({"workload": {"num_requests": 5, "input_len": {"type": "uniform", "low": 1},
                       "output_len": 5, "concurrency": [4]}}, "field 'workload.input_len.high'"),
        ({"comparison": {"parameter": "max_num_sequences", "values": [4]}},
         "field 'comparison.parameter'"),
        ({"comparison": {"parameter": "max_num_seqs", "values": [4], "seeds": 0}},
         "field 'comparison.seeds'"),
        ({"remedies": [{"parameter": "max_num_seqs", "values": [4], "seeds": 3}]},
         "field 'remedies.0.seeds'"),
        ({"cost_model": {"eta_z": 0.3}}, "field 'cost_model'"),
        ({"typo_section": 1}, "field 'typo_section'"),
    ],
)
def test_validation_errors_name_the_file_and_field(tmp_path, change, message):
    path = _write(tmp_path, {**SMALL, **change})
    with pytest.raises(InputError) as err:
        load_experiment(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_experiment(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=r"bad\.yaml line \d+"):
        load_experiment(bad)
    with pytest.raises(InputError, match="expected a mapping"):
        experiment_from_dict(["not", "a", "mapping"])


def test_pool_that_cannot_start_is_refused(tmp_path):
    # 70B on one 64 GB card: the weights alone do not fit
    path = _write(tmp_path, {**SMALL, "hardware": "ascend-910b-64g", "model": "llama-3.1-70b"})
    with pytest.raises(InputError, match="weights"):
        load_experiment(path).build_point(concurrency=2)


def test_cost_model_overrides_apply(tmp_path):
    exp = load_experiment(_write(tmp_path, {**SMALL, "cost_model": {"t0": 0.01, "eta_m": 0.5}}))
    c = exp.cost_model.coefficients
    assert (c.t0, c.eta_m) == (0.01, 0.5)
