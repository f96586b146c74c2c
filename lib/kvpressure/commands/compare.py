"""``kvpressure compare RUN_A RUN_B [--out DIR]``: two run folders side by side (before and
after a change, two servers, two versions): the curves overlaid, the knee's shift with its
noise, throughput and preemptions per level, what differs in engine settings and versions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", type=Path,
                        help="the first run folder (report, sweep, ingest or collect), the "
                             "reference")
    parser.add_argument("run_b", metavar="RUN_B", type=Path, help="the second run folder")
    parser.add_argument("--out", type=Path, help="write compare.md, compare.json and "
                                                  "compare.png here")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier compare in --out")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from kvpressure.analysis.two_runs import compare_run_folders
    from kvpressure.folders.run_view import read_run_view, tables_folder
    from kvpressure.report.sentences import two_runs_markdown

    if args.out is not None:
        from kvpressure.folders.output_folder import check_replaceable

        check_replaceable(args.out, args.force, "compare")
    result = compare_run_folders(read_run_view(args.run_a, "A"), read_run_view(args.run_b, "B"))
    doc = result.to_dict()
    text = two_runs_markdown(doc)
    if args.out is not None:
        from kvpressure.folders.output_folder import output_folder
        from kvpressure.report.figures import two_runs_figure

        inputs = [tables_folder(p).runs_path for p in (args.run_a, args.run_b)]
        with output_folder(args.out, "compare", inputs=inputs, force=args.force) as work:
            (work / "compare.json").write_text(json.dumps(doc, indent=1) + "\n")
            (work / "compare.md").write_text(text)
            fig = two_runs_figure(doc)
            fig.savefig(work / "compare.png", dpi=110, bbox_inches="tight")
    sys.stdout.write(json.dumps(doc, indent=1) + "\n" if args.json else text)
    return 0
