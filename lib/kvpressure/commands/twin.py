"""``kvpressure twin RUN_DIR --out DIR [--limits ttft_p95=2s,itl_p95=80ms]``: the twin of a
measured server (settings and workload from the data, step time fitted with bootstrap
intervals), measured vs twin level by level with a verdict, then the remedies predicted on the
fitted twin and the setting to recommend under the latency limits. The levels are the closed
loops' concurrencies, or the request rates of open loops (``vllm bench serve --request-rate R``
without ``--max-concurrency``), whose twin needs the server's iteration-details log.

Writes ``twin.json``, ``fit_table.csv``, ``twin.png`` and ``twin.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from kvpressure.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="an ingested run folder: runs.csv (+ series.csv, ingest.json), as "
                             "written by ingest, report --source, collect or sweep")
    parser.add_argument("--out", required=True, type=Path, help="output folder of the twin")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier run of another command in --out")
    parser.add_argument("--limits", default="",
                        help="latency limits of the recommendation, e.g. "
                             "ttft_p95=2s,itl_p95=80ms (ttft and itl mean, p50, p95, p99; "
                             "e2e mean and p99)")
    parser.add_argument("--focus", type=float,
                        help="level to recommend for: a concurrency, or a request rate for "
                             "open loops (default: the report's focus, the first level past the "
                             "record's knee; the highest rate of an open loop)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="an engine setting the data lacks or gets wrong, e.g. "
                             "num_gpu_blocks=512 or max_num_seqs=64 (repeatable)")
    parser.add_argument("--variant", help="which variant of runs.csv to build the twin on "
                                          "(default: baseline, else the first)")
    parser.add_argument("--hardware", help="hardware profile: its roofline stands in for "
                                           "coefficients the data cannot identify")
    parser.add_argument("--model", help="model profile (with --hardware)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (with --hardware)")
    parser.add_argument("--bootstrap", type=int, default=200,
                        help="bootstrap draws over levels for the intervals (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    parser.add_argument("--no-remedies", action="store_true",
                        help="fit and check the twin only")
    parser.add_argument("--server-log", type=Path,
                        help="the server's log, started with --enable-logging-iteration-details: "
                        "the step time is fitted on its steps (default: RUN_DIR/server.log when "
                        "it has them)")
    parser.add_argument("--return-steps", type=int, metavar="R",
                        help="engine steps a client takes to send its next request after a "
                             "finish, at every level (docs/scheduler.md#loop-closed-return; "
                             "default: estimated from the server's step trace, else from the "
                             "client turnaround over the fitted step time)")


def run(args: argparse.Namespace) -> int:
    from kvpressure.analysis.limits import parse_limits
    from kvpressure.twin.output import make_twin_folder
    from kvpressure.twin.settings import parse_set

    limits = parse_limits(args.limits)
    if args.return_steps is not None and args.return_steps < 0:
        raise InputError(f"--return-steps must be >= 0, got {args.return_steps}")
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    if args.focus is not None and not 0 < args.focus < math.inf:
        raise InputError(f"--focus: must be a concurrency or request rate > 0, got {args.focus}")
    if args.tp < 1:
        raise InputError(f"--tp: must be >= 1, got {args.tp}")
    from kvpressure.folders.output_folder import check_replaceable, output_folder

    # The twin's folder is the kit's like any other --out: a user's twin.md is never replaced.
    check_replaceable(args.out, args.force, "twin", rerun_ok=True)
    cost_model = None
    if args.hardware or args.model:
        if not (args.hardware and args.model):
            raise InputError("--hardware and --model go together (the roofline needs both)")
        from kvpressure.profiles.hardware import load_hardware
        from kvpressure.profiles.model import load_model
        from kvpressure.simulation.cost_model import StepCostModel

        cost_model = StepCostModel.from_profiles(load_hardware(args.hardware),
                                                 load_model(args.model), args.tp)
    from kvpressure.folders.run_folder import RunFolder

    inputs = [p for p in (RunFolder(args.run_dir).runs_path, args.server_log) if p is not None]
    with output_folder(args.out, "twin", inputs=inputs, force=args.force, rerun_ok=True) as work:
        summary = make_twin_folder(args.run_dir, work, limits=limits, focus=args.focus,
                                   overrides=parse_set(args.overrides), cost_model=cost_model,
                                   variant=args.variant, bootstrap=args.bootstrap,
                                   seed=args.seed, remedies=not args.no_remedies,
                                   server_log=args.server_log, return_steps=args.return_steps)
    summary["out"] = str(args.out)
    print(json.dumps(summary, indent=2, default=str))
    return 0
