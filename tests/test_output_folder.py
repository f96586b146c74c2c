"""Output folders: a marker, a lock, whole replacement, and sweep points reused only whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.folders.output_folder import MARKER, output_folder, read_marker
from kvpressure.sweeps.point_marker import POINT_MARKER

TESTS = Path(__file__).parent
LIGHT = TESTS / "data" / "vllm-0.33-scheduler" / "light_open_prefix_groups.scenario.json"


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes; the wall-clock timing in summary.json (and the markers holding its
    hash) are the only things two identical runs may differ in."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name in (MARKER, POINT_MARKER):
            continue
        data = p.read_bytes()
        if p.name == "summary.json":
            summary = json.loads(data)
            summary.pop("timing", None)
            data = json.dumps(summary, sort_keys=True).encode()
        out[p.relative_to(root).as_posix()] = data
    return out


def test_marker_names_command_inputs_files_and_completion(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    marker = read_marker(out)
    assert marker is not None and marker["command"] == "simulate" and marker["complete"]
    assert list(marker["inputs"]) == [str(LIGHT)]
    assert len(marker["inputs"][str(LIGHT)]) == 64
    assert sorted(marker["files"]) == ["metrics.prom.jsonl", "requests.csv", "steps.csv",
                                       "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no sibling left behind


def test_force_replaces_the_whole_folder(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    assert (out / "metrics.prom.jsonl").exists()
    assert main(["simulate", str(LIGHT), "--out", str(out), "--force", "--no-metrics"]) == 0
    # the earlier run's Prometheus view does not linger beside the new run
    assert not (out / "metrics.prom.jsonl").exists()
    assert read_marker(out)["files"] == ["requests.csv", "steps.csv", "summary.json"]


def test_a_failed_run_leaves_the_earlier_one_whole(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    before = _files(out)
    with pytest.raises(RuntimeError), output_folder(out, "simulate", force=True) as work:
        (work / "steps.csv").write_text("half")
        raise RuntimeError("disk full")
    assert _files(out) == before
    assert read_marker(out)["complete"] is True


def test_a_second_run_into_a_held_folder_names_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    with output_folder(out, "simulate"):
        code = main(["simulate", str(LIGHT), "--out", str(out)])
        err = capsys.readouterr().err
    assert code == 2
    assert f"pid {os.getpid()}" in err and "another kvpressure run" in err
    assert read_marker(out)["complete"] is True  # the holder finished; nothing mixed in


def test_a_file_added_to_a_run_folder_makes_it_foreign(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", str(LIGHT), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="notes.txt"), output_folder(out, "simulate",
                                                                      force=True):
        pass
    assert (out / "notes.txt").read_text() == "mine"


def test_a_rerun_reuses_only_whole_points(tmp_path):
    args = ["sweep", "ci_small", "--concurrency", "8", "32", "--no-compare", "--jobs", "1"]
    clean = tmp_path / "clean"
    assert main([*args, "--out", str(clean)]) == 0
    # What a killed run leaves: its hidden sibling with some points; one cut short by a
    # full disk (complete marker, cut steps.csv), one without a marker, one stale.
    out = tmp_path / "again"
    partial = tmp_path / ".again.kvpressure-partial" / "again"
    shutil.copytree(clean / "points", partial / "points")
    cut = partial / "points" / "baseline" / "c8" / "steps.csv"
    cut.write_bytes(cut.read_bytes()[:1000])
    (partial / "points" / "baseline" / "c32" / POINT_MARKER).unlink()
    (partial / "points" / "baseline" / "c99").mkdir()
    (partial / "points" / "baseline" / "c99" / "steps.csv").write_text("stale")
    (partial / "runs.csv").write_text("stale")
    assert main([*args, "--out", str(out)]) == 0
    assert _files(out) == _files(clean)
    assert not (tmp_path / ".again.kvpressure-partial").exists()


def test_a_whole_point_is_reused_not_recomputed(tmp_path):
    args = ["sweep", "ci_small", "--concurrency", "8", "--no-compare", "--jobs", "1"]
    clean = tmp_path / "clean"
    assert main([*args, "--out", str(clean)]) == 0
    partial = tmp_path / ".again.kvpressure-partial" / "again"
    shutil.copytree(clean / "points", partial / "points")
    summary = partial / "points" / "baseline" / "c8" / "summary.json"
    stamp = summary.stat().st_mtime_ns
    assert main([*args, "--out", str(tmp_path / "again")]) == 0
    reused = tmp_path / "again" / "points" / "baseline" / "c8" / "summary.json"
    assert reused.stat().st_mtime_ns == stamp
    assert _files(tmp_path / "again") == _files(clean)


def test_a_folder_the_notebooks_wrote_in_place_is_the_reports_to_replace(tmp_path):
    from kvpressure.folders.output_folder import check_replaceable
    from kvpressure.folders.run_folder import write_stage
    from kvpressure.stages.results import CollectInfo, KneeResult

    run = tmp_path / "ci_small"
    (run / "points" / "baseline" / "c8").mkdir(parents=True)
    (run / "runs.csv").write_text("run\n")
    # Only whether a stage was written matters here, not what it holds.
    write_stage(run, CollectInfo.model_construct(mode="simulation"))
    # written after the first stage, as the later notebooks do
    write_stage(run, KneeResult.model_construct())
    (run / "record.yaml").write_text("status: x\n")
    (run / "points" / "baseline" / "c8" / "steps.csv").write_text("step\n")
    assert read_marker(run)["command"] == "notebooks"
    check_replaceable(run, force=False, command="report", rerun_ok=True)
    with pytest.raises(InputError, match="--force"):
        check_replaceable(run, force=False, command="sweep")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="notes.txt"):
        check_replaceable(run, force=True, command="report", rerun_ok=True)


def test_runs_started_at_once_into_one_folder_leave_one_whole_run(tmp_path):
    """Real processes racing for one --out: each finishes or is refused naming another of
    them, and the folder holds one complete run, byte-equal to a run on its own."""
    import re
    import subprocess
    import sys

    out, alone = tmp_path / "shared", tmp_path / "alone"
    argv = [sys.executable, "-m", "kvpressure.cli", "simulate", str(LIGHT), "--force"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([*argv, "--out", str(out)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    results = [(p.pid, p.wait(timeout=300), p.stderr.read()) for p in procs]
    pids = {pid for pid, _, _ in results}
    assert any(code == 0 for _, code, _ in results), results
    for pid, code, err in results:
        assert code in (0, 2), err
        if code == 2:
            holder = re.search(r"another kvpressure run \(pid (\d+)\)", err)
            assert holder and int(holder.group(1)) in pids - {pid}, err
    assert main(["simulate", str(LIGHT), "--out", str(alone)]) == 0
    assert read_marker(out)["complete"] is True
    assert _files(out) == _files(alone)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "shared"]  # no leftovers
