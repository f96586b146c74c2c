"""``kvpressure analyse``: every stage and the record, without Jupyter (no figures, no HTML)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="run folder; re-analysed from its stage 01 when no input is given")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--experiment", metavar="FILE",
                      help="experiment YAML to simulate first (or a built-in name)")
    what.add_argument("--source", metavar="PATH", nargs="+", action="extend",
                      help="ingested data to collect first (the sources `report` takes)")
    parser.add_argument(
        "--param", metavar="NAME=VALUE", action="append", default=[],
        help="focus_concurrency, engine_args, model_name, bench_timezone, columns, log_year, "
             "log_timezone (as for `report`)")
    parser.add_argument("--remedies", action="store_true",
                        help="simulate the remedies of a KV-bound experiment (slower)")


def run(args: argparse.Namespace) -> int:
    from kvpressure.errors import InputError
    from kvpressure.investigation.analyse import analyse
    from kvpressure.investigation.report import experiment_file, parse_params
    from kvpressure.record.io import load_record

    params = parse_params(args.param)
    known = {"focus_concurrency", "focus_request_rate", "engine_args", "model_name", "bench_timezone", "columns",
             "log_year", "log_timezone"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise InputError(f"--param {unknown[0]}: not a parameter of analyse; known: "
                         f"{', '.join(sorted(known))}")
    experiment = str(experiment_file(args.experiment)) if args.experiment else ""
    path = analyse(args.run_dir, experiment, args.source or "",
                   simulate_remedies=args.remedies, **params)
    record = load_record(path)
    print(f"{record.status}: {record.evidence.reasons[0]}")
    print(path)
    return 0
