"""``kvpressure verify-vllm`` against the scheduler classes of the vLLM the e2e environment
installs (PyPI's CPU build, 0.32.0; ``scripts/vllm-env.sh``), on the shipped workloads.

The kit models vLLM 0.33.0. Reading both releases' ``v1/core/sched/scheduler.py``, the only
difference inside the simulation's scope is what follows a self-preemption under the PRIORITY
policy: 0.33.0 goes on with the next running request, 0.32.0 ends the running pass (it has no
``continue`` after a self-preempted request). So every shipped workload matches 0.32.0 step
for step except the one built to show that rule (docs/scheduler.md, example 2a): at step 2, Y
preempts itself; 0.33.0 (and the kit) then serve Z its token, 0.32.0 does not. The PRIORITY
workloads under pressure match because no self-preemption there is followed by a running
request that could still be served.
"""

from __future__ import annotations

import json
import time

import pytest
from vllm_server import vllm_python

from kvpressure.cli import main
from kvpressure.verify.run import shipped_workloads

pytestmark = pytest.mark.e2e

# Workload -> (first divergent step, {column: (kit, vLLM 0.32.0)}).
DIVERGES_ON_0_32 = {
    "example2a_priority_self_preemption": (
        2, {"num_scheduled_reqs": ("2", "1"), "num_scheduled_tokens": ("2", "1"),
            "num_decode_tokens": ("2", "1")}),
}


def test_shipped_workloads_against_vllm_0_32(tmp_path, capsys) -> None:
    names = {p.name.removesuffix(".scenario.json") for p in shipped_workloads()}
    assert set(DIVERGES_ON_0_32) <= names and len(names) >= 10
    t0 = time.perf_counter()
    code = main(["verify-vllm", "--vllm-python", str(vllm_python()), "--out",
                 str(tmp_path), "--json"])
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    by_name = {x["workload"]: x for x in lines}
    assert set(by_name) == names
    assert {x["vllm_version"] for x in lines} == {"0.32.0"}
    for name, x in sorted(by_name.items()):
        assert x["error"] is None, (name, x["error"])
        if name not in DIVERGES_ON_0_32:
            assert x["matches"], (name, x["first_divergence"])
            # Both sides wrote every step: a match is not two empty tables.
            assert x["steps_vllm"] == x["steps_kvpressure"] > 0
            continue
        step, cells = DIVERGES_ON_0_32[name]
        d = x["first_divergence"]
        assert not x["matches"] and d["table"] == "steps.csv" and d["at"] == f"step {step}"
        for column, (ours, theirs) in cells.items():
            assert (d["kvpressure"][column], d["vllm"][column]) == (ours, theirs), column
        assert d["kvpressure"]["preemptions"] == d["vllm"]["preemptions"] == "1"
    assert code == 4  # one workload diverges
    with capsys.disabled():
        print(f"\nverify-vllm: {len(names) - len(DIVERGES_ON_0_32)} of {len(names)} shipped "
              f"workloads match vLLM 0.32.0 step for step; wall {wall:.1f} s")
