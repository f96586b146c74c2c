"""What a configuration is simulated on: an experiment (hardware and model profiles, the pool
sized as vLLM sizes it) or the fitted twin of a measured server.

A target is shipped to the workers (pickled) and evaluates one configuration at every level:
``evaluate(config)`` returns the configuration's result record, ``status`` ``ok`` with one row
per level, or ``invalid`` with the reason vLLM would give for refusing to start. Every
configuration replays the same request set (the experiment's workload seed; the twin's measured
requests), so results differ by the settings alone and never by which worker ran them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from kvpressure.errors import InputError
from kvpressure.tune.grid import config_id

# What each level of a configuration reports (results.jsonl, levels.csv).
LEVEL_METRICS = (
    "output_throughput", "total_token_throughput", "request_throughput", "ttft_mean_s",
    "ttft_p50_s", "ttft_p95_s", "itl_mean_s", "itl_p95_s", "itl_p99_s", "e2e_mean_s",
    "preemptions", "recompute_ratio", "mean_running", "refused_requests",
)


def _finite(v: Any) -> Any:
    """JSON has no NaN: a metric a level could not measure is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _record(config: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    return {"id": config_id(config), "config": dict(config), **fields}


def _reason(exc: InputError, where: str | None) -> str:
    text = str(exc)
    if where:  # the experiment's path says nothing about the configuration
        text = text.replace(f"{where}: ", "")
    return text


class ExperimentTarget:
    """The experiment's workload at its levels, one configuration's overrides at a time."""

    kind = "experiment"

    def __init__(self, experiment: Any) -> None:
        self.experiment = experiment
        if experiment.mode == "closed":
            experiment.requests_for_seed(experiment.seed)  # drawn once, shipped with the target
        self._by_tp: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def level_name(self) -> str:
        return "concurrency" if self.experiment.mode == "closed" else "request_rate"

    @property
    def levels(self) -> list[float]:
        return list(self.experiment.levels)

    @property
    def seed(self) -> int:
        return int(self.experiment.seed)

    @property
    def latencies(self) -> tuple[str, ...]:
        return ("ttft_p50_s", "ttft_p95_s", "ttft_mean_s", "itl_p95_s", "itl_p99_s",
                "itl_mean_s", "e2e_mean_s")

    def identity(self) -> str:
        """What fixes every result: the kit's version, the experiment as validated, the
        profiles' contents. A finished configuration is reused only under the same identity."""
        from kvpressure import __version__

        exp = self.experiment
        # Words and the sweep's own sections do not change a tune's simulations.
        config = exp.config.model_dump(mode="json", exclude={
            "name", "description", "comparison", "remedies", "focus", "scrape_interval_s"})
        text = json.dumps([__version__, self.kind, config,
                           repr(exp.hardware), repr(exp.model)], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def baseline_settings(self) -> dict[str, Any]:
        return {**self.experiment.settings(),
                "tensor_parallel_size": self.experiment.config.tensor_parallel_size}

    def _experiment(self, tp: int) -> Any:
        from kvpressure.simulation.experiment import Experiment

        exp = self.experiment
        if tp == exp.config.tensor_parallel_size:
            return exp
        if tp not in self._by_tp:
            other = Experiment(exp.config.model_copy(update={"tensor_parallel_size": tp}),
                               exp.path, exp.text)
            other._requests_by_seed = exp._requests_by_seed
            self._by_tp[tp] = other
        return self._by_tp[tp]

    def evaluate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        from kvpressure.simulation.engine import simulate

        where = str(self.experiment.path) if self.experiment.path else None
        overrides = {k: v for k, v in config.items() if k != "tensor_parallel_size"}
        tp = int(config.get("tensor_parallel_size", self.experiment.config.tensor_parallel_size))
        try:
            if tp < 1:
                raise InputError(f"tensor_parallel_size must be >= 1, got {tp}")
            exp = self._experiment(tp)
            exp.model.check_tp(tp)
            settings = {**exp.settings(overrides), "tensor_parallel_size": tp}
            points = [exp.point(**{("concurrency" if exp.mode == "closed" else "request_rate"):
                                   level}, overrides=overrides, with_recorder=False)
                      for level in self.levels]
        except InputError as exc:
            return _record(config, status="invalid", reason=_reason(exc, where),
                           seed=self.seed, settings=None, levels=[])
        rows = []
        for level, point in zip(self.levels, points, strict=True):
            result = simulate(point.scenario, cost_model=point.cost_model, recorder=None,
                              fast_path="leap")
            rows.append(_level_row(level, result, point.scenario))
        return _record(config, status="ok", reason=None, seed=self.seed,
                       settings=_jsonable(settings), levels=rows)


def _level_row(level: float, result: Any, scenario: Any) -> dict[str, Any]:
    from kvpressure.simulation.outputs import percentile

    s = result.summary
    ttft = [r.first_token_time_s - r.submit_time_s for r in result.requests
            if math.isfinite(r.first_token_time_s)]
    row = {"level": level}
    for key in LEVEL_METRICS:
        row[key] = _finite(s.get(key))
    row["ttft_p50_s"] = percentile(ttft, None, 0.50)
    row["refused_requests"] = int(scenario.annotations.get("refused_requests", 0) or 0)
    return row


def _jsonable(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: settings[k] for k in sorted(settings)}


class TwinTarget:
    """The fitted twin of a measured server: its settings, its measured request sets per
    level, its fitted step time. Only settings the twin can change are tunable: the pool was
    measured, so ``gpu_memory_utilization`` and ``tensor_parallel_size`` (which resize it and
    change the step time) need an experiment with the hardware and model profiles."""

    kind = "twin"
    NOT_TUNABLE = ("gpu_memory_utilization", "tensor_parallel_size")

    def __init__(self, twin: Any, name: str) -> None:
        fit = twin.require_fit("tuning")
        self.name = name
        self.settings = dict(twin.settings)
        self.workloads = dict(twin.workloads)
        self.coefficients = dict(fit.step_coefficients())
        self.ttft_offset = float(fit.theta["ttft_offset"])
        # An open loop's levels are its request rates (twin/open_loop.py).
        self.level_name = twin.key

    @property
    def levels(self) -> list[float]:
        return sorted(self.workloads)

    seed = 0

    @property
    def latencies(self) -> tuple[str, ...]:
        from kvpressure.twin.remedies import PRICED_LATENCIES

        return PRICED_LATENCIES

    def identity(self) -> str:
        from kvpressure import __version__

        text = json.dumps([__version__, self.kind, self.settings, self.coefficients,
                           self.ttft_offset, {c: [w.prompt_lens, w.output_lens,
                                                  w.arrival_times_s, w.return_steps,
                                                  w.first_alone]
                                              for c, w in sorted(self.workloads.items())}],
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def baseline_settings(self) -> dict[str, Any]:
        return dict(self.settings)

    def check_parameters(self, names: list[str]) -> None:
        bad = [n for n in names if n in self.NOT_TUNABLE]
        if bad:
            raise InputError(
                f"{', '.join(bad)}: not tunable on a measured twin (its KV pool and step time "
                "were measured at the server's own values); tune an experiment built from the "
                "hardware and model profiles for these")

    def evaluate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        from kvpressure.simulation.experiment import ENGINE_ARGS
        from kvpressure.twin.basis import build_scenario
        from kvpressure.twin.simulate import simulate_level

        settings = dict(self.settings)
        for k, v in config.items():
            settings[ENGINE_ARGS.get(k) or k] = v
        try:
            blocks = math.ceil(int(settings["max_model_len"]) / int(settings["block_size"]))
            # The measured settings ran, whatever this check says; only a change is checked.
            resized = {"max_model_len", "num_gpu_blocks", "block_size"} & set(config)
            if resized and blocks > int(settings["num_gpu_blocks"]) - 1:
                raise InputError(
                    f"max_model_len: to serve at least one request of "
                    f"{settings['max_model_len']} tokens, {blocks} KV blocks are needed, more "
                    f"than the {int(settings['num_gpu_blocks']) - 1} available. Lower "
                    "max_model_len or raise gpu_memory_utilization.")
            for c in self.levels:
                build_scenario(settings, self.workloads[c])
        except InputError as exc:
            return _record(config, status="invalid", reason=str(exc), seed=0, settings=None,
                           levels=[])
        rows = []
        for c in self.levels:
            got = simulate_level(settings, self.workloads[c], self.coefficients,
                                 self.ttft_offset)
            row = {"level": c}
            for key in LEVEL_METRICS:
                row[key] = _finite(got.get(key))
            rows.append(row)
        return _record(config, status="ok", reason=None, seed=0,
                       settings=_jsonable(settings), levels=rows)


def load_target(source: str, *, hardware: str | None = None, model: str | None = None,
                tp: int = 1, overrides: dict[str, Any] | None = None) -> Any:
    """An experiment YAML (or a built-in experiment's name) or a measured run folder (the twin
    is built and fitted here, once, before any configuration runs); ``overrides``: a run
    folder's engine settings the data lacks (``--set``)."""
    from pathlib import Path

    path = Path(source)
    if overrides and not path.is_dir():
        raise InputError(f"--set: {source} is an experiment, whose settings are its own; "
                         "--set gives a measured run folder's (change the experiment, or tune "
                         "the setting with --param)")
    if path.is_dir():
        from kvpressure.twin.api import build_twin

        cost_model = None
        if hardware or model:
            if not (hardware and model):
                raise InputError("--hardware and --model go together (the roofline needs both)")
            from kvpressure.profiles.hardware import load_hardware
            from kvpressure.profiles.model import load_model
            from kvpressure.simulation.cost_model import StepCostModel

            cost_model = StepCostModel.from_profiles(load_hardware(hardware), load_model(model),
                                                     tp)
        twin = build_twin(path, cost_model=cost_model, overrides=overrides)
        twin.fit()
        return TwinTarget(twin, path.resolve().name)
    from kvpressure.simulation.experiment import load_experiment

    return ExperimentTarget(load_experiment(source))
