"""The ``kvpressure`` command line.

Each subcommand lives in ``kvpressure.commands.<name>`` and is imported only when it runs, so
that a light command (``simulate``) does not pay for pandas, seaborn or Jupyter imports.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kvpressure.errors import EXIT_BUG, EXIT_INPUT, EXIT_INTERRUPTED, InputError

# name -> one-line help; the module kvpressure.commands.<name> provides
# ``add_arguments(parser)`` and ``run(args) -> int``.
SUBCOMMANDS: dict[str, str] = {
    "capacity": "size the KV pool from a hardware and model profile, the way vLLM does",
    "simulate": "simulate vLLM's V1 scheduler on a step-level workload or an experiment",
    "sweep": "simulate an experiment at every concurrency level (and comparison variant)",
    "verify-vllm": "run workloads through another vLLM's own scheduler and diff every step "
                   "against the simulation",
    "collect": "load a live vLLM server level by level, record its metrics, run the report",
    "scrape": "record a live server's /metrics into a scrape log during a load test",
    "ingest": "read Prometheus scrapes, the Prometheus HTTP API, vllm bench results or vLLM "
              "server logs",
    "knee": "locate the knee, peak and decline of a throughput-vs-concurrency curve",
    "report": "run the investigation notebooks and render the record and the report",
    "analyse": "compute every stage and the record without Jupyter (no figures, no HTML)",
    "profiles": "list the built-in hardware, model and experiment profiles",
    "init": "write a project folder for JupyterLab: the notebooks, an experiment, a README",
    "twin": "fit a simulated twin to a measured run folder, check it, predict remedies",
    "verify-remedy": "measure a remedy against the baseline on the user's own server in paired "
                     "rounds, next to the twin's prediction",
    "tune": "search engine settings under latency limits (serially, on local processes or "
            "on a Dask cluster)",
    "compare": "two run folders side by side: the curves, the knee's shift with its noise, "
               "preemptions per level, what differs in settings and versions",
    "schema": "print the JSON Schema of an experiment or a record, or check files against it",
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
            # Read before parsing (cli_config.py); here for --help.
            p.add_argument("--config", metavar="FILE",
                           help="a YAML file of this command's options (option: value; the "
                                "command line's own win)")
    return parser


def _module(name: str):
    # A hyphenated command (verify-vllm) lives in a module with an underscore.
    return importlib.import_module(f"kvpressure.commands.{name.replace('-', '_')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    if command is not None:
        try:
            argv = _with_config(command, argv)
        except InputError as exc:
            print(f"kvpressure {command}: error: {exc}", file=sys.stderr)
            return EXIT_INPUT
    args = build_parser(command).parse_args(argv)
    if command is None:
        build_parser().print_help()
        return EXIT_INPUT
    previous_term = _sigterm_as_interrupt()
    try:
        code = int(_module(command).run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: workers were stopped on the way out, and an output folder is
        # swapped in only when complete, so what is on disk is the old run or nothing.
        print(f"kvpressure {command}: interrupted; nothing half-written was kept",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader stopped early (``kvpressure capacity --json | head -1``): what it read is
        # complete, so no error. Point stdout at devnull so the exit's flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (InputError, FileNotFoundError) as exc:
        print(f"kvpressure {command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except (OverflowError, RecursionError) as exc:
        # A number past a float's range or a structure nested past the stack, from an input
        # no reader caught earlier: the user's input, not a run of the kit; the traceback is
        # kept in case a reader should have named it.
        log = _write_crash_log(command, argv)
        what = "a number too large" if isinstance(exc, OverflowError) else "nesting too deep"
        print(f"kvpressure {command}: error: the input holds {what} to compute with "
              f"({exc}); check the files and options given (details in {log})",
              file=sys.stderr)
        return EXIT_INPUT
    except MemoryError:
        print(f"kvpressure {command}: error: out of memory; the input asks for more than this "
              "machine has (lower num_requests, num_gpu_blocks or the levels)", file=sys.stderr)
        return EXIT_INPUT
    except Exception:  # the kit's own bug: a short line on screen, the traceback in a file
        log = _write_crash_log(command, argv)
        print(f"kvpressure {command}: internal error (a bug in kvpressure, please report it "
              f"with the log): traceback written to {log}", file=sys.stderr)
        return EXIT_BUG
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_term)


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand (its options, as ``--config FILE`` maps onto them)."""
    parser = build_parser(command)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def _with_config(command: str, argv: list[str]) -> list[str]:
    """``argv`` with the options of its ``--config FILE`` (``cli_config.py``) in place."""
    from kvpressure.cli_config import config_argv, split_config

    rest, path = split_config(argv[1:])
    if path is None:
        return argv
    positional, options = config_argv(command_parser(command), path)
    return [command, *positional, *options, *rest]


def _sigterm_as_interrupt() -> Any:
    """SIGTERM stops a run the way Ctrl-C does (exit 130, workers ended, no half output)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None  # an in-process caller on another thread: leave signals alone
    return signal.signal(signal.SIGTERM, interrupt)


def _write_crash_log(command: str, argv: list[str]) -> str:
    import tempfile
    import time
    import traceback

    from kvpressure import __version__

    text = (f"kvpressure {__version__} {command}\nargv: {argv!r}\n"
            f"python: {sys.version.split()[0]}\n\n{traceback.format_exc()}")
    folder = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    for base in (folder / "kvpressure", Path(tempfile.gettempdir())):
        try:
            base.mkdir(parents=True, exist_ok=True)
            path = base / f"kvpressure-crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return str(path)
        except OSError:
            continue
    return "nowhere (no writable folder)"


if __name__ == "__main__":
    sys.exit(main())
