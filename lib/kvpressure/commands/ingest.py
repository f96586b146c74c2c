"""``kvpressure ingest SOURCE... --out DIR``: real metrics into series.csv / runs.csv."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpressure.ingestion.engine_facts import EngineFacts
    from kvpressure.ingestion.ingest_options import IngestOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="Prometheus text dump, folder of dumps, JSONL scrape log, query_range JSON, "
        "Prometheus server URL (with --start/--end), /metrics URL, vllm bench JSON, or a vLLM "
        "server log (plain or gzip: its stats lines, V0 preemption warnings and start-up lines), "
        "or a sweep table of another tool (a CSV of runs, vllm bench sweep results, GuideLLM or "
        "AIPerf exports: see --columns)",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--run", help="run name for all sources (default: one per source)")
    parser.add_argument("--start", help="server range start: unix s, ISO 8601 or now-1h")
    parser.add_argument("--end", help="server range end: unix s, ISO 8601 or now")
    parser.add_argument(
        "--step",
        type=float,
        help="evaluate the server every STEP s (query_range); default: raw scraped samples",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout, s")
    parser.add_argument(
        "--metrics",
        default="all",
        help="all (default), core (the families the analysis reads), or comma-separated names",
    )
    parser.add_argument(
        "--counter-origin",
        choices=("auto", "zero", "first"),
        default="auto",
        help="zero: counters were 0 when the log began; first: count from the first sample",
    )
    parser.add_argument("--num-gpu-blocks", type=int, help="N, if vllm:cache_config_info lacks it")
    parser.add_argument("--block-size", type=int, help="B, if vllm:cache_config_info lacks it")
    parser.add_argument("--keep-created", action="store_true", help="keep _created samples")
    parser.add_argument(
        "--policy", choices=("fcfs", "priority"),
        help="the server's --scheduling-policy (sharpens the recomputed-token estimate)",
    )
    parser.add_argument(
        "--scheduler-reserve-full-isl", choices=("true", "false"),
        help="the server's admission rule (vLLM 0.33.0 default: true); unknown when left out",
    )
    parser.add_argument(
        "--columns", metavar="RUNS_COLUMN=COLUMN,...",
        help="how a plain CSV of runs maps onto the runs columns, e.g. "
        "concurrency=conc,output_throughput=tok_s (ttft_p95_s=ttft95:ms gives a unit; a column "
        "named *_ms is read as ms). Other tools' tables are recognised without it: vllm bench "
        "sweep summary.csv/summary.json, GuideLLM benchmarks.json/.yaml/.csv, AIPerf "
        "profile_export_aiperf.json/.csv",
    )
    parser.add_argument(
        "--bench-timezone",
        help="time zone of the machine that wrote the bench results' `date` (e.g. +08:00, UTC, "
        "Asia/Shanghai), to match them with scrape logs; default: this machine's",
    )
    parser.add_argument(
        "--log-year", type=int,
        help="year of a vLLM server log's first line (vLLM prints dates without the year); "
        "default: from the file's modification time",
    )
    parser.add_argument(
        "--log-timezone",
        help="time zone a vLLM server log's times were written in (e.g. +08:00, UTC); "
        "default: --bench-timezone, else this machine's",
    )
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")


def check_options(args: argparse.Namespace) -> None:
    """Each option's value, refused naming the option (before any source is read)."""
    import math

    from kvpressure.errors import InputError
    from kvpressure.ingestion.api import bench_tzinfo
    from kvpressure.ingestion.live_scrape import MAX_TIMEOUT_S
    from kvpressure.profiles.kvpool import KERNEL_BLOCK_MULTIPLE

    if not 0 < args.timeout <= MAX_TIMEOUT_S:  # nan fails too
        raise InputError(f"--timeout: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], "
                         f"got {args.timeout}")
    if args.step is not None and not 0 < args.step < math.inf:
        raise InputError(f"--step must be a positive number of seconds, got {args.step}")
    if args.num_gpu_blocks is not None and args.num_gpu_blocks < 1:
        raise InputError(f"--num-gpu-blocks: must be >= 1, got {args.num_gpu_blocks}")
    if args.block_size is not None and (args.block_size < 1
                                        or args.block_size % KERNEL_BLOCK_MULTIPLE):
        raise InputError(f"--block-size {args.block_size}: no block size vLLM 0.33.0's attention "
                         f"backends take (a multiple of {KERNEL_BLOCK_MULTIPLE}: 16, 32, 64...)")
    if args.log_year is not None and not 1970 <= args.log_year <= 9999:
        raise InputError(f"--log-year: a year from 1970 to 9999, got {args.log_year}")
    if args.run is not None and not args.run.strip():
        raise InputError("--run: give the run a name (or leave the option out)")
    for option, zone in (("--bench-timezone", args.bench_timezone),
                         ("--log-timezone", args.log_timezone)):
        try:
            bench_tzinfo(zone)
        except InputError as exc:
            raise InputError(f"{option}: {exc}") from None


def ingest_options(args: argparse.Namespace) -> IngestOptions:
    """How the sources are read, from the command line."""
    from kvpressure.ingestion.ingest_options import IngestOptions

    return IngestOptions(
        start=args.start,
        end=args.end,
        step=args.step,
        timeout=args.timeout,
        metrics=args.metrics,
        keep_created=args.keep_created,
        counter_origin=args.counter_origin,
        bench_timezone=args.bench_timezone,
        columns=args.columns,
        log_year=args.log_year,
        log_timezone=args.log_timezone,
    )


def engine_facts(args: argparse.Namespace) -> EngineFacts:
    """What the server ran with, from the command line (``--policy`` is vLLM's
    ``--scheduling-policy``)."""
    from kvpressure.ingestion.engine_facts import EngineFacts

    return EngineFacts(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        scheduling_policy=args.policy,
        scheduler_reserve_full_isl=(None if args.scheduler_reserve_full_isl is None
                                    else args.scheduler_reserve_full_isl == "true"),
    )


def run(args: argparse.Namespace) -> int:
    from kvpressure.folders.output_folder import check_replaceable, output_folder
    from kvpressure.ingestion.api import ingest

    out: Path = args.out
    check_options(args)
    check_replaceable(out, args.force, "ingest")
    result = ingest(args.sources, run=args.run, options=ingest_options(args),
                    engine=engine_facts(args))
    local = [s for s in args.sources if "://" not in s]
    with output_folder(out, "ingest", inputs=local, force=args.force) as work:
        written = result.write(work)
    summary = {
        "out": str(out),
        "files": [p.name for p in written],
        "series_rows": int(len(result.series)),
        "runs_rows": int(len(result.runs)),
        "runs": {
            name: {
                "generation": info.get("generation"),
                "metrics_missing": info.get("metrics_missing"),
            }
            for name, info in result.report.runs.items()
        },
        "warnings": len(result.report.warnings),
    }
    print(json.dumps(summary, indent=2))
    # What was left out or guessed (rows the knee cannot use, units read from names...) is
    # said where the user looks, not only in ingest.json.
    for note in result.report.warnings:
        print(f"kvpressure ingest: note: {note}", file=sys.stderr)
    return 0
