"""``kvpressure tune EXPERIMENT|RUN_DIR --param NAME=VALUES ... | --grid FILE --limits
ttft_p95=2s,itl_p95=80ms [--executor local|processes[:N]|dask://HOST:PORT] --out DIR``: every
configuration of the grid simulated at every level, ranked by output throughput within the limits, with
the Pareto front, the recommendation and its runner-up, and the configurations vLLM would
refuse, each with its reason.

Results are streamed to ``DIR/results.jsonl`` while the run goes on: after a crash or Ctrl-C
the same command into the same folder runs only the configurations still missing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from kvpressure.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="EXPERIMENT|RUN_DIR",
                        help="experiment YAML (or a built-in experiment's name), or a measured "
                             "run folder (its twin is fitted first, as `kvpressure twin` does)")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--grid", type=Path, help="grid YAML (parameters: name: values; "
                                                  "optional limits)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUES",
                        help="one parameter's values: 16,32,64 (a list), 16..256 (doubling), "
                             "512..4096:512 (steps), true,false; repeatable")
    parser.add_argument("--limits", default=None,
                        help="latency limits, e.g. ttft_p95=2s,itl_p95=80ms (ttft and itl "
                             "mean, p50, p95, p99; e2e mean and p99; an experiment prices "
                             "ttft mean, p50, p95, itl mean, p95, p99 and e2e mean)")
    parser.add_argument("--executor", default="local",
                        help="local (this process), processes[:N] (local worker processes) or "
                             "dask://HOST:PORT (a Dask scheduler; pip install "
                             "'kvpressure[dask]')")
    parser.add_argument("--workers", type=int, help="worker processes for --executor processes "
                                                    "(default 2)")
    parser.add_argument("--batch", type=int, help="configurations per task (default: sized "
                                                  "from the grid and the workers)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="a run folder's engine setting the data lacks or gets wrong, as "
                             "`kvpressure twin --set` (e.g. max_num_seqs=64; repeatable)")
    parser.add_argument("--hardware", help="hardware profile for a run folder's twin: its "
                                           "roofline stands in for unidentifiable coefficients")
    parser.add_argument("--model", help="model profile (with --hardware)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (with --hardware)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing folder another command wrote")


def run(args: argparse.Namespace) -> int:
    from kvpressure.analysis.limits import parse_limits
    from kvpressure.folders.output_folder import check_replaceable, output_folder
    from kvpressure.sweeps.sweep import stderr_progress
    from kvpressure.tune.api import run_tune
    from kvpressure.tune.executors import parse_executor
    from kvpressure.tune.grid import load_grid_file, parse_param_options
    from kvpressure.tune.results import RESULTS
    from kvpressure.tune.targets import load_target

    if bool(args.grid) == bool(args.param):
        raise InputError("give the grid with --grid FILE or with --param NAME=VALUES (one of "
                         "the two)")
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers: must be >= 1, got {args.workers}")
    if args.batch is not None and args.batch < 1:
        raise InputError(f"--batch: must be >= 1, got {args.batch}")
    parse_executor(args.executor, args.workers)
    if args.grid:
        values, file_limits = load_grid_file(args.grid)
    else:
        values, file_limits = parse_param_options(args.param), None
    limits_text = args.limits if args.limits is not None else file_limits
    limits = parse_limits(limits_text, "--limits" if args.limits is not None else
                          f"{args.grid}: limits")
    check_replaceable(args.out, args.force, "tune", rerun_ok=True)
    from kvpressure.twin.settings import parse_set

    target = load_target(args.source, hardware=args.hardware, model=args.model, tp=args.tp,
                         overrides=parse_set(args.overrides))
    inputs = [p for p in (Path(args.source), args.grid) if p is not None and p.is_file()]
    with output_folder(args.out, "tune", inputs=inputs, force=args.force,
                       rerun_ok=True) as work:
        # A finished earlier run's results count too: its configurations are not rerun.
        earlier = args.out / RESULTS
        if earlier.is_file() and not (work / RESULTS).exists():
            shutil.copyfile(earlier, work / RESULTS)
        try:
            result = run_tune(target, work, parameters=values, limits=limits,
                              executor=args.executor, workers=args.workers, batch=args.batch,
                              progress=stderr_progress)
        except KeyboardInterrupt:
            kept = _count_lines(work / RESULTS)
            print(f"kvpressure tune: {kept} finished configuration(s) kept; the same command "
                  f"into {args.out} runs only the rest", file=sys.stderr)
            raise
    print(f"{result.configurations} configurations ({result.simulated} simulated, "
          f"{result.reused} reused, {len(result.invalid)} refused) in {result.wall_s:.1f} s on "
          f"{result.executor} -> {args.out}", file=sys.stderr)
    print(result.recommendation["text"])
    return 0


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0
