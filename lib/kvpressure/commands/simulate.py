"""``kvpressure simulate SCENARIO --out DIR``: run a workload through the scheduler model."""

from __future__ import annotations

import argparse
import sys
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
                        help="disable the event-driven fast path (same results, slower)")


def _parse_overrides(items: list[str]) -> dict:
    from kvpressure.simulation.scenario import parse_setting_value

    out = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        key = key.strip()
        out[key] = parse_setting_value(key, value)
    return out


def run(args: argparse.Namespace) -> int:
    from kvpressure.simulation.engine import simulate

    out_dir = Path(args.out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not args.force:
        raise InputError(f"--out {out_dir}: exists and is not empty (use --force to overwrite)")
    overrides = _parse_overrides(args.overrides)
    path = Path(args.scenario)
    if path.suffix.lower() in (".yaml", ".yml"):
        scenario, cost_model, recorder = _experiment_point(path, overrides)
    else:
        from kvpressure.simulation.scenario import load_scenario

        scenario = load_scenario(path, overrides=overrides or None)
        cost_model = recorder = None
    try:
        result = simulate(scenario, cost_model=cost_model, recorder=recorder,
                          event_driven=not args.step_by_step)
    except InputError:
        raise
    except Exception as exc:  # an internal error: exit 1, with what we know
        print(f"kvpressure simulate: internal error: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    result.write(out_dir)
    s = result.summary
    print(f"{scenario.name}: {s['steps']} steps, {s['num_requests']} requests, "
          f"{s['preemptions']} preemptions, recompute ratio {s['recompute_ratio']:.4f} "
          f"-> {out_dir}")
    return 0


def _experiment_point(path: Path, overrides: dict):
    """An experiment file: its first point (focus variant and concurrency), built by
    ``simulation.experiment``."""
    from kvpressure.simulation import experiment

    exp = experiment.load_experiment(path)
    point = experiment.build_point(exp, overrides=overrides or None)
    scenario = getattr(point, "scenario", None)
    if scenario is None and isinstance(point, tuple):
        scenario, cost_model, recorder = (tuple(point) + (None, None))[:3]
        return scenario, cost_model, recorder
    return scenario, getattr(point, "cost_model", None), getattr(point, "recorder", None)
