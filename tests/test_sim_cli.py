"""``kvpressure simulate``: outputs, exit codes, --set, --force, --step-by-step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpressure.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm-0.33-scheduler"
LIGHT = DATA / "light_open_prefix_groups.scenario.json"


def test_simulate_writes_the_reference_files(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    name = "light_open_prefix_groups"
    assert (out / "steps.csv").read_text() == (DATA / f"{name}.steps.csv").read_text()
    assert (out / "requests.csv").read_text() == (DATA / f"{name}.requests.csv").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prefix_cache_hits"] == 126976
    assert set(summary["timing"]) == {"loop_wall_s", "steps_per_second", "setup_s", "finish_s",
                                      "import_s"}


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_timed_loop_imports_nothing(native):
    # loop_wall_s is the loop alone: a module first imported inside it (numpy at the steps
    # table's first flush, say) would be timed as simulation. A fresh interpreter, so that
    # nothing this test session imported hides it.
    code = (
        "import sys\n"
        "from kvpressure.simulation.engine import simulate\n"
        "from kvpressure.simulation.scenario import load_scenario\n"
        "new = []\n"
        f"sc = load_scenario({str(DATA / 'heavy_closed_c64_fcfs.scenario.json')!r})\n"
        "before = set(sys.modules)\n"
        "simulate(sc)\n"
        "new += set(sys.modules) - before\n"
        "from kvpressure.simulation.experiment import load_experiment\n"
        f"point = load_experiment({str(ROOT / 'data/experiments/ci_small.yaml')!r}).point()\n"
        "before = set(sys.modules)\n"
        "simulate(point.scenario, cost_model=point.cost_model, recorder=point.recorder)\n"
        "new += set(sys.modules) - before\n"
        "print(sorted(new))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ, KVPRESSURE_NATIVE=native))
    assert out.stdout.strip() == "[]"


def test_outputs_are_byte_identical_across_runs_and_paths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["simulate", str(LIGHT), "--out", str(a)]) == 0
    assert main(["simulate", str(LIGHT), "--out", str(b), "--step-by-step"]) == 0
    for f in ("steps.csv", "requests.csv", "metrics.prom.jsonl"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    sa.pop("timing"), sb.pop("timing")
    assert sa == sb


def test_an_earlier_run_is_replaced_only_with_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["simulate", str(LIGHT), "--out", str(out), "--force"]) == 0


def test_a_folder_with_foreign_files_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "x").write_text("keep")
    assert main(["simulate", str(LIGHT), "--out", str(out), "--force"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["x"]


def test_set_overrides_a_setting(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out), "--set", "max_num_seqs=4",
                 "--set", "enable_prefix_caching=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["max_num_seqs"] == 4
    assert summary["max_running"] == 4
    assert summary["prefix_cache_queries"] == 0


def test_invalid_input_exits_2_naming_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"settings": {"num_gpu_blocks": 10},
                               "requests": [{"id": "x1", "prompt_len": 5, "output_len": 0}]}))
    assert main(["simulate", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "x1" in err and "output_len" in err
    assert main(["simulate", str(LIGHT), "--out", str(tmp_path / "p"),
                 "--set", "nonsense=1"]) == 2
    assert main(["simulate", str(tmp_path / "missing.json"), "--out",
                 str(tmp_path / "q")]) == 2


def test_step_level_run_writes_its_prometheus_view_on_the_step_clock(tmp_path):
    """The light reference run's view: scrapes every 50 steps of 15.625 ms plus a final one,
    and its counters at the end agree with the run's own totals."""
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    scrapes = [json.loads(line) for line in (out / "metrics.prom.jsonl").read_text().splitlines()]
    assert [s["t"] for s in scrapes[:3]] == [0.78125, 1.5625, 2.34375]
    final = {
        (sample.name, sample.labels.get("finished_reason")): sample.value
        for family in text_string_to_metric_families(scrapes[-1]["text"])
        for sample in family.samples
    }
    summary = json.loads((out / "summary.json").read_text())
    assert final[("vllm:prompt_tokens_total", None)] == summary["total_prompt_tokens"]
    assert final[("vllm:generation_tokens_total", None)] == summary["total_output_tokens"]
    assert final[("vllm:request_success_total", "length")] == summary["num_requests"]
    assert final[("vllm:num_preemptions_total", None)] == summary["preemptions"] == 0
    assert final[("vllm:prefix_cache_hits_total", None)] == summary["prefix_cache_hits"]
    assert not (tmp_path / "bare").exists()
    assert main(["simulate", str(LIGHT), "--out", str(tmp_path / "bare"), "--no-metrics"]) == 0
    assert not (tmp_path / "bare" / "metrics.prom.jsonl").exists()


def test_no_metrics_is_honoured_for_an_experiment(tmp_path):
    """An experiment point with and without its Prometheus view: the same simulation (the view
    only watches), one folder without metrics.prom.jsonl."""
    from kvpressure.paths import REPO_ROOT

    exp = REPO_ROOT / "data" / "experiments" / "ci_small.yaml"
    args = ["--concurrency", "8"]
    assert main(["simulate", str(exp), "--out", str(tmp_path / "full"), *args]) == 0
    assert main(["simulate", str(exp), "--out", str(tmp_path / "bare"), "--no-metrics",
                 *args]) == 0
    assert (tmp_path / "full" / "metrics.prom.jsonl").is_file()
    assert not (tmp_path / "bare" / "metrics.prom.jsonl").exists()
    for name in ("steps.csv", "requests.csv"):
        assert (tmp_path / "bare" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    full, bare = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("full", "bare"))
    assert full.pop("timing") and bare.pop("timing")  # wall-clock speed, not a result
    assert bare == full
