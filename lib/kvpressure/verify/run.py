"""Drive another vLLM's scheduler on step-level workloads and compare it with the simulation.

The other vLLM runs in its own interpreter (``--vllm-python``), as an isolated subprocess
executing ``vllm_driver.py``: the kit never imports vLLM, and vLLM never imports the kit. Both
sides get the same resolved settings (defaults filled by the kit's scenario loader) and the
same requests, and both write ``steps.csv`` / ``requests.csv`` in the reference format.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.simulation.scenario import Scenario, load_scenario
from kvpressure.verify.diff import Comparison, compare_runs

DRIVER = Path(__file__).with_name("vllm_driver.py")


def shipped_workloads() -> list[Path]:
    """The workloads shipped with the kit (``data/verify/``), sorted by name."""
    return sorted((data_dir() / "verify").glob("*.scenario.json"))


def _job_entry(sc: Scenario, out: Path) -> dict:
    return {
        "name": sc.name,
        "seed": sc.seed,
        "mode": sc.mode,
        "concurrency": sc.concurrency,
        "return_steps": sc.return_steps,
        "first_alone": sc.first_alone,
        "settings": sc.settings.to_dict(),
        "requests": [asdict(r) for r in sc.requests],
        "steps_csv": str(out / f"{sc.name}.vllm.steps.csv"),
        "requests_csv": str(out / f"{sc.name}.vllm.requests.csv"),
    }


def check_vllm_python(path: str) -> str:
    """The interpreter named by ``--vllm-python``, refused by name when it is not one."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"--vllm-python {path}: no such file")
    if p.is_dir():
        # A venv folder is a common slip: its interpreter is where it usually is.
        cand = p / "bin" / "python"
        if cand.exists():
            return str(cand)
        raise InputError(f"--vllm-python {path}: a folder, not a Python interpreter")
    if not os.access(p, os.X_OK):
        raise InputError(f"--vllm-python {path}: not executable")
    return str(p)


def run_vllm(python: str, scenarios: list[Scenario], out: Path,
             timeout_s: float = 600.0) -> tuple[dict[str, dict], str]:
    """Run every workload through the other vLLM in one subprocess. Returns the per-workload
    status lines by name and the vLLM version the subprocess reported."""
    out.mkdir(parents=True, exist_ok=True)
    job = {"workloads": [_job_entry(sc, out) for sc in scenarios]}
    job_path = out / "job.json"
    job_path.write_text(json.dumps(job, indent=1) + "\n")
    env = dict(os.environ)
    # The other interpreter must not see the kit's packages or settings.
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        proc = subprocess.run([python, "-I", str(DRIVER), str(job_path)], capture_output=True,
                              text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"--vllm-python {python}: the vLLM scheduler did not finish within "
                         f"{timeout_s:.0f} s") from None
    except OSError as exc:
        raise InputError(f"--vllm-python {python}: cannot run it: {exc}") from None
    (out / "vllm.stderr.txt").write_text(proc.stderr)
    status: dict[str, dict] = {}
    version = ""
    for line in proc.stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "vllm_version" in obj:
            version = str(obj["vllm_version"])
        elif "name" in obj:
            status[str(obj["name"])] = obj
    if proc.returncode != 0 and not status:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise InputError(f"--vllm-python {python}: the driver failed (exit "
                         f"{proc.returncode}); is vLLM installed there?\n{tail}")
    return status, version


def verify(paths: list[Path], python: str, out: Path,
           timeout_s: float = 600.0) -> tuple[list[Comparison], str, dict[str, float]]:
    """Simulate each workload, drive vLLM on the same, compare step by step.

    Returns the comparisons in input order, the vLLM version, and wall times (seconds) of the
    vLLM subprocess and of the simulations."""
    from kvpressure.simulation.engine import simulate

    scenarios = [load_scenario(p) for p in paths]
    names = [sc.name for sc in scenarios]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"two workloads share the name {sorted(dup)[0]!r}; names key the "
                         "output files")
    for sc in scenarios:
        if sc.requests and any(r.arrival_time_s is not None for r in sc.requests):
            raise InputError(f"{sc.source}: arrival_time_s needs a cost model; the scheduler "
                             "comparison is step-level (use arrival_step)")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    status, version = run_vllm(python, scenarios, out, timeout_s)
    t_vllm = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = []
    for sc in scenarios:
        res = simulate(sc)
        ours_steps, ours_requests = res.steps_csv(), res.requests_csv()
        (out / f"{sc.name}.kvpressure.steps.csv").write_text(ours_steps)
        (out / f"{sc.name}.kvpressure.requests.csv").write_text(ours_requests)
        st = status.get(sc.name)
        if st is None or not st.get("ok"):
            err = (st or {}).get("error") or "no result from the vLLM driver"
            results.append(Comparison(sc.name, steps_ours=len(res.steps), error=err))
            continue
        theirs_steps = Path(out / f"{sc.name}.vllm.steps.csv").read_text()
        theirs_requests = Path(out / f"{sc.name}.vllm.requests.csv").read_text()
        results.append(compare_runs(sc.name, ours_steps, theirs_steps, ours_requests,
                                    theirs_requests))
    t_sim = time.perf_counter() - t0
    return results, version, {"vllm_s": t_vllm, "simulation_s": t_sim}
