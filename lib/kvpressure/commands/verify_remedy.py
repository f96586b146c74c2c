"""``kvpressure verify-remedy RUN_DIR --serve-cmd "vllm serve MODEL ..." --set KEY=VALUE --out
DIR``: the twin's predicted change measured on the user's own server, in paired rounds.

Starts the baseline server from the command line given and the remedy server from the same
command with the settings changed, runs the measured run's load on both in rounds (the order
rotating), and writes the measured change per level with its interval next to the twin's
prediction (``live/verify_remedy.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
what it writes (--out): verify.json and verify.md (per level: the measured change in output
throughput with its 95% Student-t interval over the rounds, the twin's predicted change with its
interval, both arms' preemptions, TTFT and ITL, whether the prediction held), rounds/ (one
collect folder a run), servers/ (each server's log).

exit codes: 0 done; 5 a server did not start or a run did not complete (the finished runs are
kept); 130 Ctrl-C (the finished runs are kept: the same command continues them); 2 bad input
(a setting with no vLLM flag, a folder holding another verification, a busy port).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="the measured run: a `kvpressure collect` folder (its load is "
                        "replayed), or any folder `kvpressure twin` reads")
    parser.add_argument("--serve-cmd", required=True,
                        help="the command that starts the baseline server, as you run it, e.g. "
                        "\"vllm serve MODEL --max-num-seqs 64\" (--port is set here)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        required=True,
                        help="the remedy: an engine setting and its new value, e.g. "
                        "max_num_seqs=24 (repeatable: all change together)")
    parser.add_argument("--out", required=True, type=Path,
                        help="folder of the verification (a rerun into it continues)")
    parser.add_argument("--levels", type=int, nargs="+", metavar="C",
                        help="concurrencies to verify at (default: the twin's focus level)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="paired rounds (default 3; with --until-known, the first ones)")
    parser.add_argument("--mode", choices=("ports", "restart"), default="ports",
                        help="ports: both servers up at once, on --port and the next one "
                        "(default); restart: one at a time, restarted each round (one GPU)")
    parser.add_argument("--port", type=int, default=8100,
                        help="the baseline server's port (the remedy's is the next with "
                        "--mode ports; default 8100)")
    known = parser.add_argument_group("rounds until the change is known")
    known.add_argument("--until-known", action="store_true",
                       help="add rounds until the interval excludes 0 or is narrower than "
                       "--width at every level, up to --max-rounds")
    known.add_argument("--width", type=float, metavar="PCT",
                       help="stop when the 95%% interval is narrower than PCT points")
    known.add_argument("--max-rounds", type=int, metavar="N", help="the cap of --until-known")
    load = parser.add_argument_group("the load (default: the measured run's)")
    load.add_argument("--prompts-per-level", type=int,
                      help="requests a run (default: as measured; fewer make rounds shorter "
                      "and the twin's prediction is still for the measured count)")
    load.add_argument("--input-len", type=int, help="prompt tokens (a folder without levels.json)")
    load.add_argument("--output-len", type=int, help="output tokens (idem)")
    load.add_argument("--warmup", type=int, default=4,
                      help="requests to each server after its start, not measured (default 4)")
    load.add_argument("--cooldown", type=float, default=2.0, metavar="S",
                      help="rest before each run, after the engine is idle (default 2)")
    limits = parser.add_argument_group("safety limits")
    limits.add_argument("--ready-timeout", type=float, default=900.0, metavar="S",
                        help="a server not healthy after S seconds is stopped (default 900)")
    limits.add_argument("--level-timeout", type=float, default=600.0, metavar="S",
                        help="a run longer than S seconds is cut (default 600)")
    limits.add_argument("--request-timeout", type=float, default=300.0, metavar="S",
                        help="a request that receives nothing for S seconds fails (default 300)")
    parser.add_argument("--bootstrap", type=int, default=100,
                        help="bootstrap draws of the twin's fit (default 100)")


def run(args: argparse.Namespace) -> int:
    from kvpressure.live.verify_remedy import VerifyOptions, verify
    from kvpressure.twin.settings import parse_set

    opts = VerifyOptions(
        run_dir=args.run_dir, serve_cmd=args.serve_cmd, sets=parse_set(args.sets), out=args.out,
        levels=args.levels, rounds=args.rounds, mode=args.mode, port=args.port,
        until_known=args.until_known, width_pct=args.width, max_rounds=args.max_rounds,
        prompts_per_level=args.prompts_per_level, input_len=args.input_len,
        output_len=args.output_len, warmup=args.warmup, cooldown_s=args.cooldown,
        ready_timeout_s=args.ready_timeout, level_timeout_s=args.level_timeout,
        request_timeout_s=args.request_timeout, bootstrap=args.bootstrap)
    _, code = verify(opts, sys.stderr)
    print(args.out / "verify.md")
    return code
