"""``kvpressure simulate SCENARIO --out DIR``: run a workload through the scheduler model."""

from __future__ import annotations

import argparse
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
    parser.add_argument("--concurrency", type=int, default=None,
                        help="experiment only: the closed-loop concurrency level to simulate "
                             "(default: the experiment's focus point)")


def _parse_overrides(items: list[str], experiment: bool) -> dict:
    """``KEY=VALUE`` pairs. A step-level workload knows only the scheduler's settings; an
    experiment accepts every engine argument (its own validation names a bad key)."""
    if experiment:
        import yaml

        parse = lambda key, value: yaml.safe_load(value)  # noqa: E731
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
    from kvpressure.pipeline.output_folder import check_replaceable, output_folder
    from kvpressure.simulation.engine import simulate

    out_dir = Path(args.out)
    check_replaceable(out_dir, args.force, "simulate")
    path = Path(args.scenario)
    is_experiment = path.suffix.lower() in (".yaml", ".yml")
    overrides = _parse_overrides(args.overrides, is_experiment)
    if is_experiment:
        from kvpressure.simulation import experiment

        point = experiment.load_experiment(path).point(
            concurrency=args.concurrency, overrides=overrides or None,
            with_recorder=not args.no_metrics)
        scenario, cost_model, recorder = point.scenario, point.cost_model, point.recorder
    else:
        if args.concurrency is not None:
            raise InputError("--concurrency applies to experiment files only; a step-level "
                             "workload sets mode.concurrency")
        from kvpressure.simulation.scenario import load_scenario

        scenario = load_scenario(path, overrides=overrides or None)
        cost_model = recorder = None
        if not args.no_metrics:
            from kvpressure.simulation.prom_view import PromRecorder

            recorder = PromRecorder.for_step_clock(scenario)
    with output_folder(out_dir, "simulate", inputs=[path], force=args.force) as work:
        result = simulate(scenario, cost_model=cost_model, recorder=recorder,
                          fast_path="off" if args.step_by_step else "leap")
        result.write(work)
    s = result.summary
    print(f"{scenario.name}: {s['steps']} steps, {s['num_requests']} requests, "
          f"{s['preemptions']} preemptions, recompute ratio {s['recompute_ratio']:.4f} "
          f"-> {out_dir}")
    return 0

