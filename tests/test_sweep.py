"""Sweeps: determinism across worker counts, the runs table, and the seed case's curve."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.simulation.experiment import load_experiment
from kvpressure.sweeps.sweep import RUNS_COLUMNS, run_sweep

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
        # a point's completion marker holds summary.json's hash, so it differs with the timing
        if path.is_file() and path.name != ".kvpressure-point.json":
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
    # Variant by variant, then repeat (workload seed) by repeat, then level.
    seeds = exp.seeds
    assert len(seeds) == 3 and seeds[0] == 7
    assert list(one["variant"]) == ["baseline"] * 6 + ["max_num_seqs=20"] * 6
    assert list(one["repeat"]) == [0, 0, 1, 1, 2, 2] * 2
    assert list(one["seed"]) == [s for s in seeds for _ in levels] * 2
    assert list(one["concurrency"]) == [8, 32] * 6
    # Only repeat 0 has point folders: 2 variants x 2 levels x 4 files.
    points = [Path(n) for n in a if n.startswith("points/")]
    assert len(points) == 2 * 2 * 4
    assert {p.parts[1] for p in points} == {"baseline", "max_num_seqs=20"}
    assert {p.parts[2] for p in points} == {"c8", "c32"}
    assert list(one["run"][:3]) == ["ci_small/baseline/c8", "ci_small/baseline/c32",
                                    f"ci_small/baseline/c8/seed{seeds[1]}"]


def test_repeats_are_the_points_with_other_request_sets(tmp_path):
    from kvpressure.simulation.engine import simulate

    exp = load_experiment("ci_small")
    runs = run_sweep(exp, tmp_path / "a", concurrencies=[24], jobs=1, compare=False)
    assert list(runs["repeat"]) == [0, 1, 2] and list(runs["seed"]) == exp.seeds
    # Each repeat is the point simulated with its seed's request set (without the recorder,
    # which observes and changes nothing).
    for seed, tput in zip(runs["seed"], runs["output_throughput"], strict=True):
        point = exp.point(concurrency=24, seed=int(seed), with_recorder=False)
        assert point.recorder is None and point.scenario.seed == seed
        assert simulate(point.scenario, cost_model=point.cost_model).summary[
            "output_throughput"] == tput
    # Different request sets give different throughputs.
    assert runs["output_throughput"].nunique() == 3
    # No point folders at all, or one seed only: the same rows.
    bare = run_sweep(exp, tmp_path / "b", concurrencies=[24], jobs=1, compare=False,
                     write_points=False)
    assert not (tmp_path / "b" / "points").exists()
    pd.testing.assert_frame_equal(bare, runs)
    single = run_sweep(exp, tmp_path / "c", concurrencies=[24], jobs=1, compare=False, seeds=1)
    pd.testing.assert_frame_equal(single, runs.iloc[:1])
    with pytest.raises(InputError, match="seeds"):
        run_sweep(exp, tmp_path / "d", concurrencies=[24], jobs=1, seeds=0)


def test_runs_table_columns_and_simulated_recompute(tmp_path):
    runs = run_sweep("ci_small", tmp_path, concurrencies=[16], jobs=1, compare=False, seeds=1)
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
    assert (row["seed"], row["repeat"]) == (7, 0)


def test_unknown_variant_is_refused(tmp_path):
    with pytest.raises(InputError, match="max_num_seqs=3"):
        run_sweep("ci_small", tmp_path, variants=["max_num_seqs=3"], jobs=1)


@pytest.fixture(scope="module")
def all_seed_runs(tmp_path_factory) -> pd.DataFrame:
    return run_sweep("seed_case", tmp_path_factory.mktemp("seed"), jobs=2)


@pytest.fixture(scope="module")
def seed_runs(all_seed_runs) -> pd.DataFrame:
    """The experiment's own seed (repeat 0)."""
    return all_seed_runs[all_seed_runs["repeat"] == 0]


@pytest.mark.slow
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


def test_seed_case_shape_holds_for_every_workload_seed(all_seed_runs):
    assert all_seed_runs["seed"].nunique() == 3
    for seed, runs in all_seed_runs.groupby("seed"):
        base = runs[runs.variant == "baseline"].sort_values("concurrency")
        low = runs[runs.variant != "baseline"].sort_values("concurrency")
        t_base, t_low = base["output_throughput"].to_numpy(), low["output_throughput"].to_numpy()
        # the baseline falls past an interior peak; the lower max_num_seqs holds its peak
        assert 0 < t_base.argmax() < len(t_base) - 1 and t_base[-1] < 0.85 * t_base.max(), seed
        assert t_low[-1] >= 0.97 * t_low.max() and low["preemptions"].sum() == 0, seed


def test_sweep_command(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "ci_small", "--out", str(out), "--jobs", "1", "--no-compare",
                 "--concurrency", "4", "32"]) == 0
    err = capsys.readouterr().err
    # two levels, each with the experiment's three workload seeds
    assert "baseline concurrency 32" in err and "6 points" in err
    assert (out / "points/baseline/c4/metrics.prom.jsonl").is_file()
    assert len(pd.read_csv(out / "runs.csv")) == 6
    # refuses a non-empty output folder, and bad levels, with exit code 2
    assert main(["sweep", "ci_small", "--out", str(out)]) == 2
    assert main(["sweep", "ci_small", "--out", str(tmp_path / "x"), "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_levels_take_vllm_bench_serves_option_names(tmp_path, capsys):
    """--max-concurrency as vllm bench serve spells it; --request-rate on a closed loop is
    refused naming the option that fits."""
    out = tmp_path / "s"
    assert main(["sweep", "ci_small", "--out", str(out), "--max-concurrency", "4",
                 "--no-compare", "--jobs", "1"]) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["concurrency"].unique().tolist()) == [4]
    capsys.readouterr()
    assert main(["sweep", "ci_small", "--out", str(tmp_path / "r"), "--request-rate", "2",
                 "--no-compare"]) == 2
    assert "--request-rate: ci_small is a closed loop; give its levels with --concurrency" in (
        capsys.readouterr().err)
