"""``kvpressure simulate SCENARIO --out DIR``: run a workload through the scheduler model."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from kvpressure.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="step-level workload JSON, or an experiment YAML")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override one setting, e.g. max_num_seqs=32")
    parser.add_argument("--force", action="store_true",
                        help="write into an existing non-empty output folder")
    parser.add_argument("--step-by-step", action="store_true",
                        help="the exact path alone, no fast path (fast_path='off': same "
                             "results, slower)")
    parser.add_argument("--no-metrics", action="store_true",
                        help="skip the Prometheus view (metrics.prom.jsonl): faster, but no "
                             "scrapes to ingest")
    parser.add_argument("--concurrency", "--max-concurrency", type=int, default=None,
                        help="experiment only: the closed-loop concurrency level to simulate "
                             "(default: the experiment's focus point)")
    parser.add_argument("--request-rate", type=float, default=None,
                        help="experiment only: the open-loop request rate to simulate")
    add_load_arguments(parser, replay=True)


def add_load_arguments(parser: argparse.ArgumentParser, replay: bool) -> None:
    """``--trace`` (and, for one run, ``--stages``): the experiment's load from the command
    line, priced by its cost model."""
    what = ("replayed at its own arrival times (or its lengths at --concurrency / "
            "--request-rate / --stages)" if replay else
            "its request lengths at each of the experiment's levels")
    parser.add_argument("--trace", metavar="FILE",
                        help=f"experiment only: requests from a CSV or JSONL trace "
                             f"(prompt_len/input_length, output_len/output_length, "
                             f"arrival_time_s/timestamp), {what}")
    parser.add_argument("--trace-time-unit", choices=("s", "ms"), default="s",
                        help="unit of the trace's arrival column (ms for Mooncake traces)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply the trace's gaps between arrivals (default 1)")
    if replay:
        parser.add_argument("--stages", metavar="RATE:SECONDS,...",
                            help="experiment only: one open loop whose request rate changes "
                                 "in stages, e.g. 8:600,20:600")


def parse_stages(text: str) -> list[dict[str, float]]:
    """``RATE:SECONDS,RATE:SECONDS`` -> the workload's stages."""
    stages = []
    for item in text.split(","):
        rate, sep, seconds = item.partition(":")
        try:
            stage = {"request_rate": float(rate), "duration_s": float(seconds)}
        except ValueError:
            stage = None
        if not sep or stage is None or not all(math.isfinite(v) and v > 0
                                               for v in stage.values()):
            raise InputError(f"--stages {item!r}: expected RATE:SECONDS with both > 0, "
                             "e.g. 8:600")
        stages.append(stage)
    return stages


# Far past any server's clients; a typo of a few digits more would only exhaust the memory.
MAX_CLIENTS = 1_000_000


def apply_load_options(exp, args: argparse.Namespace, replay: bool):
    """The experiment with the command line's trace and stages; the files they read."""
    inputs = []
    if not args.time_scale > 0 or not math.isfinite(args.time_scale):
        raise InputError(f"--time-scale: must be a finite number > 0, got {args.time_scale}")
    if args.time_scale != 1.0 and not args.trace:
        raise InputError("--time-scale scales a trace's gaps: give it with --trace")
    if args.trace:
        trace = Path(args.trace)
        if not trace.is_file():
            raise InputError(f"--trace {args.trace}: file not found")
        own_times = replay and not (getattr(args, "stages", None) or args.concurrency
                                    or getattr(args, "request_rate", None))
        exp = exp.with_trace({"path": str(trace.resolve()), "time_scale": args.time_scale,
                              "time_unit": args.trace_time_unit}, replay=own_times)
        inputs.append(trace)
    if getattr(args, "stages", None):
        exp = exp.with_stages(parse_stages(args.stages))
    return exp, inputs


def _parse_overrides(items: list[str], experiment: bool) -> dict:
    """``KEY=VALUE`` pairs. A step-level workload knows only the scheduler's settings; an
    experiment accepts every engine argument (its own validation names a bad key)."""
    if experiment:
        from kvpressure.user_files import parse_user_yaml

        parse = lambda key, value: parse_user_yaml(value, f"--set {key}")  # noqa: E731
    else:
        from kvpressure.simulation.scenario import parse_setting_value as parse
    out = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        out[key.strip()] = parse(key.strip(), value)
    return out


def run(args: argparse.Namespace) -> int:
    t_import = time.perf_counter()
    from kvpressure.folders.output_folder import check_replaceable, output_folder
    from kvpressure.simulation.engine import simulate

    import_s = time.perf_counter() - t_import

    out_dir = Path(args.out)
    check_replaceable(out_dir, args.force, "simulate")
    path = Path(args.scenario)
    is_experiment = path.suffix.lower() in (".yaml", ".yml")
    overrides = _parse_overrides(args.overrides, is_experiment)
    inputs = [path]
    if args.concurrency is not None and not 1 <= args.concurrency <= MAX_CLIENTS:
        raise InputError(f"--concurrency: must be a whole number from 1 to {MAX_CLIENTS:,}, "
                         f"got {args.concurrency}")
    if args.request_rate is not None and not args.request_rate > 0:
        raise InputError(f"--request-rate: must be > 0 requests per second (inf: all at "
                         f"once), got {args.request_rate}")
    if is_experiment:
        from kvpressure.simulation import experiment

        exp, read = apply_load_options(experiment.load_experiment(path), args, replay=True)
        inputs += read
        point = exp.point(
            concurrency=args.concurrency, request_rate=args.request_rate,
            overrides=overrides or None, with_recorder=not args.no_metrics)
        scenario, cost_model, recorder = point.scenario, point.cost_model, point.recorder
    else:
        for option in ("concurrency", "request_rate", "trace", "stages"):
            if getattr(args, option) is not None:
                raise InputError(f"--{option.replace('_', '-')} applies to experiment files "
                                 "only; a step-level workload gives its own requests and mode")
        from kvpressure.simulation.scenario import load_scenario

        scenario = load_scenario(path, overrides=overrides or None)
        cost_model = recorder = None
        if not args.no_metrics:
            from kvpressure.simulation.prom_view import PromRecorder

            recorder = PromRecorder.for_step_clock(scenario)
    with output_folder(out_dir, "simulate", inputs=inputs, force=args.force) as work:
        result = simulate(scenario, cost_model=cost_model, recorder=recorder,
                          fast_path="off" if args.step_by_step else "leap")
        result.summary["timing"]["import_s"] = round(import_s, 6)
        result.write(work)
    s = result.summary
    print(f"{scenario.name}: {s['steps']} steps, {s['num_requests']} requests, "
          f"{s['preemptions']} preemptions, recompute ratio {s['recompute_ratio']:.4f} "
          f"-> {out_dir}")
    return 0

