"""``kvpressure collect URL --levels 4,8,16,32 --out reports/NAME``: the live investigation.

Drives a closed-loop load at each concurrency level (or requests at each ``--request-rate``,
or a ``--trace`` replayed at its own times) against a running vLLM server, records its
``/metrics`` the whole time, and runs the report on what was measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
what it writes (--out): engine.json (model, KV pool, engine arguments and where each came from),
levels.json (each level's window, status and figures; warm-up and cool-downs), metrics.prom.jsonl
(the scrape log), bench/c<C>.json, r<R>.json or trace.json (one `vllm bench serve` result per
level), prometheus/ (with
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


def _level_options(args: argparse.Namespace) -> dict:
    """--levels, --request-rate, --max-concurrency and --trace as the runner's options."""
    from kvpressure.errors import InputError
    from kvpressure.live.load import parse_rates

    caps = _levels(args.max_concurrency) if args.max_concurrency else []
    if args.request_rate or args.trace:
        if len(caps) > 1:
            raise InputError("--max-concurrency: one cap for the rate levels, got "
                             f"{args.max_concurrency!r}")
        if args.levels:
            raise InputError("--levels and --request-rate/--trace: give one kind of level")
        return {"levels": [], "max_concurrency": caps[0] if caps else None,
                "request_rates": parse_rates(args.request_rate) if args.request_rate else None}
    if args.levels and caps:
        raise InputError("--levels and --max-concurrency: without --request-rate they name the "
                         "same thing, the closed loop's clients; give one")
    if not args.levels and not caps:
        raise InputError("give the levels: --levels 4,8,16 (clients), --request-rate 0.5,1,2 "
                         "(requests/s) or --trace FILE")
    return {"levels": _levels(args.levels) if args.levels else caps}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("url", help="the vLLM server, e.g. http://host:8000 (OpenAI-compatible "
                        "API and /metrics on the same port)")
    parser.add_argument("--levels", type=str,
                        help="client concurrencies to run, in order, e.g. 4,8,16,32 (or "
                        "--request-rate, or --trace)")
    parser.add_argument("--out", required=True, type=Path,
                        help="run folder to create (reports/NAME); must be new or empty")
    rates = parser.add_argument_group("request-rate levels and replays (open loop)")
    rates.add_argument("--request-rate", metavar="R[,R...]",
                       help="requests/s to send at, one level each, e.g. 0.5,1,2 (as vllm bench "
                       "serve --request-rate): the report's levels are these rates")
    rates.add_argument("--max-concurrency", metavar="N",
                       help="with --request-rate or --trace: at most N requests in flight (as "
                       "vllm bench serve --max-concurrency; default: none, an open loop); "
                       "alone: the closed-loop levels, as --levels")
    rates.add_argument("--burstiness", type=float, default=1.0,
                       help="gamma shape of the gaps between sends: 1 Poisson (default), "
                       "smaller burstier (as vllm bench serve --burstiness)")
    rates.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson",
                       help="poisson: gamma gaps of --burstiness (default); constant: one "
                       "request every 1/R s")
    rates.add_argument("--trace", type=Path, metavar="FILE",
                       help="replay a Mooncake-style JSONL trace (timestamp ms, input_length, "
                       "output_length, hash_ids) at its own times, as one level")
    load = parser.add_argument_group("the load at each level")
    load.add_argument("--dataset", type=Path, metavar="FILE",
                      help="prompts from a file instead of random ids: JSONL of token counts "
                      "(input_length, output_length) or of prompts (prompt, output_len), or "
                      "ShareGPT-style JSON (conversations); levels take its requests in order")
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
    engine.add_argument("--bench-args", default="", metavar='"ARGS"',
                        help="more options for vllm bench serve when it is the load engine, "
                        "passed as they are (e.g. \"--ramp-up-strategy linear\")")
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
        name = (f"c={lv['concurrency']}" if "level" not in lv else
                f"r={lv['request_rate']:g}/s" if lv.get("request_rate") else lv["level"])
        print(f"{name:<6} {lv['status']:<11} {lv.get('requests') or '-':>8}  "
              f"{lv.get('failed') if lv.get('failed') is not None else '-':>6}  "
              f"{f'{tput:.1f}' if tput is not None else '-':>12}  "
              f"{f'{ttft:.2f}' if ttft is not None else '-':>10}"
              + (f"  ({lv['reason']})" if lv.get("reason") else ""), file=stream)


def run(args: argparse.Namespace) -> int:
    if not args.no_report:
        from kvpressure.extras import require

        # Refused before the server is loaded, not after the levels ran.
        require("report", "kvpressure collect's report", "or collect with --no-report")
    import shlex

    from kvpressure.investigation.report import parse_params
    from kvpressure.live.prompts import parse_token_range
    from kvpressure.live.runner import CollectOptions, report_on, run_collect
    from kvpressure.notebooks.batch import NotebookFailed

    opts = CollectOptions(
        url=args.url, out=args.out, **_level_options(args), input_len=args.input_len,
        output_len=args.output_len, range_ratio=args.range_ratio,
        prompts_per_level=args.prompts_per_level, duration_per_level_s=args.duration_per_level,
        warmup=args.warmup, cooldown_s=args.cooldown, level_timeout_s=args.level_timeout,
        request_timeout_s=args.request_timeout, max_ttft_s=args.max_ttft or None,
        scrape_interval_s=args.scrape_interval, seed=args.seed,
        token_ids=parse_token_range(args.token_ids), load_engine=args.load_engine,
        vllm=args.vllm, tokenizer=args.tokenizer, model=args.model,
        engine_args=_engine_args(args.engine_args), prometheus=args.prometheus,
        server_log=args.server_log, burstiness=args.burstiness, arrivals=args.arrivals,
        dataset=args.dataset, trace=args.trace, bench_args=shlex.split(args.bench_args),
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
