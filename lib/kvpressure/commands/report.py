"""``kvpressure report``: run the investigation notebooks, write the record and the report."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--experiment", metavar="FILE",
                      help="experiment YAML to simulate (or the name of a built-in one)")
    what.add_argument(
        "--source", metavar="PATH", nargs="+", action="extend",
        help="ingested data: Prometheus scrapes (file, folder, JSONL), API JSON, bench JSON, "
        "vLLM server logs, sweep tables (a CSV of runs, with --param columns=concurrency=COL,"
        "output_throughput=COL when its columns have other names; vllm bench sweep "
        "summary.csv/summary.json; GuideLLM benchmarks.json/.yaml/.csv; AIPerf "
        "profile_export_aiperf.json/.csv)",
    )
    parser.add_argument("--out", metavar="DIR", required=True, help="run folder (reports/NAME)")
    parser.add_argument(
        "--param", metavar="NAME=VALUE", action="append", default=[],
        help="notebook parameter, e.g. --param focus_concurrency=48 (repeatable)",
    )
    parser.add_argument(
        "--goodput", metavar="KEY:MS", nargs="+",
        help="goodput's per-request limits as vllm bench serve takes them, in ms: ttft, tpot, "
             "e2el (e.g. --goodput ttft:500 tpot:50; a key not given limits nothing; default: "
             "TTFT 10 s and TPOT 100 ms)",
    )
    parser.add_argument(
        "--limits", metavar="NAME=VALUE,...",
        help="latency limits of the recommendation, as kvpressure twin and tune take them "
             "(e.g. ttft_p95=2s,itl_p95=80ms; default: TTFT and ITL p95 within 10%% of now)",
    )
    parser.add_argument(
        "--jobs", type=int, default=2,
        help="notebooks (and sweep points) run side by side (default 2)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into an existing folder that is not a run folder"
    )
    parser.add_argument(
        "--screenshot", metavar="PNG", help="also draw index.html in headless Chromium to PNG"
    )


def run(args: argparse.Namespace) -> int:
    from kvpressure.extras import require

    require("report", "kvpressure report")
    from kvpressure.investigation.report import make_report
    from kvpressure.notebooks.batch import NOTEBOOKS, NotebookFailed, TerminalProgress

    # A bar in a terminal; plain lines in a log or a pipe.
    bar = TerminalProgress(len(NOTEBOOKS) + 1) if sys.stderr.isatty() else None
    # the bar takes both the stage names and the notebooks' own output
    shown: dict[str, Any] = {"progress": bar, "stream": bar} if bar else {}
    try:
        result = make_report(
            args.out,
            experiment=args.experiment,
            sources=args.source or (),
            params=_params(args),
            jobs=args.jobs,
            force=args.force,
            **shown,
        )
    except NotebookFailed as exc:
        if exc.ename == "InputError":
            # The data was refused (a notebook read it first): the user's error, not the kit's.
            print(f"kvpressure report: error: {exc.evalue}\n  executed notebook kept at "
                  f"{exc.executed_path}", file=sys.stderr)
            return 2
        print(f"kvpressure report: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if bar:
            bar.close()
    if args.screenshot:
        from kvpressure.report.screenshot import check_screenshot, take_screenshot

        png = take_screenshot(result.index_path, args.screenshot)
        problems = check_screenshot(png).problems()
        if problems:
            print(f"kvpressure report: screenshot {png}: {'; '.join(problems)}", file=sys.stderr)
            return 1
    from kvpressure.investigation.verdict import closing_lines

    for line in closing_lines(result.run_dir):
        print(line)
    print(result.index_path)
    return 0


def _params(args: argparse.Namespace) -> dict:
    """The notebooks' parameters: --param, then --goodput and --limits in their own words."""
    from kvpressure.analysis.limits import parse_goodput, parse_limits
    from kvpressure.errors import InputError
    from kvpressure.investigation.report import parse_params

    params = parse_params(args.param)
    for option, names in (("--goodput", ("ttft_limit_s", "tpot_limit_s", "e2el_limit_s")),
                          ("--limits", ("limits",))):
        if getattr(args, option[2:]) is not None and (given := set(names) & set(params)):
            raise InputError(f"{option} and --param {', '.join(sorted(given))}: give one")
    if args.goodput is not None:
        params.update(parse_goodput(args.goodput))
    if args.limits is not None:
        parse_limits(args.limits)  # refused here, before any notebook runs
        params["limits"] = args.limits
    return params
