"""kvpressure tune: grid parsing, limits, the throughput within them and the Pareto front on hand-worked records,
vLLM's refusals listed, the baseline equal to the sweep's, streaming and resuming, and the same
bytes on every executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpressure.analysis.limits import parse_limits
from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.tune.api import run_tune
from kvpressure.tune.grid import config_id, expand, load_grid_file, parse_param_options
from kvpressure.tune.ranking import best_within_limits, pareto_front, rank
from kvpressure.tune.results import RESULTS

CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"
OUTPUTS = ("tune.csv", "levels.csv", "invalid.csv", "pareto.csv", "recommendation.json",
           "tune.md")
GRID = {"max_num_seqs": [8, 24], "scheduler_reserve_full_isl": [False, True]}
LIMITS = "ttft_p95=10s,itl_p95=150ms"


def outputs(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in OUTPUTS}


# --- grid ------------------------------------------------------------------------------------
def test_param_forms():
    got = parse_param_options(["max_num_seqs=16..256", "max_num_batched_tokens=512..2048:512",
                               "gpu_memory_utilization=0.8..0.95:0.05",
                               "scheduler_reserve_full_isl=true,false", "policy=fcfs"])
    assert got == {"max_num_seqs": [16, 32, 64, 128, 256],
                   "max_num_batched_tokens": [512, 1024, 1536, 2048],
                   "gpu_memory_utilization": [0.8, 0.85, 0.9, 0.95],
                   "scheduler_reserve_full_isl": [True, False],
                   "scheduling_policy": ["fcfs"]}
    configs = expand({"a": [1, 2], "b": [3, 4, 5]})
    assert len(configs) == 6 and configs[0] == {"a": 1, "b": 3} and configs[-1] == {"a": 2, "b": 5}
    assert config_id({"max_num_seqs": 16, "gpu_memory_utilization": 0.9}) == \
        "gpu_memory_utilization=0.9,max_num_seqs=16"


@pytest.mark.parametrize("option, says", [
    ("max_num_sequences=4", "unknown parameter 'max_num_sequences'"),
    ("max_num_seqs=4.5", "takes an integer"),
    ("max_num_seqs=256..16", "runs backwards"),
    ("enable_prefix_caching=maybe", "true or false"),
    ("max_num_seqs", "expected NAME=VALUES"),
    ("max_num_seqs=0..64", "must start above 0"),
])
def test_param_errors_name_the_option(option, says):
    with pytest.raises(InputError, match=says) as err:
        parse_param_options([option])
    assert "--param" in str(err.value)


def test_grid_file(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("parameters:\n  max_num_seqs: 8..32\n  tensor_parallel_size: [1, 2]\n"
                    "limits: {ttft_p95: 2s, itl_p95: 80ms}\n")
    values, limits = load_grid_file(path)
    assert values == {"max_num_seqs": [8, 16, 32], "tensor_parallel_size": [1, 2]}
    assert parse_limits(limits) == {"ttft_p95_s": 2.0, "itl_p95_s": 0.08}
    path.write_text("parameters:\n  max_num_seqs: [8]\n  bogus: [1]\n")
    with pytest.raises(InputError, match=r"grid.yaml: parameters.bogus: unknown parameter"):
        load_grid_file(path)


def test_limits():
    assert parse_limits("ttft_p95=2s,itl_p95=80ms") == {"ttft_p95_s": 2.0, "itl_p95_s": 0.08}
    assert parse_limits("itl_p99=500us") == {"itl_p99_s": pytest.approx(5e-4)}
    for bad in ("ttft_p42=2s", "ttft_p95=fast", "ttft_p95=0s", "ttft_p95"):
        with pytest.raises(InputError, match="--limits"):
            parse_limits(bad)


# --- ranking on hand-worked records -------------------------------------------------------------
def _level(level, thr, ttft, itl):
    return {"level": level, "output_throughput": thr, "ttft_p95_s": ttft, "itl_p95_s": itl,
            "preemptions": 0, "recompute_ratio": 0.0}


def test_the_best_level_within_limits():
    limits = {"ttft_p95_s": 2.0, "itl_p95_s": 0.08}
    levels = [_level(4, 100, 0.5, 0.03), _level(8, 180, 1.5, 0.07), _level(16, 260, 1.9, 0.09),
              _level(32, 300, 5.0, 0.2)]
    g, at = best_within_limits(levels, limits)
    assert (g, at["level"]) == (180, 8)  # 16 breaks the ITL limit, 32 both
    assert best_within_limits(levels, {"ttft_p95_s": 0.1}) == (0.0, None)
    records = [
        {"id": "baseline", "status": "ok", "config": {}, "settings": {}, "levels": levels},
        {"id": "max_num_seqs=8", "status": "ok", "config": {"max_num_seqs": 8}, "settings": {},
         "levels": [_level(4, 100, 0.5, 0.03), _level(8, 200, 1.0, 0.05)]},
        {"id": "max_num_seqs=99", "status": "invalid", "config": {"max_num_seqs": 99},
         "reason": "no", "settings": None, "levels": []},
    ]
    table = rank(records, ["max_num_seqs"], limits, {"max_num_seqs": 256})
    assert list(table["id"]) == ["max_num_seqs=8", "baseline"]
    assert list(table["within_limits_output_tok_s"]) == [200, 180]
    assert list(table["rank"]) == [1, 2]


def test_pareto_front_hand_worked():
    import pandas as pd

    pts = pd.DataFrame({"id": list("abcde"), "ttft_p95_s": [1.0, 2.0, 2.0, 3.0, 4.0],
                        "output_throughput": [100, 150, 120, 140, 200]})
    front = pareto_front(pts, "ttft_p95_s")
    # c is beaten by b (same latency, more throughput), d by b (less latency, more throughput)
    assert list(front["id"]) == ["a", "b", "e"]


# --- on the small experiment -------------------------------------------------------------------
def test_invalid_configurations_listed_with_vllm_reason(tmp_path):
    result = run_tune(str(CI_SMALL), tmp_path, limits=LIMITS, configs=[
        {"max_model_len": 300000},           # the pool cannot hold one such request
        {"tensor_parallel_size": 3},         # 32 attention heads over 3 ranks
        {"max_num_seqs": 64, "max_num_batched_tokens": 32},  # vLLM's config check
        {"max_num_seqs": 8},
    ])
    reasons = dict(zip(result.invalid["id"], result.invalid["reason"], strict=True))
    assert set(reasons) == {"max_model_len=300000", "tensor_parallel_size=3",
                            "max_num_batched_tokens=32,max_num_seqs=64"}
    assert "to serve at least one request of 300000 tokens" in reasons["max_model_len=300000"]
    assert "not divisible by tensor_parallel_size 3" in reasons["tensor_parallel_size=3"]
    assert "must be >= max_num_seqs (64)" in reasons["max_num_batched_tokens=32,max_num_seqs=64"]
    assert set(result.table["id"]) == {"baseline", "max_num_seqs=8"}
    invalid_csv = (tmp_path / "invalid.csv").read_text()
    assert "tensor_parallel_size=3" in invalid_csv and "max_model_len=300000" in invalid_csv


def test_baseline_equals_the_sweep(tmp_path):
    """The tune's baseline and a max_num_seqs config, simulated by another path (the sweep),
    give the same output throughput at every level."""
    from kvpressure.sweeps.sweep import run_sweep

    result = run_tune(str(CI_SMALL), tmp_path / "tune", limits=LIMITS,
                      configs=[{"max_num_seqs": 20}])
    runs = run_sweep(str(CI_SMALL), tmp_path / "sweep", jobs=1, seeds=1, write_points=False)
    for variant, cid in (("baseline", "baseline"), ("max_num_seqs=20", "max_num_seqs=20")):
        swept = runs[runs["variant"] == variant].set_index("concurrency")["output_throughput"]
        tuned = result.levels[result.levels["id"] == cid].set_index("concurrency")[
            "output_throughput"]
        assert len(tuned) == 6
        assert tuned.to_dict() == swept.to_dict()


@pytest.mark.slow
def test_streamed_results_survive_an_interruption_and_are_reused(tmp_path):
    clean = run_tune(str(CI_SMALL), tmp_path / "clean", parameters=GRID, limits=LIMITS)
    assert clean.simulated == clean.configurations == 5

    def stop_after_two(done):
        if done >= 2:
            raise KeyboardInterrupt

    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run_tune(str(CI_SMALL), out, parameters=GRID, limits=LIMITS, batch=1,
                 on_batch=stop_after_two)
    lines = (out / RESULTS).read_text().splitlines()
    assert len(lines) == 2
    # a line cut mid-write by a crash is dropped, not misread
    with open(out / RESULTS, "a") as fh:
        fh.write(lines[0][: len(lines[0]) // 2])
    again = run_tune(str(CI_SMALL), out, parameters=GRID, limits=LIMITS, batch=1)
    assert (again.reused, again.simulated) == (2, 3)
    assert outputs(out) == outputs(tmp_path / "clean")
    records = [json.loads(x) for x in (out / RESULTS).read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(clean.table["id"])
    # other limits re-rank without simulating anything
    tighter = run_tune(str(CI_SMALL), out, parameters=GRID, limits="ttft_p95=5s")
    assert tighter.simulated == 0 and tighter.limits == {"ttft_p95_s": 5.0}


def test_same_bytes_serial_and_processes(tmp_path):
    configs = [{"max_num_seqs": 8}, {"max_num_seqs": 24}, {"tensor_parallel_size": 3},
               {"scheduler_reserve_full_isl": True}]
    run_tune(str(CI_SMALL), tmp_path / "serial", configs=configs, limits=LIMITS)
    run_tune(str(CI_SMALL), tmp_path / "procs", configs=configs, limits=LIMITS,
             executor="processes:2", batch=1)
    assert outputs(tmp_path / "serial") == outputs(tmp_path / "procs")


# --- the command -------------------------------------------------------------------------------
def test_cli_runs_and_reruns(tmp_path, capsys):
    out = tmp_path / "tune"
    argv = ["tune", str(CI_SMALL), "--param", "max_num_seqs=8,24", "--limits", LIMITS,
            "--out", str(out)]
    assert main(argv) == 0
    first = outputs(out)
    assert (out / "pareto.png").stat().st_size > 0 and (out / "recommended.png").is_file()
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["recommended"]["id"] in set(first["tune.csv"].decode().split(",")) | {"baseline"}
    capsys.readouterr()
    assert main(argv) == 0
    assert "0 simulated, 3 reused" in capsys.readouterr().err
    assert outputs(out) == first


@pytest.mark.parametrize("extra, says", [
    (["--param", "max_num_seqs=x"], "--param"),
    (["--param", "max_num_seqs=8", "--limits", "ttft=1s"], "--limits"),
    (["--param", "max_num_seqs=8", "--executor", "spark://x"], "--executor"),
    ([], "--grid FILE or with --param"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, extra, says):
    assert main(["tune", str(CI_SMALL), "--out", str(tmp_path / "o"), *extra]) == 2
    assert says in capsys.readouterr().err


# --- the measured twin -------------------------------------------------------------------------
def test_twin_target(tmp_path):
    from twin_helpers import SETTINGS, synthetic_run

    run_dir = synthetic_run(tmp_path / "run")
    result = run_tune(str(run_dir), tmp_path / "tune", limits="ttft_p95=30s",
                      configs=[{"max_num_seqs": 1}, {"max_num_seqs": 4},
                               {"max_model_len": 4096}])
    assert set(result.levels["concurrency"]) == {1, 2, 4, 6, 8, 12}
    reasons = dict(zip(result.invalid["id"], result.invalid["reason"], strict=True))
    # 4096 tokens need 256 blocks of 16; the measured pool has 40
    assert "256 KV blocks are needed, more than the 39 available" in reasons["max_model_len=4096"]
    lv = result.levels.set_index(["id", "concurrency"])
    # max_num_seqs 1 runs one sequence at a time: never more running, never a preemption
    assert lv.loc[("max_num_seqs=1", 12), "mean_running"] <= 1.0
    assert lv.loc[("max_num_seqs=1", 12), "preemptions"] == 0
    assert lv.loc[("baseline", 12), "mean_running"] > 1.0
    assert SETTINGS["max_num_seqs"] == 32
    with pytest.raises(InputError, match="not tunable on a measured twin"):
        run_tune(str(run_dir), tmp_path / "t2", configs=[{"gpu_memory_utilization": 0.8}])


def test_tune_set_gives_a_run_folders_twin_a_setting(tmp_path, capsys):
    from kvpressure.tune.targets import load_target
    from twin_helpers import synthetic_run

    run_dir = synthetic_run(tmp_path / "run", levels=(2, 4, 8))
    target = load_target(str(run_dir), overrides={"max_num_seqs": "6"})
    assert target.settings["max_num_seqs"] == 6
    assert target.identity() != load_target(str(run_dir)).identity()
    with pytest.raises(InputError, match="--set: .* is an experiment"):
        load_target(str(CI_SMALL), overrides={"max_num_seqs": "6"})
    assert main(["tune", str(run_dir), "--out", str(tmp_path / "t"), "--param",
                 "max_num_seqs=2,4", "--set", "max_num_seqs"]) == 2
    assert "--set 'max_num_seqs': expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_keeps_finished_configurations_for_the_rerun(tmp_path):
    """The command, interrupted with SIGINT while its workers run: exit 130, the finished
    configurations kept; the same command then simulates only the rest, and its tables are
    those of an uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "tune"
    argv = [sys.executable, "-m", "kvpressure.cli", "tune", str(CI_SMALL), "--param",
            "max_num_seqs=4,8,12,16,20,24", "--limits", LIMITS, "--executor", "processes:2",
            "--batch", "1", "--out", str(out)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    stream = tmp_path / ".tune.kvpressure-partial" / "tune" / RESULTS
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if stream.is_file() and stream.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert "finished configuration(s) kept" in err
    kept = stream.read_text().count("\n")
    assert 2 <= kept < 7 and not out.exists()
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{7 - kept} simulated, {kept} reused" in rerun.stderr
    clean = tmp_path / "clean"
    run_tune(str(CI_SMALL), clean, parameters={"max_num_seqs": [4, 8, 12, 16, 20, 24]},
             limits=LIMITS)
    assert outputs(out) == outputs(clean)
