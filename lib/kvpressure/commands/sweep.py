"""``kvpressure sweep EXPERIMENT --out DIR``: simulate every concurrency level and variant."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from kvpressure.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="experiment YAML (or the name of a built-in one)")
    parser.add_argument("--out", required=True, help="output folder (points/ and runs.csv)")
    parser.add_argument("--variants", nargs="+", metavar="NAME",
                        help="run only these variants (baseline, max_num_seqs=32, ...)")
    parser.add_argument("--no-compare", action="store_true",
                        help="run the baseline only, not the comparison's variants")
    parser.add_argument("--remedies", action="store_true",
                        help="also run the experiment's remedies as variants")
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument("--concurrency", "--max-concurrency", nargs="+", type=float, metavar="C",
                        help="a closed-loop experiment's levels to run instead of its own (as "
                             "vllm bench serve --max-concurrency)")
    levels.add_argument("--request-rate", nargs="+", type=float, metavar="R",
                        help="an open-loop experiment's request rates to run instead of its "
                             "own (as vllm bench serve --request-rate; inf: all at once)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    from kvpressure.commands.simulate import add_load_arguments

    add_load_arguments(parser, replay=False)
    parser.add_argument("--force", action="store_true",
                        help="write into an existing non-empty output folder")


def run(args: argparse.Namespace) -> int:
    from kvpressure.folders.output_folder import check_replaceable, output_folder
    from kvpressure.simulation.experiment import load_experiment
    from kvpressure.sweeps.sweep import run_sweep, stderr_progress

    out = Path(args.out)
    check_replaceable(out, args.force, "sweep")
    if not 1 <= args.jobs <= 1024:  # a process each: more is a typo
        raise InputError(f"--jobs: must be between 1 and 1024, got {args.jobs}")
    from kvpressure.commands.simulate import apply_load_options

    exp, inputs = apply_load_options(load_experiment(args.experiment), args, replay=False)
    levels = None
    given, option = ((args.request_rate, "--request-rate") if args.request_rate
                     else (args.concurrency, "--concurrency"))
    if args.request_rate and exp.mode == "closed":
        raise InputError(f"--request-rate: {exp.name} is a closed loop; give its levels with "
                         "--concurrency (--max-concurrency)")
    if given:
        if exp.mode == "closed" and not all(math.isfinite(c) and c == int(c) and c >= 1
                                            for c in given):
            raise InputError(f"{option}: levels must be integers >= 1")
        # An open loop's levels are rates; --concurrency gives them too (its older spelling).
        if exp.mode == "open" and not all(c > 0 for c in given):
            raise InputError(f"{option}: request rates must be > 0 (inf: all at once)")
        levels = [int(c) for c in given] if exp.mode == "closed" else list(given)
    started = time.perf_counter()
    print(f"sweep {exp.name}: {exp.mode} loop, levels {levels or exp.levels}", file=sys.stderr)
    with output_folder(out, "sweep", inputs=[exp.path, *inputs], force=args.force) as work:
        runs = run_sweep(exp, work, variants=args.variants, concurrencies=levels,
                         progress=stderr_progress, jobs=args.jobs,
                         include_remedies=args.remedies, compare=not args.no_compare)
    from kvpressure.folders.run_folder import RunFolder

    print(f"{len(runs)} points in {time.perf_counter() - started:.1f} s -> "
          f"{RunFolder(out).runs_path}", file=sys.stderr)
    from kvpressure.analysis.levels import level_means

    level_col = "concurrency" if exp.mode == "closed" else "request_rate"
    curves = level_means(runs, ["output_throughput"], x=level_col)
    for variant, group in curves.groupby("variant", sort=False):
        curve = ", ".join(f"{lvl:g}: {tput:.0f}" for lvl, tput in
                          zip(group[level_col], group["output_throughput"], strict=True))
        seeds = f" (mean of {int(group['repeats'].max())} seeds)" if group["repeats"].max() > 1 else ""
        print(f"{variant}: output tok/s by {level_col}{seeds}: {curve}")
    return 0
