"""``kvpressure verify-vllm [SCENARIO...] --vllm-python PATH``: the scheduler model against the
scheduler classes of a vLLM installed in another environment, step by step.

Exit 0 when every workload matches, 4 when one diverges (or the vLLM side failed on it), 2
on bad input (a missing interpreter, a workload the loader refuses); 1 stays a bug in the kit.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from kvpressure.errors import EXIT_DIVERGES as DIVERGES
from kvpressure.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (f"Exit code {DIVERGES} when a workload's steps differ from vLLM's (or the "
                     "vLLM side failed on it); 2 on bad input.")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help="step-level workload JSON files (default: the shipped set in "
                             "data/verify/)")
    parser.add_argument("--vllm-python", required=True, metavar="PATH",
                        help="the Python interpreter (or venv folder) of the vLLM to check "
                             "against; it is run as a separate process")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="keep both sides' steps.csv/requests.csv here (default: a "
                             "temporary folder, removed afterwards)")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier verify-vllm run in --out")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="give up on the vLLM process after this long (default 600)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per workload on stdout instead of text")


def run(args: argparse.Namespace) -> int:
    from kvpressure.verify.run import check_vllm_python, shipped_workloads, verify

    python = check_vllm_python(args.vllm_python)
    paths = [Path(p) for p in args.scenarios] or shipped_workloads()
    if not paths:
        raise InputError("no workloads given and none shipped in data/verify/")
    for p in paths:
        if p.is_dir():
            raise InputError(f"{p}: a folder; give the .scenario.json files in it")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout}: must be > 0")
    if args.out:
        from kvpressure.folders.output_folder import output_folder

        # The kit's own folder: swapped in whole when the run completes, never a mix of runs.
        with output_folder(Path(args.out), "verify-vllm", inputs=paths, force=args.force,
                           rerun_ok=True) as work:
            results, version, times = verify(paths, python, work, args.timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="kvpressure-verify-") as tmp:
            results, version, times = verify(paths, python, Path(tmp), args.timeout)
    if args.json:
        for r in results:
            d = r.divergences[0] if r.divergences else None
            print(json.dumps({
                "workload": r.name, "vllm_version": version, "matches": r.matches,
                "steps_kvpressure": r.steps_ours, "steps_vllm": r.steps_theirs,
                "error": r.error,
                "first_divergence": None if d is None else {
                    "table": d.table, "at": d.key, "columns": d.columns,
                    "kvpressure": d.ours, "vllm": d.theirs},
            }))
    else:
        print(f"vLLM {version or '(unknown version)'} at {python}")
        for r in results:
            if r.error:
                print(f"{r.name}: ERROR on the vLLM side: {r.error}")
            elif r.matches:
                print(f"{r.name}: match ({r.steps_ours} steps)")
            else:
                print(f"{r.name}: DIVERGES ({r.steps_ours} steps simulated, "
                      f"{r.steps_theirs} in vLLM)")
                print(r.divergences[0].describe("kvpressure", f"vllm {version}".strip()))
        n_ok = sum(r.matches for r in results)
        print(f"{n_ok} of {len(results)} workloads match step for step "
              f"(vLLM process {times['vllm_s']:.1f} s, simulation {times['simulation_s']:.1f} s)")
        if args.out:
            print(f"tables in {args.out}")
    return 0 if all(r.matches for r in results) else DIVERGES
