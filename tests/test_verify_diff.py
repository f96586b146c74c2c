"""The diff behind ``kvpressure verify-vllm``, on hand-made steps tables, and the command's
plumbing with a stand-in interpreter (the real vLLM run is in tests/e2e/)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from kvpressure.cli import main
from kvpressure.verify.diff import compare_runs, first_divergence

HEADER = "step,arrivals,num_running,num_scheduled_tokens,preemptions,kv_usage\n"
OURS = HEADER + ("0,3,2,64,0,0.444444\n"
                 "1,0,3,17,0,0.555556\n"
                 "2,0,3,3,0,0.666667\n"
                 "3,0,2,2,1,0.777778\n")


def test_identical_tables_have_no_divergence() -> None:
    assert first_divergence(OURS, OURS) is None


def test_first_differing_step_with_both_rows() -> None:
    # Step 2 differs in the token count, step 3 in the preemptions: only step 2 is reported.
    theirs = OURS.replace("2,0,3,3,0,", "2,0,3,2,0,").replace("3,0,2,2,1,", "3,0,2,2,0,")
    d = first_divergence(OURS, theirs)
    assert d is not None
    assert (d.index, d.key, d.columns) == (2, "step 2", ["num_scheduled_tokens"])
    assert d.ours["num_scheduled_tokens"] == "3" and d.theirs["num_scheduled_tokens"] == "2"
    text = d.describe("kit", "vllm")
    marked = [line for line in text.splitlines() if line.endswith("<<")]
    assert len(marked) == 1 and marked[0].split()[:3] == ["num_scheduled_tokens", "3", "2"]


def test_a_table_that_stops_early_diverges_where_it_stops() -> None:
    shorter = "".join(OURS.splitlines(keepends=True)[:3])  # header + steps 0 and 1
    d = first_divergence(OURS, shorter)
    assert d is not None and d.index == 2 and d.theirs is None and d.ours["step"] == "2"
    assert "vllm has no row 2" in d.describe("kit", "vllm")


def test_usage_rounding_in_the_last_digit_is_not_a_divergence() -> None:
    assert first_divergence(OURS, OURS.replace("0.555556", "0.555555")) is None
    assert first_divergence(OURS, OURS.replace("0.555556", "0.555558")) is not None


def test_extra_columns_on_one_side_are_ignored_and_requests_compared_by_id() -> None:
    timed = "".join(line.rstrip("\n") + (",time_s\n" if i == 0 else f",{i * 0.5}\n")
                    for i, line in enumerate(OURS.splitlines(keepends=True)))
    assert first_divergence(timed, OURS) is None
    reqs = "id,preemptions\nA,0\nB,1\n"
    c = compare_runs("w", OURS, OURS, reqs, reqs.replace("B,1", "B,2"))
    assert not c.matches and c.steps_ours == c.steps_theirs == 4
    assert [(d.table, d.key) for d in c.divergences] == [("requests.csv", "id B")]


# A stand-in for another environment's interpreter: it answers the job with the kit's own
# simulation (so tables agree) except for one workload, where it changes one cell. The test
# workloads have no prefix groups.
FAKE = '''
import json, sys
sys.path[:0] = {paths!r}
from kvpressure.simulation.engine import simulate
from kvpressure.simulation.scenario import load_scenario
job = json.load(open(sys.argv[-1]))
for w in job["workloads"]:
    sc = load_scenario({{"name": w["name"], "seed": w["seed"], "mode": {{"type": w["mode"],
        **({{"concurrency": w["concurrency"]}} if w["concurrency"] else {{}})}},
        "settings": w["settings"], "requests": [
            {{k: v for k, v in r.items() if k not in ("arrival_time_s", "prefix_group", "prefix_len")}}
            for r in w["requests"]], "prefix_groups": {{}}}})
    res = simulate(sc)
    steps = res.steps_csv()
    if w["name"] == "bent":
        lines = steps.splitlines(keepends=True)
        cells = lines[3].split(",")
        cells[9] = str(int(cells[9]) + 1)
        lines[3] = ",".join(cells)
        steps = "".join(lines)
    open(w["steps_csv"], "w").write(steps)
    open(w["requests_csv"], "w").write(res.requests_csv())
    print(json.dumps({{"name": w["name"], "ok": True, "steps": len(res.steps)}}))
print(json.dumps({{"vllm_version": "0.0.0-stand-in"}}))
'''


def _fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake_driver.py"
    script.write_text(FAKE.format(paths=[p for p in sys.path if p]))
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _workload(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.scenario.json"
    p.write_text(json.dumps({"name": name, "settings": {"num_gpu_blocks": 12},
                             "requests": [{"id": "a", "prompt_len": 40, "output_len": 5},
                                          {"id": "b", "prompt_len": 30, "output_len": 4}]}))
    return p


def test_command_exit_codes_and_report(tmp_path, capsys) -> None:
    exe = _fake_python(tmp_path)
    good, bent = _workload(tmp_path, "good"), _workload(tmp_path, "bent")
    assert main(["verify-vllm", str(good), "--vllm-python", str(exe)]) == 0
    assert "good: match" in capsys.readouterr().out
    assert main(["verify-vllm", str(good), str(bent), "--vllm-python", str(exe),
                 "--out", str(tmp_path / "out")]) == 4
    out = capsys.readouterr().out
    assert "good: match" in out and "bent: DIVERGES" in out
    assert "first divergence at step 2" in out and "1 of 2 workloads match" in out
    # Both sides' tables are kept for a closer look.
    assert (tmp_path / "out" / "bent.vllm.steps.csv").is_file()
    assert (tmp_path / "out" / "bent.kvpressure.steps.csv").is_file()


def test_bad_interpreter_is_refused_by_name(tmp_path, capsys) -> None:
    assert main(["verify-vllm", "--vllm-python", str(tmp_path / "nope")]) == 2
    assert "--vllm-python" in capsys.readouterr().err
