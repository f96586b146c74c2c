"""Experiment files (``docs/interfaces.md#experiment-yaml``): hardware + model + engine arguments +
workload + the single-variable comparison, turned into simulation points.

```yaml
name: seed_case
description: ...
hardware: ascend-910b-64g          # built-in profile name or a YAML path
model: llama-3.1-70b               # built-in name, profile YAML, or Hugging Face config.json
tensor_parallel_size: 8
engine:                            # vLLM engine arguments; omitted ones take vLLM's defaults
  gpu_memory_utilization: 0.9
  max_num_seqs: 256
  max_num_batched_tokens: 2048
  scheduler_reserve_full_isl: false
workload:
  num_requests: 300
  seed: 7
  input_len: {type: uniform, low: 4096, high: 8192}
  output_len: {type: uniform, low: 128, high: 512}
  concurrency: [8, 16, 32, 64]     # closed loop; or request_rates: [1, 2, 4] (open loop)
comparison: {parameter: max_num_seqs, values: [32], seeds: 3}
remedies: [{parameter: scheduler_reserve_full_isl, values: [true]}]
cost_model: {t0: 0.004}            # coefficient overrides
scrape_interval_s: 5
```

The KV pool is sized from the profiles the way vLLM 0.33.0 sizes it
(``profiles.kvpool.size_kv_pool``) unless ``engine.num_gpu_blocks`` is given; an override of
``gpu_memory_utilization``, ``max_model_len``, ``max_num_batched_tokens`` or ``block_size``
re-sizes it. Every point replays the same request set (same seed), so a comparison changes
exactly one variable.

``comparison.seeds`` (default 1) asks for run-to-run noise: every point of the sweep is also run
with ``seeds - 1`` more request sets, drawn from workload seeds derived from the experiment's
(:func:`repeat_seeds`), so a knee shift can be judged against the spread between seeds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvpressure.errors import InputError
from kvpressure.paths import data_dir
from kvpressure.simulation.cost_model import REQUEST_PATH_FIELDS, CostCoefficients, StepCostModel
from kvpressure.simulation.prom_view import MAX_SCRAPES
from kvpressure.simulation.workload import (
    LoadStage,
    WorkloadSpec,
    format_validation_error,
    generate_requests,
)
from kvpressure.user_files import parse_user_yaml, read_user_text

# Engine arguments an experiment (or an override) may set, with the scenario setting each maps
# to (None: used only to size the KV pool).
ENGINE_ARGS: dict[str, str | None] = {
    "gpu_memory_utilization": None,
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len",
    "block_size": "block_size",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "enable_prefix_caching": "enable_prefix_caching",
    "scheduling_policy": "policy",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "scheduler_reserve_full_isl": "scheduler_reserve_full_isl",
    "watermark": "watermark",
    "num_gpu_blocks": "num_gpu_blocks",
    "max_num_active_seqs": "max_num_active_seqs",
    "async_scheduling": "async_scheduling",
}
ALIASES = {"policy": "scheduling_policy", "num_gpu_blocks_override": "num_gpu_blocks"}
# More repeats than this would make a sweep slow without sharpening the noise much.
MAX_SEEDS = 16
# Overrides of these change the pool size vLLM would compute.
POOL_ARGS = ("gpu_memory_utilization", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
             "block_size", "enable_chunked_prefill", "async_scheduling")


class _Strict(BaseModel):
    # strict: `max_num_seqs: true` is a mistake, not 1
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class EngineArgs(_Strict):
    """vLLM engine arguments (0.33.0 names). ``None`` = vLLM's default for the device."""

    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    long_prefill_token_threshold: int = Field(0, ge=0)
    scheduler_reserve_full_isl: bool = True
    watermark: float = Field(0.0, ge=0, lt=1)
    num_gpu_blocks: int | None = Field(None, ge=2)
    max_num_active_seqs: int | None = Field(None, ge=1)
    async_scheduling: bool | None = None
    """None: vLLM 0.33.0's choice (config/vllm.py): on, unless pipeline parallelism, a pooling
    model, an executor without it or some speculative decoding methods turn it off; none of
    those is in an experiment, so on."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {ALIASES.get(k, k): v for k, v in data.items()}
        return data


class ExperimentWorkload(WorkloadSpec):
    """The workload section: a ``WorkloadSpec`` plus the levels to sweep."""

    concurrency: list[int] | None = None
    request_rates: list[Annotated[float, Field(allow_inf_nan=True)]] | None = None
    stages: list[LoadStage] | None = Field(None, min_length=1)
    """One open loop whose rate changes in stages (instead of a sweep over rates)."""
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=True)
    """Gamma shape of the gaps between arrivals: 1 Poisson, .inf evenly spaced."""

    @model_validator(mode="before")
    @classmethod
    def _single_level_as_list(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            stages = data.get("stages")
            if isinstance(stages, list) and data.get("num_requests") is None \
                    and data.get("trace") is None:
                # The stages fix the count; this only completes the request set's spec.
                try:
                    data["num_requests"] = max(1, math.ceil(sum(
                        float(st["request_rate"]) * float(st["duration_s"]) for st in stages)))
                except (KeyError, TypeError, ValueError):
                    pass  # the stage's own validation names the field
            if isinstance(data.get("concurrency"), int):
                data["concurrency"] = [data["concurrency"]]
            if isinstance(data.get("request_rates"), int | float):
                data["request_rates"] = [data["request_rates"]]
        return data

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v or any(c < 1 for c in v):
                raise ValueError("concurrency levels must be integers >= 1")
            if len(set(v)) != len(v):
                raise ValueError("concurrency levels must be distinct")
        return v

    @field_validator("request_rates")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not r > 0 for r in v)):
            raise ValueError("request rates must be > 0 (requests per second; .inf allowed)")
        return v

    @model_validator(mode="after")
    def _one_mode(self) -> ExperimentWorkload:
        given = [k for k in ("concurrency", "request_rates", "stages")
                 if getattr(self, k) is not None]
        if len(given) > 1 or (not given and not self.replays_trace):
            raise ValueError("give one of concurrency (closed loop), request_rates (open "
                             "loop), stages (an open loop in stages) or a trace with its "
                             "arrival times")
        return self

    @property
    def replays_trace(self) -> bool:
        """An open loop at the trace's own arrival times."""
        return (self.trace is not None and self.trace.use_arrivals and self.concurrency is None
                and self.request_rates is None and self.stages is None)

    def spec(self) -> WorkloadSpec:
        """The request-set part alone (what ``generate_requests`` builds from)."""
        return WorkloadSpec.model_validate({k: getattr(self, k) for k in WorkloadSpec.model_fields})


class SettingChange(_Strict):
    """One engine argument and the values to try instead of the baseline's (a remedy)."""

    parameter: str
    values: list[Any] = Field(min_length=1)
    note: str | None = None

    @field_validator("parameter")
    @classmethod
    def _known(cls, v: str) -> str:
        v = ALIASES.get(v, v)
        if v not in ENGINE_ARGS:
            raise ValueError(f"unknown engine argument {v!r}; known: {', '.join(ENGINE_ARGS)}")
        return v


class Comparison(SettingChange):
    """The single-variable comparison: one engine argument, its values, and how many workload
    seeds each point is run with (the base seed plus ``seeds - 1`` derived ones)."""

    seeds: int = Field(1, ge=1, le=MAX_SEEDS)


class Focus(_Strict):
    variant: str = "baseline"
    concurrency: int | None = Field(None, ge=1)
    request_rate: float | None = Field(None, gt=0, allow_inf_nan=True)


class ExperimentFile(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    hardware: str
    model: str
    served_model_name: str | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    engine: EngineArgs = Field(default_factory=EngineArgs)
    workload: ExperimentWorkload
    comparison: Comparison | None = None
    remedies: list[SettingChange] = Field(default_factory=list)
    cost_model: dict[str, float | bool] = Field(default_factory=dict)
    # Finer than this the Prometheus view would hold millions of scrapes of a short run.
    scrape_interval_s: float = Field(5.0, ge=0.01)
    focus: Focus = Field(default_factory=Focus)

    @model_validator(mode="after")
    def _values_are_engine_arguments(self) -> ExperimentFile:
        """Each value a comparison or remedy tries is one its engine argument takes (a remedy
        of ``watermark: .nan`` or ``max_num_seqs: abc`` would otherwise fail mid-sweep)."""
        changes = [("comparison", self.comparison)] if self.comparison is not None else []
        changes += [(f"remedies[{i}]", r) for i, r in enumerate(self.remedies)]
        for where, change in changes:
            for j, value in enumerate(change.values):
                try:
                    EngineArgs.model_validate({change.parameter: value})
                except ValidationError as exc:
                    raise ValueError(f"field '{where}.values[{j}]': {value!r} is no value of "
                                     f"{change.parameter}: {exc.errors()[0]['msg']}") from None
        return self

    @model_validator(mode="after")
    def _focus_is_a_level(self) -> ExperimentFile:
        w, f = self.workload, self.focus
        for given, levels, name in ((f.concurrency, w.concurrency, "concurrency"),
                                    (f.request_rate, w.request_rates, "request_rate")):
            if given is not None and levels is not None and given not in levels:
                raise ValueError(f"field 'focus.{name}': {given:g} is not one of the workload's "
                                 f"levels ({', '.join(f'{x:g}' for x in sorted(levels))})")
        return self

    @field_validator("cost_model")
    @classmethod
    def _coefficients(cls, v: dict[str, Any]) -> dict[str, Any]:
        known = {f for f in CostCoefficients.__dataclass_fields__} | set(REQUEST_PATH_FIELDS)
        unknown = sorted(set(v) - known)
        if unknown:
            raise ValueError(f"unknown coefficient(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known))}")
        return v


@dataclass
class Point:
    """One simulation point: what ``simulate`` needs, and where it sits in the sweep."""

    scenario: Any
    cost_model: StepCostModel
    recorder: Any
    variant: str
    concurrency: int | None
    request_rate: float | None
    settings: dict[str, Any]
    """Every engine argument in force (pool size included)."""


class Experiment:
    """A validated experiment file; builds the simulation points of its sweep."""

    def __init__(self, config: ExperimentFile, path: Path | None = None,
                 text: str | None = None):
        self.config = config
        self.path = path
        self.text = text
        self.base_dir = path.parent if path is not None else Path.cwd()
        self._pool_cache: dict[tuple, Any] = {}
        self._requests_by_seed: dict[int, list[dict[str, Any]]] = {}
        # Fail early on unknown profiles and impossible pools, naming the file.
        where = str(path) if path else "experiment"
        try:
            _ = (self.hardware, self.model, self.cost_model)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        focus = config.focus.variant
        if focus != "baseline":
            known = self.variants(include_remedies=True)
            if focus not in known:
                raise InputError(f"{where}: field 'focus.variant': {focus!r} is none of the "
                                 f"experiment's variants ({', '.join(known)})")

    # --- identity --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.config.name

    @property
    def description(self) -> str:
        return self.config.description

    @property
    def mode(self) -> str:
        return "closed" if self.config.workload.concurrency is not None else "open"

    @property
    def levels(self) -> list[float]:
        """Concurrency levels (closed loop) or request rates (open loop), sorted."""
        w = self.config.workload
        return sorted(w.concurrency if w.concurrency is not None else w.request_rates or [])

    @property
    def concurrencies(self) -> list[int]:
        return sorted(self.config.workload.concurrency or [])

    @property
    def request_rates(self) -> list[float]:
        return sorted(self.config.workload.request_rates or [])

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.model.name

    # --- profiles ------------------------------------------------------------------------------
    def _resolve(self, ref: str) -> str:
        """Paths are relative to the experiment file; bare names are built-in profiles."""
        if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref:
            p = Path(ref)
            return str(p if p.is_absolute() else self.base_dir / p)
        return ref

    @cached_property
    def hardware(self) -> Any:
        from kvpressure.profiles.hardware import load_hardware

        return load_hardware(self._resolve(self.config.hardware))

    @cached_property
    def model(self) -> Any:
        from kvpressure.profiles.model import load_model

        return load_model(self._resolve(self.config.model))

    @cached_property
    def cost_model(self) -> StepCostModel:
        return StepCostModel.from_profiles(
            self.hardware, self.model, self.config.tensor_parallel_size,
            **self.config.cost_model,
        )

    @property
    def seed(self) -> int:
        """The workload seed of the experiment file (repeat 0)."""
        return self.config.workload.seed

    @property
    def seeds(self) -> list[int]:
        """The workload seeds every point is run with: the comparison's ``seeds`` of them,
        the experiment's own first."""
        n = self.config.comparison.seeds if self.config.comparison is not None else 1
        return repeat_seeds(self.seed, n)

    def _spec(self, seed: int | None) -> WorkloadSpec:
        spec = self.config.workload.spec()
        if seed is not None and seed != spec.seed:
            spec = spec.model_copy(update={"seed": int(seed)})
        return spec

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The closed-loop request set (the same at every concurrency level)."""
        return self.requests_for_seed(self.seed)

    def requests_for_seed(self, seed: int) -> list[dict[str, Any]]:
        """The closed-loop request set drawn with workload seed ``seed`` (kept once drawn)."""
        if seed not in self._requests_by_seed:
            self._requests_by_seed[seed] = generate_requests(self._spec(seed),
                                                             base_dir=self.base_dir)
        return self._requests_by_seed[seed]

    def requests_at_rate(self, request_rate: float | None, seed: int | None = None
                         ) -> list[dict[str, Any]]:
        """The open loop's requests at ``request_rate``; None: the workload's stages, or the
        trace's own arrival times."""
        w = self.config.workload
        if request_rate is None:
            if w.stages:
                return generate_requests(self._spec(seed), stages=w.stages,
                                         arrivals={"request_rate": 1.0,
                                                   "burstiness": w.burstiness},
                                         base_dir=self.base_dir)
            return generate_requests(self._spec(seed), base_dir=self.base_dir)
        return generate_requests(
            self._spec(seed), arrivals={"request_rate": request_rate, "burstiness": w.burstiness},
            base_dir=self.base_dir,
        )

    def with_trace(self, trace: dict[str, Any], replay: bool) -> Experiment:
        """The same experiment with its request lengths from ``trace`` (a ``Trace`` mapping);
        ``replay``: an open loop at the trace's own arrival times instead of the levels."""
        data = self.config.model_dump(exclude_none=True)
        workload = data["workload"]
        for k in ("input_len", "output_len", "num_requests", "prefix_groups"):
            workload.pop(k, None)
        if replay:
            for k in ("concurrency", "request_rates", "stages"):
                workload.pop(k, None)
            data.pop("focus", None)
        workload["trace"] = {**trace, "use_arrivals": replay}
        return experiment_from_dict(data, self.path, self.text)

    def with_stages(self, stages: list[dict[str, float]]) -> Experiment:
        """The same experiment as one open loop whose rate changes in ``stages``."""
        data = self.config.model_dump(exclude_none=True)
        workload = data["workload"]
        for k in ("concurrency", "request_rates"):
            workload.pop(k, None)
        if workload.get("trace"):
            workload["trace"]["use_arrivals"] = False
        workload["stages"] = stages
        data.pop("focus", None)
        return experiment_from_dict(data, self.path, self.text)

    # --- engine arguments ----------------------------------------------------------------------
    def engine_args(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experiment's engine arguments with ``overrides`` applied and validated."""
        merged = self.config.engine.model_dump()
        for key, value in (overrides or {}).items():
            key = ALIASES.get(key, key)
            if key not in ENGINE_ARGS:
                raise InputError(f"override {key!r}: not an engine argument; known: "
                                 f"{', '.join(ENGINE_ARGS)}")
            try:  # named as the override, not as the file's field it replaces
                EngineArgs.model_validate({key: value})
            except ValidationError as exc:
                raise format_validation_error(exc, f"override {key}={_fmt(value)}", "engine") from None
            merged[key] = value
        try:
            args = EngineArgs.model_validate(merged).model_dump()
        except ValidationError as exc:
            raise format_validation_error(exc, self._where(), "engine") from None
        if args["async_scheduling"] is None:
            args["async_scheduling"] = True
        return args

    def _where(self) -> str:
        return str(self.path) if self.path else f"experiment {self.name}"

    def pool(self, overrides: dict[str, Any] | None = None) -> Any:
        """vLLM's KV-pool sizing for these engine arguments (``KVPoolSizing``)."""
        from kvpressure.profiles.kvpool import size_kv_pool

        args = self.engine_args(overrides)
        key = tuple((k, args[k]) for k in (*POOL_ARGS, "num_gpu_blocks"))
        if key not in self._pool_cache:
            try:
                self._pool_cache[key] = size_kv_pool(
                    self.hardware, self.model, self.config.tensor_parallel_size,
                    gpu_memory_utilization=args["gpu_memory_utilization"],
                    max_model_len=args["max_model_len"],
                    max_num_batched_tokens=args["max_num_batched_tokens"],
                    max_num_seqs=args["max_num_seqs"],
                    block_size=args["block_size"],
                    num_gpu_blocks_override=args["num_gpu_blocks"],
                    enable_chunked_prefill=args["enable_chunked_prefill"],
                    async_scheduling=args["async_scheduling"],
                )
            except InputError as exc:
                raise InputError(f"{self._where()}: {_as_engine_field(str(exc))}") from None
            if self._pool_cache[key].refusal:
                refusal = self._pool_cache.pop(key).refusal
                raise InputError(f"{self._where()}: {refusal}")
        return self._pool_cache[key]

    def settings(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every engine argument in force: vLLM's device defaults filled in, pool sized."""
        from kvpressure.simulation.scenario import check_pool_memory

        args = self.engine_args(overrides)
        sizing = self.pool(overrides)
        check_pool_memory(sizing.num_gpu_blocks, f"{self._where()}: engine.num_gpu_blocks")
        return {
            **args,
            "max_num_seqs": sizing.max_num_seqs,
            "max_num_batched_tokens": sizing.max_num_batched_tokens,
            "max_model_len": sizing.max_model_len,
            "block_size": sizing.block_size,
            "num_gpu_blocks": sizing.num_gpu_blocks,
        }

    # --- variants ------------------------------------------------------------------------------
    def variants(self, include_remedies: bool = False) -> dict[str, dict[str, Any]]:
        """The comparison's variants as ``{name: overrides}``, baseline (no override) first;
        with ``include_remedies`` the remedies' values follow. A value equal to the baseline's
        is not repeated."""
        out: dict[str, dict[str, Any]] = {"baseline": {}}
        base = self.settings()
        groups = ([self.config.comparison] if self.config.comparison else [])
        if include_remedies:
            groups += list(self.config.remedies)
        for cmp in groups:
            for value in cmp.values:
                if base.get(cmp.parameter) == value:
                    continue
                name = f"{cmp.parameter}={_fmt(value)}"
                out.setdefault(name, {cmp.parameter: value})
        return out

    def remedies(self) -> dict[str, dict[str, Any]]:
        """The remedies alone, as ``{name: overrides}``."""
        base = self.settings()
        out: dict[str, dict[str, Any]] = {}
        for cmp in self.config.remedies:
            for value in cmp.values:
                if base.get(cmp.parameter) != value:
                    out[f"{cmp.parameter}={_fmt(value)}"] = {cmp.parameter: value}
        return out

    # --- points --------------------------------------------------------------------------------
    def build_point(self, concurrency: int | None = None, request_rate: float | None = None,
                    overrides: dict[str, Any] | None = None) -> tuple[Any, StepCostModel]:
        """``(Scenario, StepCostModel)`` of one point. Without a level, the focus level."""
        point = self.point(concurrency=concurrency, request_rate=request_rate,
                           overrides=overrides)
        return point.scenario, point.cost_model

    def point(self, concurrency: int | None = None, request_rate: float | None = None,
              overrides: dict[str, Any] | None = None, variant: str | None = None, *,
              seed: int | None = None, with_recorder: bool = True) -> Point:
        """Everything one simulation point needs, the Prometheus recorder included (None with
        ``with_recorder=False``: the simulation then runs at full speed). ``seed`` replaces the
        workload seed (a repeat of the point with another request set)."""
        from kvpressure.simulation.prom_view import PromRecorder
        from kvpressure.simulation.scenario import load_scenario

        seed = self.seed if seed is None else int(seed)
        if self.mode == "closed":
            if request_rate is not None:
                raise InputError(f"{self._where()}: a closed-loop experiment takes a concurrency"
                                 ", not a request rate")
            if concurrency is None:
                concurrency = self.config.focus.concurrency or self.concurrencies[-1]
            if concurrency < 1:
                raise InputError(f"concurrency must be >= 1, got {concurrency}")
            requests = [dict(r) for r in self.requests_for_seed(seed)]
            mode = {"type": "closed", "concurrency": int(concurrency)}
            level = f"c{concurrency}"
        else:
            if concurrency is not None:
                raise InputError(f"{self._where()}: an open-loop experiment takes a request "
                                 "rate, not a concurrency")
            if request_rate is None and self.request_rates:
                request_rate = self.config.focus.request_rate or self.request_rates[-1]
            if request_rate is not None and not request_rate > 0:
                raise InputError(f"request rate must be > 0, got {request_rate}")
            requests = self.requests_at_rate(request_rate, seed)
            mode = {"type": "open"}
            level = (f"rate{_fmt(request_rate)}" if request_rate is not None
                     else "staged" if self.config.workload.stages else "trace")
        settings = self.settings(overrides)
        mml = settings["max_model_len"]
        # vLLM refuses a prompt that does not fit max_model_len; it never reaches the scheduler.
        kept = [r for r in requests if r["prompt_len"] < mml]
        refused = len(requests) - len(kept)
        if not kept:
            raise InputError(f"{self._where()}: every prompt is longer than max_model_len {mml}")
        groups = {}
        for r in kept:
            g = r.get("prefix_group")
            if g is not None:
                groups.setdefault(g, {"length": r.get("prefix_len", 0)})
        variant = variant or ("baseline" if not overrides else
                              ",".join(f"{k}={_fmt(v)}" for k, v in sorted(overrides.items())))
        scenario_dict: dict[str, Any] = {
            "name": f"{self.name}/{variant}/{level}",
            "description": self.description,
            "seed": seed,
            "mode": mode,
            "settings": {ENGINE_ARGS[k]: v for k, v in settings.items()
                         if ENGINE_ARGS.get(k) is not None and v is not None},
            "prefix_groups": groups,
            "requests": kept,
        }
        if refused:
            scenario_dict["refused_requests"] = refused
        scenario = load_scenario(scenario_dict)
        span = max((float(r.get("arrival_time_s") or 0.0) for r in kept), default=0.0)
        interval = self.config.scrape_interval_s
        if with_recorder and not span / interval <= MAX_SCRAPES:
            raise InputError(
                f"{self._where()}: the requests arrive over {span:.3g} s of simulated time, "
                f"{span / interval:.3g} scrapes at scrape_interval_s {interval:g} (at most "
                f"{MAX_SCRAPES:,}); raise the request rate or scrape_interval_s")
        cost_model = self.cost_model
        if not with_recorder:
            return Point(scenario, cost_model, None, variant, mode.get("concurrency"),
                         request_rate if self.mode == "open" else None, settings)
        recorder = PromRecorder(
            self.model_name,
            scrape_interval_s=self.config.scrape_interval_s,
            max_model_len=mml,
            cache_config={
                "block_size": settings["block_size"],
                "enable_prefix_caching": settings["enable_prefix_caching"],
                "gpu_memory_utilization": settings["gpu_memory_utilization"],
                "num_gpu_blocks": settings["num_gpu_blocks"],
                "num_gpu_blocks_override": self.engine_args(overrides)["num_gpu_blocks"],
            },
        )
        return Point(scenario, cost_model, recorder, variant, mode.get("concurrency"),
                     request_rate if self.mode == "open" else None, settings)


def repeat_seeds(seed: int, n: int) -> list[int]:
    """``n`` workload seeds: ``seed`` itself, then one derived from ``(seed, k)`` for each
    repeat k = 1 .. n-1 (``numpy.random.SeedSequence([seed, k])``), so the repeats are fixed by
    the experiment's seed and independent of each other and of it."""
    if n < 1:
        raise InputError(f"seeds: need at least 1, got {n}")
    if seed < 0:
        raise InputError(f"workload.seed: must be >= 0 to derive repeat seeds, got {seed}")
    out = [int(seed)]
    for k in range(1, n):
        out.append(int(np.random.SeedSequence([int(seed), k]).generate_state(1, np.uint32)[0]))
    return out


def _as_engine_field(message: str) -> str:
    """A pool refusal naming a sizing parameter (``block_size: ...``) as the experiment's field
    (``field 'engine.block_size': ...``)."""
    name, sep, rest = message.partition(":")
    name = {"num_gpu_blocks_override": "num_gpu_blocks"}.get(name, name)
    if sep and name in ENGINE_ARGS:
        return f"field 'engine.{name}':{rest}"
    if sep and name == "tensor_parallel_size":
        return f"field 'tensor_parallel_size':{rest}"
    return message


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:g}"
    return str(value)


def load_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Read and validate an experiment YAML; a bare name means ``data/experiments/<name>.yaml``.
    Errors name the file and the field."""
    text_path = str(path)
    p = Path(text_path)
    # A folder of the same name (the run folder ``--out ci_small`` made) is no experiment.
    if not p.is_file() and not text_path.endswith((".yaml", ".yml")):
        p = data_dir() / "experiments" / f"{text_path}.yaml"
    if not p.is_file():
        raise InputError(f"{path}: experiment file not found")
    text = read_user_text(p, "experiment file")
    return experiment_from_dict(parse_user_yaml(text, p), p, text)


def experiment_from_dict(data: Any, path: Path | None = None, text: str | None = None
                         ) -> Experiment:
    where = str(path) if path else "experiment"
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of fields at the top level")
    try:
        config = ExperimentFile.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, where) from None
    return Experiment(config, path, text)


def list_experiments() -> list[str]:
    return sorted(p.stem for p in (data_dir() / "experiments").glob("*.yaml"))
