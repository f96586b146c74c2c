"""kill -9 of ``sweep`` and ``report`` at a random moment, then a rerun: the rerun completes, its
outputs equal a clean run's, and no worker process outlives the killed run. SIGTERM and Ctrl-C
stop a run with exit 130 and one line, leaving no output folder."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.paths import data_dir
from kvpressure.sweeps.point_marker import POINT_MARKER

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"
SWEEP = ["--concurrency", "8", "32", "--jobs", "2"]


def _children() -> dict[int, int]:
    """pid -> parent pid of every process (zombies left out: they hold no memory)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


def _descendants(root: int) -> set[int]:
    parent = _children()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _kill_at_random(argv: list[str], delay: float, tmp: Path, children: int = 1,
                    after: Callable[[], bool] | None = None) -> set[int]:
    """Start the command, wait for it to start ``children`` processes (its workers) and for
    ``after()`` to hold (some output written), kill -9 it ``delay`` seconds later; return every
    descendant seen."""
    proc = subprocess.Popen([sys.executable, "-m", "kvpressure.cli", *argv], cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[int] = set()
    end = time.monotonic() + 120
    while time.monotonic() < end and proc.poll() is None and (
            len(seen) < children or (after is not None and not after())):
        seen |= _descendants(proc.pid)
        time.sleep(0.005)
    end = time.monotonic() + delay
    while time.monotonic() < end and proc.poll() is None:
        seen |= _descendants(proc.pid)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return seen


def _left_alive(pids: set[int], wait_s: float = 10.0) -> set[int]:
    end = time.monotonic() + wait_s
    while True:
        alive = pids & set(_children())
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


def _files(root: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or p.name.startswith(".kvpressure") or rel.startswith(skip):
            continue
        data = p.read_bytes()
        if p.name == "summary.json":  # its wall-clock timing is the one thing that may differ
            summary = json.loads(data)
            summary.pop("timing", None)
            data = json.dumps(summary, sort_keys=True).encode()
        out[rel] = data
    return out


def test_sweep_killed_at_random_moments_then_rerun(tmp_path):
    clean = tmp_path / "clean"
    assert main(["sweep", str(CI_SMALL), "--out", str(clean), *SWEEP]) == 0
    expected = _files(clean)
    rng = random.Random(11)
    out = tmp_path / "killed"
    partial = tmp_path / ".killed.kvpressure-partial"

    def first_point_done() -> bool:
        # The kill lands mid-run whatever this machine's speed: once a point is complete.
        return partial.is_dir() and any(partial.rglob(POINT_MARKER))

    left_partial = False
    for _ in range(2):
        seen = _kill_at_random(["sweep", str(CI_SMALL), "--out", str(out), *SWEEP, "--force"],
                               rng.uniform(0.0, 0.05), tmp_path, children=2,
                               after=first_point_done)
        assert len(seen) >= 2, "killed before the pool started: nothing was tested"
        assert not _left_alive(seen), "workers outlived the killed sweep"
        left_partial |= partial.exists()
        # the folder is the old complete run or absent, never half of one
        assert not out.exists() or json.loads((out / ".kvpressure.json").read_text())["complete"]
    assert left_partial, "no kill landed mid-run"
    assert main(["sweep", str(CI_SMALL), "--out", str(out), *SWEEP, "--force"]) == 0
    assert _files(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean", "killed"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_sweep_exits_130_with_one_line_and_no_folder(tmp_path, signum):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpressure.cli", "sweep", str(CI_SMALL), "--out", str(out),
         *SWEEP], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    partial = tmp_path / ".out.kvpressure-partial"
    end = time.monotonic() + 120
    # Signalled mid-run: once the first point is complete.
    while time.monotonic() < end and proc.poll() is None and not (
            partial.is_dir() and any(partial.rglob(POINT_MARKER))):
        seen |= _descendants(proc.pid)
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("the sweep finished before the signal")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [x for x in err.splitlines() if not x.startswith("[") and not x.startswith("sweep ")]
    assert lines == ["kvpressure sweep: interrupted; nothing half-written was kept"], err
    assert not out.exists()
    assert not _left_alive(seen)


@pytest.mark.slow
def test_report_killed_then_rerun_is_whole_and_escapes_every_name(tmp_path):
    """Also the page's escaping: the experiment's name, the served model name (the model_name
    label of the simulated scrapes) and the run folder's name are script payloads."""
    data = yaml.safe_load(CI_SMALL.read_text())
    data["name"] = "<script>alert(1)"
    data["served_model_name"] = "<img src=x onerror=alert(2)>"
    exp = tmp_path / "payload.yaml"
    exp.write_text(yaml.safe_dump(data))
    out = tmp_path / "<svg onload=alert(3)>"
    argv = ["report", "--experiment", str(exp), "--out", str(out)]
    seen = _kill_at_random(argv, random.Random(5).uniform(3.0, 10.0), tmp_path, children=2)
    assert seen, "the report started no process to check"
    assert not _left_alive(seen), "kernels or workers outlived the killed report"
    assert not out.exists()
    assert main(argv) == 0
    # the rerun's sweep equals a clean sweep of the same experiment
    clean = tmp_path / "clean"
    assert main(["sweep", str(exp), "--out", str(clean)]) == 0
    assert _files(out / "points") == _files(clean / "points")
    assert (out / "runs.csv").read_bytes() == (clean / "runs.csv").read_bytes()
    page = (out / "index.html").read_text()
    for raw in ("<script", "<img src=x", "<svg"):  # as tags; their text may show, escaped
        assert raw not in page, raw
    assert "&lt;svg onload=alert(3)&gt;" in page  # the folder's name, shown as text
    # the run wrote into a hidden sibling: nothing it shows names that sibling
    for path in [out / "index.html", out / "record.yaml", *(out / "notebooks").glob("*.ipynb")]:
        assert ".kvpressure-partial" not in path.read_text(), path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["payload.yaml", out.name, "clean"])
