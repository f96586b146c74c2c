"""Sweeps: determinism across worker counts, the runs table, and the seed case's curve."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.pipeline.sweep import RUNS_COLUMNS, run_sweep
from kvpressure.simulation.experiment import load_experiment

INTERFACE_COLUMNS = (
    "run, variant, concurrency, request_rate, num_requests, duration_s, request_throughput, "
    "output_throughput, total_token_throughput, ttft_mean_s, ttft_p95_s, itl_mean_s, "
    "itl_p95_s, itl_p99_s, e2e_mean_s, preemptions, recomputed_tokens, recompute_ratio, "
    "recompute_ratio_low, recompute_ratio_high, mean_running, max_running, mean_kv_usage, "
    "source"
).split(", ")


def _tree(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "summary.json":
                # wall-clock timing of the loop is the one value that may differ per run
                summary = json.loads(data)
                summary.pop("timing")
                data = json.dumps(summary, sort_keys=True).encode()
            out[str(path.relative_to(root))] = data
    return out


def test_one_or_two_workers_give_identical_files(tmp_path):
    exp = load_experiment("ci_small")
    levels = [8, 32]
    one = run_sweep(exp, tmp_path / "one", concurrencies=levels, jobs=1)
    two = run_sweep(exp, tmp_path / "two", concurrencies=levels, jobs=2)
    a, b = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    assert a.keys() == b.keys()
    assert "points/baseline/c32/metrics.prom.jsonl" in a
    assert "points/max_num_seqs=20/c8/steps.csv" in a
    for name in a:
        assert a[name] == b[name], name
    pd.testing.assert_frame_equal(one, two)
    assert list(one["variant"]) == ["baseline", "baseline", "max_num_seqs=20", "max_num_seqs=20"]
    assert list(one["concurrency"]) == [8, 32, 8, 32]


def test_runs_table_columns_and_simulated_recompute(tmp_path):
    runs = run_sweep("ci_small", tmp_path, concurrencies=[16], jobs=1, compare=False)
    assert set(INTERFACE_COLUMNS) <= set(runs.columns)
    assert list(runs.columns[: len(RUNS_COLUMNS)]) == list(RUNS_COLUMNS)
    row = runs.iloc[0]
    assert row["source"] == "simulation"
    assert row["recompute_ratio_low"] == row["recompute_ratio"] == row["recompute_ratio_high"]
    assert row["max_num_seqs"] == 256 and row["num_gpu_blocks"] > 0
    summary = json.loads((tmp_path / "points/baseline/c16/summary.json").read_text())
    assert row["output_throughput"] == summary["output_throughput"]
    assert row["preemptions"] == summary["preemptions"]
    on_disk = pd.read_csv(tmp_path / "runs.csv")
    assert list(on_disk.columns) == list(runs.columns)
    assert len(on_disk) == 1


def test_unknown_variant_is_refused(tmp_path):
    with pytest.raises(InputError, match="max_num_seqs=3"):
        run_sweep("ci_small", tmp_path, variants=["max_num_seqs=3"], jobs=1)


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory) -> pd.DataFrame:
    return run_sweep("seed_case", tmp_path_factory.mktemp("seed"), jobs=2)


def test_seed_case_rises_flattens_and_falls_with_preemption(seed_runs):
    base = seed_runs[seed_runs.variant == "baseline"].sort_values("concurrency")
    tput = base["output_throughput"].to_numpy()
    conc = base["concurrency"].to_numpy()
    peak = int(tput.argmax())
    # rise: more clients pay at first, and the gains shrink (flatten) before the peak
    assert tput[0] < tput[1] < tput[peak]
    gains = (tput[1: peak + 1] - tput[:peak]) / (conc[1: peak + 1] - conc[:peak])
    assert gains[-1] < gains[0]
    # fall: the peak is interior and the highest level lost more than 15% of it
    assert 0 < peak < len(tput) - 1
    assert tput[-1] < 0.85 * tput[peak]
    # no preemption up to the peak; preemptions and recompute past it, growing
    pre = base["preemptions"].to_numpy()
    ratio = base["recompute_ratio"].to_numpy()
    assert pre[: peak + 1].sum() == 0
    assert (pre[peak + 1:] > 0).all()
    assert ratio[-1] > 0.3 and ratio[-1] >= ratio[peak + 1]
    # past the knee the pool is full and running stays far below max_num_seqs (silent OOM)
    last = base.iloc[-1]
    assert last["max_kv_usage"] == 1.0
    assert last["max_running"] < last["max_num_seqs"]
    assert last["recompute_time_share"] > 0.1


def test_seed_case_lower_max_num_seqs_removes_the_decline(seed_runs):
    base = seed_runs[seed_runs.variant == "baseline"].sort_values("concurrency")
    low = seed_runs[seed_runs.variant != "baseline"].sort_values("concurrency")
    assert low["max_num_seqs"].iloc[0] < base["max_num_seqs"].iloc[0]
    t_low = low["output_throughput"].to_numpy()
    assert t_low[-1] >= 0.97 * t_low.max()  # no decline
    assert low["preemptions"].sum() < base["preemptions"].sum()
    # at the highest concurrency the lower setting wins clearly
    assert t_low[-1] > 1.3 * base["output_throughput"].iloc[-1]


def test_sweep_command(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "ci_small", "--out", str(out), "--jobs", "1", "--no-compare",
                 "--concurrency", "4", "32"]) == 0
    err = capsys.readouterr().err
    assert "baseline concurrency 32" in err and "2 points" in err
    assert (out / "points/baseline/c4/metrics.prom.jsonl").is_file()
    assert len(pd.read_csv(out / "runs.csv")) == 2
    # refuses a non-empty output folder, and bad levels, with exit code 2
    assert main(["sweep", "ci_small", "--out", str(out)]) == 2
    assert main(["sweep", "ci_small", "--out", str(tmp_path / "x"), "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
