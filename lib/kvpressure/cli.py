"""The ``kvpressure`` command line.

Each subcommand lives in ``kvpressure.commands.<name>`` and is imported only when it runs, so
that a light command (``simulate``) does not pay for pandas, seaborn or Jupyter imports.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kvpressure.errors import InputError

# name -> one-line help; the module kvpressure.commands.<name> provides
# ``add_arguments(parser)`` and ``run(args) -> int``.
SUBCOMMANDS: dict[str, str] = {
    "capacity": "size the KV pool from a hardware and model profile, the way vLLM does",
    "simulate": "simulate vLLM's V1 scheduler on a step-level workload or an experiment",
    "sweep": "simulate an experiment at every concurrency level (and comparison variant)",
    "collect": "load a live vLLM server level by level, record its metrics, run the report",
    "scrape": "record a live server's /metrics into a scrape log during a load test",
    "ingest": "read Prometheus scrapes, the Prometheus HTTP API or vllm bench results",
    "knee": "locate the knee, peak and decline of a throughput-vs-concurrency curve",
    "report": "run the investigation notebooks and render the record and the report",
    "profiles": "list the built-in hardware, model and experiment profiles",
    "twin": "fit a simulated twin to a measured run folder, check it, predict remedies",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to add its arguments."""
    from kvpressure import __version__

    parser = argparse.ArgumentParser(
        prog="kvpressure",
        description="Investigate vLLM throughput knees caused by KV-cache pressure.",
    )
    parser.add_argument("--version", action="version", version=f"kvpressure {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            _module(name).add_arguments(p)
    return parser


def _module(name: str):
    return importlib.import_module(f"kvpressure.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(command).parse_args(argv)
    if command is None:
        build_parser().print_help()
        return 2
    try:
        code = int(_module(command).run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # The reader stopped early (``kvpressure capacity --json | head -1``): what it read is
        # complete, so no error. Point stdout at devnull so the exit's flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (InputError, FileNotFoundError) as exc:
        print(f"kvpressure {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
