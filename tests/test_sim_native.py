"""The compiled exact step (``simulation/native.py``, ``make native``): used only when built from
the sources as they are, and deciding exactly as they do (the same bytes of every output).

The rest of the suite runs on the sources (``tests/conftest.py`` sets ``KVPRESSURE_NATIVE=0``);
here the same runs go through the compiled set in a child process."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpressure.simulation import native

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
REFERENCE = TESTS / "data" / "vllm-0.33-scheduler"


# -- the guard --------------------------------------------------------------------------------
def _fake_build(root: Path, stamp: dict) -> None:
    (root / "kvpressure" / "simulation").mkdir(parents=True)
    (root / native.STAMP).write_text(json.dumps(stamp))


def test_a_build_of_these_sources_goes_first(tmp_path, monkeypatch):
    _fake_build(tmp_path, native.expected_stamp())
    monkeypatch.setenv("KVPRESSURE_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("KVPRESSURE_NATIVE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = ["/src"]
    assert native.enable(path)
    assert path == [str(tmp_path / "kvpressure" / "simulation"), "/src"]
    assert sys.path[-1] == str(tmp_path)


@pytest.mark.parametrize("change", ["source", "interpreter", "missing", "garbled", "off"])
def test_anything_but_a_build_of_these_sources_is_left_alone(tmp_path, monkeypatch, change):
    stamp = native.expected_stamp()
    if change == "source":
        # One module edited since the build: its digest no longer matches.
        stamp["sources"]["scheduler"] = hashlib.sha256(b"an older scheduler").hexdigest()
    elif change == "interpreter":
        stamp["cache_tag"] = "cpython-27"
    if change == "garbled":
        (tmp_path / "kvpressure" / "simulation").mkdir(parents=True)
        (tmp_path / native.STAMP).write_text("{not json")
    elif change != "missing":
        _fake_build(tmp_path, stamp)
    monkeypatch.setenv("KVPRESSURE_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("KVPRESSURE_NATIVE", "0" if change == "off" else "1")
    path = ["/src"]
    assert not native.enable(path)
    assert path == ["/src"]


def test_the_stamp_covers_every_compiled_module_and_what_it_imports():
    digests = native.expected_stamp()["sources"]
    assert sorted(digests) == sorted(native.STAMPED)
    for name in native.STAMPED:
        assert digests[name] == hashlib.sha256(
            (native.SOURCE_DIR / f"{name}.py").read_bytes()).hexdigest()
    # A module of the package that compiled code imports is read by its declared types: an
    # edit to it must make the set stale as well.
    imported = set()
    for name in native.COMPILED:
        tree = ast.parse((native.SOURCE_DIR / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.startswith("kvpressure.simulation."):
                imported.add(node.module.rsplit(".", 1)[1])
    assert set(native.COMPILED) <= set(native.STAMPED)
    assert imported <= set(native.STAMPED), imported - set(native.STAMPED)


# -- the compiled set against the sources ------------------------------------------------------
# Run in a child: every workload on every fast path, with the Prometheus view on the step clock
# and with a cost model; one digest of every output file per run.
_RUNS = r"""
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from kvpressure.simulation import native
from kvpressure.simulation.engine import FAST_PATHS, simulate
from kvpressure.simulation.prom_view import PromRecorder
from kvpressure.simulation.scenario import load_scenario
from sim_helpers import LinearCost

out = {"native": None}
for d in json.load(open(sys.argv[2])):
    sc = load_scenario(d)
    for fp in FAST_PATHS:
        rec = PromRecorder.for_step_clock(sc, scrape_every_steps=7)
        res = simulate(sc, recorder=rec, fast_path=fp)
        rec.finish()
        timed = simulate(sc, cost_model=LinearCost(), fast_path=fp)
        h = hashlib.sha256()
        for part in (res.steps_csv(), res.requests_csv(), rec.to_jsonl(), timed.steps_csv(),
                     timed.requests_csv(),
                     json.dumps({k: v for k, v in res.summary.items() if k != "timing"},
                                sort_keys=True),
                     json.dumps({k: v for k, v in timed.summary.items() if k != "timing"},
                                sort_keys=True)):
            h.update(part.encode())
        out[f"{d['name']}/{fp}"] = h.hexdigest()
out["native"] = native.active()
print(json.dumps(out))
"""


def _workloads() -> list[dict]:
    spec = importlib.util.spec_from_file_location("bench_kinds",
                                                  ROOT / "benchmarks" / "bench_kinds.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = [json.loads((REFERENCE / f"{n}.scenario.json").read_text())
           for n in ("light_open_prefix_groups", "heavy_closed_c64_fcfs")]
    # Every kind of workload the benchmark covers, one seed each.
    out += [bench.scenario_dict(kind, 7) for kind in bench._kinds()]
    return out


def _digests(tmp_path: Path, native_on: bool) -> dict:
    job = tmp_path / "workloads.json"
    if not job.exists():
        job.write_text(json.dumps(_workloads()))
    env = {**os.environ, "KVPRESSURE_NATIVE": "1" if native_on else "0"}
    proc = subprocess.run([sys.executable, "-c", _RUNS, str(TESTS), str(job)], env=env,
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_compiled_set_gives_the_bytes_of_the_sources(tmp_path):
    built = native.native_dir() / native.STAMP
    if not built.is_file() or json.loads(built.read_text()) != native.expected_stamp():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no compiled simulation built from these sources at {built.parent} "
                        "(make native builds it)")
        pytest.skip("no compiled simulation built from these sources (make native)")
    compiled = _digests(tmp_path, True)
    sources = _digests(tmp_path, False)
    assert compiled.pop("native") is True
    assert sources.pop("native") is False
    assert len(compiled) == 3 * (2 + 15)
    assert compiled == sources
