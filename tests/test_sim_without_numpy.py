"""A run on the step clock imports no numpy, and its bytes are those of the same run in a
process with numpy loaded: the steps table and the summary take numpy's copies and sums when
it is loaded, their own otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy  # noqa: F401 (loaded: this process takes numpy's path)
import pytest

from kvpressure.simulation.engine import simulate
from kvpressure.simulation.scenario import load_scenario

REFERENCE = Path(__file__).parent / "data" / "vllm-0.33-scheduler"

_CHILD = """
import hashlib, json, sys
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.scenario import load_scenario
res = simulate(load_scenario(sys.argv[1]), fast_path=sys.argv[2])
summary = {k: v for k, v in res.summary.items() if k != "timing"}
cols = {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in res.steps.columns.items()}
print(json.dumps({"numpy": "numpy" in sys.modules, "summary": summary, "columns": cols}))
"""


def _here(path: Path, fast_path: str) -> dict:
    res = simulate(load_scenario(path), fast_path=fast_path)
    summary = {k: v for k, v in res.summary.items() if k != "timing"}
    cols = {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in res.steps.columns.items()}
    return json.loads(json.dumps({"numpy": True, "summary": summary, "columns": cols}))


@pytest.mark.parametrize("name", ["heavy_closed_c64_fcfs", "light_open_prefix_groups"])
@pytest.mark.parametrize("fast_path", ["leap", "off"])
def test_a_step_clock_run_without_numpy_has_the_bytes_of_one_with_it(name, fast_path):
    path = REFERENCE / f"{name}.scenario.json"
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), fast_path],
                         capture_output=True, text=True, check=True, env=dict(os.environ))
    child = json.loads(out.stdout)
    assert child.pop("numpy") is False
    here = _here(path, fast_path)
    here.pop("numpy")
    assert len(here["columns"]) == len(child["columns"]) > 0
    assert child == here
