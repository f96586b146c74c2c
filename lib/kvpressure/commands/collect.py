"""``kvpressure collect URL --levels 4,8,16,32 --out reports/NAME``: the live investigation.

Drives a closed-loop load at each concurrency level against a running vLLM server, records its
``/metrics`` the whole time, and runs the report on what was measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
what it writes (--out): engine.json (model, KV pool, engine arguments and where each came from),
levels.json (each level's window, status and figures; warm-up and cool-downs), metrics.prom.jsonl
(the scrape log), bench/c<C>.json (one `vllm bench serve` result per level), prometheus/ (with
--prometheus) and report/ (index.html, record.yaml).

exit codes: 0 every level ran (a stop on --max-ttft included) and the report is written;
3 a level did not complete (server gone, most requests failed, level timeout): the report covers
the levels before it; 130 Ctrl-C (completed levels and the scrape log are kept, the report runs on
them); 2 bad input, or a URL where no vLLM server answers.
"""


def _levels(text: str) -> list[int]:
    from kvpressure.errors import InputError

    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--levels {text!r}: give concurrencies like 4,8,16,32") from None
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("url", help="the vLLM server, e.g. http://host:8000 (OpenAI-compatible "
                        "API and /metrics on the same port)")
    parser.add_argument("--levels", required=True, type=str,
                        help="client concurrencies to run, in order, e.g. 4,8,16,32")
    parser.add_argument("--out", required=True, type=Path,
                        help="run folder to create (reports/NAME); must be new or empty")
    load = parser.add_argument_group("the load at each level")
    load.add_argument("--input-len", type=int, default=512, help="prompt tokens (default 512)")
    load.add_argument("--output-len", type=int, default=256,
                      help="output tokens, exact: ignore_eos (default 256)")
    load.add_argument("--range-ratio", type=float, default=0.0,
                      help="lengths uniform in len*(1 +- r), as vllm bench's "
                      "--random-range-ratio (default 0: fixed)")
    size = load.add_mutually_exclusive_group()
    size.add_argument("--prompts-per-level", type=int,
                      help="requests per level (default 8 per client, at least 16)")
    size.add_argument("--duration-per-level", type=float, metavar="S",
                      help="send for S seconds per level, then let the requests in flight finish")
    load.add_argument("--warmup", type=int, default=4,
                      help="requests before the first level, not measured (default 4)")
    load.add_argument("--cooldown", type=float, default=5.0, metavar="S",
                      help="rest between levels, after the engine is idle (default 5)")
    load.add_argument("--seed", type=int, default=0, help="seed of the prompts (default 0)")
    load.add_argument("--token-ids", default="10:1000", metavar="LOW:HIGH",
                      help="prompt token ids are drawn from [LOW, HIGH) (default 10:1000)")
    load.add_argument("--model", help="served model name (default: the server's first)")
    limits = parser.add_argument_group("safety limits")
    limits.add_argument("--level-timeout", type=float, default=600.0, metavar="S",
                        help="a level still running after S seconds is cut and marked "
                        "incomplete (default 600)")
    limits.add_argument("--request-timeout", type=float, default=300.0, metavar="S",
                        help="a request that receives nothing for S seconds fails (default 300)")
    limits.add_argument("--max-ttft", type=float, default=60.0, metavar="S",
                        help="stop after a level whose TTFT p95 exceeds S seconds: the server "
                        "is saturated, higher levels would only take longer (default 60; 0: "
                        "never stop)")
    engine = parser.add_argument_group("load engine")
    engine.add_argument("--load-engine", choices=("auto", "builtin", "vllm-bench"),
                        default="auto",
                        help="vllm-bench: `vllm bench serve` per level; builtin: the kit's "
                        "asyncio client, same semantics; auto (default): vllm bench when "
                        "installed and the levels count prompts")
    engine.add_argument("--vllm", metavar="PATH", help="the vllm executable (default: on PATH)")
    engine.add_argument("--tokenizer", help="tokenizer for vllm bench (default: the model path "
                        "the server reports)")
    data = parser.add_argument_group("metrics and report")
    data.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                      help="seconds between /metrics scrapes (default 1)")
    data.add_argument("--prometheus", metavar="URL",
                      help="also read the sweep's series back through this Prometheus server "
                      "(into prometheus/)")
    data.add_argument("--engine-args", default="", metavar="YAML",
                      help="engine arguments the metrics do not carry, e.g. "
                      "'{max_num_seqs: 256, max_num_batched_tokens: 2048}'")
    data.add_argument("--server-log", metavar="LOG", type=Path,
                      help="the server's log (its start-up lines): the vLLM version, the device "
                           "and the engine arguments it started with, into engine.json")
    data.add_argument("--param", metavar="NAME=VALUE", action="append", default=[],
                      help="report notebook parameter (repeatable), as for `kvpressure report`")
    data.add_argument("--no-report", action="store_true", help="collect only")
    data.add_argument("--jobs", type=int, default=2, help="notebooks run side by side")


def _engine_args(text: str) -> dict:
    from kvpressure.errors import InputError
    from kvpressure.user_files import parse_user_yaml

    if not text.strip():
        return {}
    value = parse_user_yaml(text, "--engine-args")
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError("--engine-args: give a mapping, e.g. '{max_num_seqs: 256}'")
    return value


def _summary(outcome, stream) -> None:
    print("level  status      requests  failed  output tok/s  TTFT p95 s", file=stream)
    for lv in outcome.levels:
        tput = lv.get("output_throughput")
        ttft = lv.get("ttft_p95_s")
        print(f"c={lv['concurrency']:<4} {lv['status']:<11} {lv.get('requests') or '-':>8}  "
              f"{lv.get('failed') if lv.get('failed') is not None else '-':>6}  "
              f"{f'{tput:.1f}' if tput is not None else '-':>12}  "
              f"{f'{ttft:.2f}' if ttft is not None else '-':>10}"
              + (f"  ({lv['reason']})" if lv.get("reason") else ""), file=stream)


def run(args: argparse.Namespace) -> int:
    if not args.no_report:
        from kvpressure.extras import require

        # Refused before the server is loaded, not after the levels ran.
        require("report", "kvpressure collect's report", "or collect with --no-report")
    from kvpressure.live.prompts import parse_token_range
    from kvpressure.live.runner import CollectOptions, report_on, run_collect
    from kvpressure.pipeline.notebooks import NotebookFailed
    from kvpressure.pipeline.report import parse_params

    opts = CollectOptions(
        url=args.url, out=args.out, levels=_levels(args.levels), input_len=args.input_len,
        output_len=args.output_len, range_ratio=args.range_ratio,
        prompts_per_level=args.prompts_per_level, duration_per_level_s=args.duration_per_level,
        warmup=args.warmup, cooldown_s=args.cooldown, level_timeout_s=args.level_timeout,
        request_timeout_s=args.request_timeout, max_ttft_s=args.max_ttft or None,
        scrape_interval_s=args.scrape_interval, seed=args.seed,
        token_ids=parse_token_range(args.token_ids), load_engine=args.load_engine,
        vllm=args.vllm, tokenizer=args.tokenizer, model=args.model,
        engine_args=_engine_args(args.engine_args), prometheus=args.prometheus,
        server_log=args.server_log,
    )
    if args.jobs < 1:
        from kvpressure.errors import InputError

        raise InputError(f"--jobs: must be >= 1, got {args.jobs}")
    params = parse_params(args.param)
    outcome = run_collect(opts)
    _summary(outcome, sys.stderr)
    for note in outcome.notes:
        print(f"note: {note}", file=sys.stderr)
    from kvpressure.errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED

    code = (EXIT_INTERRUPTED if outcome.interrupted else 0 if outcome.all_complete
            else EXIT_INCOMPLETE)
    if outcome.stopped:
        print(f"stopped: {outcome.stopped}", file=sys.stderr)
    if args.no_report:
        print(outcome.out)
        return code
    if not outcome.complete_levels:
        print(f"kvpressure collect: no level completed, so no report; what was recorded is in "
              f"{outcome.out}", file=sys.stderr)
        return code or 3
    try:
        index = report_on(outcome, jobs=args.jobs, params=params)
    except KeyboardInterrupt:
        print(f"report skipped; the measurements are in {outcome.out}", file=sys.stderr)
        return 130
    except NotebookFailed as exc:
        print(f"kvpressure collect: the report failed: {exc}; the measurements are in "
              f"{outcome.out}", file=sys.stderr)
        return 1
    print(index)
    return code
