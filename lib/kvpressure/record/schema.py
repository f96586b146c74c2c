"""The record of one investigation (docs/interfaces.md#record-yaml), as a pydantic schema.

The seed's fields keep their names (``scheduler``, ``counters``, ``workload``, ``perf``,
``status``); what the kit adds (provenance, evidence, remedies, recompute ranges) sits beside them
so that a reader who knows the seed's form finds every field where it expects it. Every field is
required and may not be empty. A measured value the data cannot give (engine counters when only
bench results were given, ``max_num_seqs`` when the metrics do not carry it, a knee from one
level) is null, never zero, and ``missing`` names it with the reason; a null without a reason, or
a reason for a field that has a value, is refused.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]

# The three outcomes the seed's record allows, in the kit's wording.
STATUS_KV_BOUND = "bound by KV blocks"
STATUS_LENGTH_BOUND = "bound by single-sequence length"
STATUS_NOT_ESTABLISHED = "not established"
Status = Literal["bound by KV blocks", "bound by single-sequence length", "not established"]


class _Strict(BaseModel):
    # extra="forbid": a misspelt field is an error, not a silently dropped value.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class Scheduler(_Strict):
    policy: NonEmptyStr | None
    max_num_seqs: Annotated[int, Field(ge=1)] | None
    max_num_seqs_effective: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = Field(
        description="sequences actually running at once (max of vllm:num_requests_running)"
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | None
    preemption_mode: Literal["recompute"]
    num_gpu_blocks: Annotated[int, Field(ge=1)] | None
    block_size: Annotated[int, Field(ge=1)] | None
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None
    async_scheduling: bool | None = Field(
        default=None, description="the engine core schedules one step ahead (vLLM 0.33.0's "
        "default on CUDA); null: the data does not say")


PositiveRate = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
LevelAxis = Literal["concurrency", "request_rate"]
# The fields a request-rate sweep adds; a closed-loop record leaves them out of record.yaml.
RATE_FIELDS = {"counters": {"window": ("request_rate",)},
               "workload": ("level_axis", "request_rate", "request_rates", "max_concurrency"),
               "perf": ("throughput_by_request_rate",)}


class Window(_Strict):
    """Where the counters were read: one measured point and its time span."""

    run: NonEmptyStr
    concurrency: Annotated[int, Field(ge=1)] | None
    request_rate: PositiveRate | None = Field(
        default=None, description="the point's offered load (requests/s) on a request-rate "
        "sweep; left out on a concurrency sweep")
    start_s: NonNegative
    end_s: NonNegative
    gauges_start_s: NonNegative = Field(
        description="gauges are means over [gauges_start_s, gauges_end_s]: the steady part of "
        "the load inside the window (ramp-up, drain and idle seconds left out), or the window")
    gauges_end_s: NonNegative
    snapshot: bool = Field(
        default=False,
        description="one scrape: gauges at that instant (start_s = end_s), counters since the "
        "server started")

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.snapshot and self.end_s != self.start_s:
            raise ValueError("a snapshot window is one instant: end_s must equal start_s")
        if not self.snapshot and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class Counters(_Strict):
    """Engine metrics over the window. Gauges are window means; counters are increases."""

    window: Window
    num_requests_running: NonNegative | None
    num_requests_waiting: NonNegative | None
    waiting_capacity: NonNegative | None
    waiting_deferred: NonNegative | None
    kv_cache_usage_perc: Fraction | None
    num_preemptions_total: NonNegative | None
    recomputed_tokens: NonNegative | None
    recompute_ratio: Fraction | None
    recomputed_tokens_range: tuple[NonNegative, NonNegative] | None
    recompute_ratio_range: tuple[Fraction, Fraction] | None
    recompute_exact: bool = Field(description="true for simulation; ingested data gives a range")

    @model_validator(mode="after")
    def _ranges_hold_value(self) -> Counters:
        for name, value, bounds in (
            ("recomputed_tokens", self.recomputed_tokens, self.recomputed_tokens_range),
            ("recompute_ratio", self.recompute_ratio, self.recompute_ratio_range),
        ):
            if value is None or bounds is None:
                continue
            low, high = bounds
            if not (low <= value <= high) and not math.isclose(value, low) and not math.isclose(
                value, high
            ):
                raise ValueError(f"{name} {value} lies outside its range [{low}, {high}]")
        return self


class LengthDistribution(_Strict):
    description: NonEmptyStr
    mean: NonNegative | None
    p50: NonNegative | None
    p95: NonNegative | None
    max: NonNegative | None
    source: NonEmptyStr = Field(description="where the numbers come from")


class Workload(_Strict):
    model_name: NonEmptyStr
    concurrency: Annotated[int, Field(ge=1)] | None = Field(
        description="the point the counters describe")
    concurrency_levels: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] | None
    num_requests: Annotated[int, Field(ge=0)] | None
    input_len_distribution: LengthDistribution
    output_len_distribution: LengthDistribution
    level_axis: LevelAxis = Field(
        default="concurrency", description="what the sweep's levels are: closed-loop clients "
        "(concurrency) or offered load in requests/s (request_rate: an open loop, or one "
        "capped at max_concurrency requests in flight); left out when concurrency")
    request_rate: PositiveRate | None = Field(
        default=None, description="the point the counters describe, on a request-rate sweep")
    request_rates: Annotated[list[PositiveRate], Field(min_length=1)] | None = None
    max_concurrency: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="the cap on requests in flight of a request-rate sweep; "
        "null: an open loop")

    @model_validator(mode="after")
    def _one_axis(self) -> Workload:
        if self.level_axis == "request_rate" and (self.concurrency is not None
                                                  or self.concurrency_levels is not None):
            raise ValueError("a request-rate sweep gives request_rate and request_rates, not "
                             "concurrency levels")
        if self.level_axis == "concurrency" and (self.request_rate is not None
                                                 or self.request_rates is not None):
            raise ValueError("a concurrency sweep gives no request rates (set level_axis: "
                             "request_rate)")
        return self


class ThroughputPoint(_Strict):
    """One level of the curve: means over the workload seeds (or repeated runs) when the level
    was run more than once."""

    concurrency: Annotated[int, Field(ge=1)]
    output_throughput: NonNegative
    itl_mean_s: NonNegative | None
    itl_p95_s: NonNegative | None
    ttft_p95_s: NonNegative | None
    preemptions: NonNegative | None
    recompute_ratio: Fraction | None


class RatePoint(_Strict):
    """One level of a request-rate curve: means over the workload seeds when repeated."""

    request_rate: PositiveRate
    output_throughput: NonNegative
    itl_mean_s: NonNegative | None
    itl_p95_s: NonNegative | None
    ttft_p95_s: NonNegative | None
    preemptions: NonNegative | None
    recompute_ratio: Fraction | None


class Knee(_Strict):
    knee_x: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        description="null when throughput still rises at the largest level"
    )
    peak_x: Annotated[float, Field(allow_inf_nan=False)]
    peak_y: NonNegative
    plateau: bool
    sustained_to: Annotated[float, Field(allow_inf_nan=False)] = Field(
        description="largest level still within the plateau band of the peak (the largest level "
                    "swept when the curve never turns down)"
    )
    declines: bool
    decline_pct: Annotated[float, Field(allow_inf_nan=False)]
    same_schedule_from: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        default=None,
        description="the smallest level from which every larger level ran the same schedule "
                    "(the waiting queue never empties: more clients only queue longer); null "
                    "when the levels all differ")


class LatencyFidelity(_Strict):
    """How far the simulated latencies of a hardware profile held against real vLLM servers
    (``benchmarks/bench_sim_to_real.py``, stages the profile was not fitted on)."""

    hardware: NonEmptyStr
    checked: bool = Field(description="real vLLM servers on this card were simulated and "
                                      "compared; false: the latencies are roofline estimates")
    held_out_stages: Count
    held_out_runs: Count
    calibrated: bool = Field(description="a run on this card was used to choose a value (the "
                                         "calibration split); false: its costs are as published")
    mape_pct: dict[NonEmptyStr, NonNegative] = Field(
        description="mean absolute percentage error per latency on this card's held-out stages")
    checked_cards: dict[NonEmptyStr, dict[NonEmptyStr, NonNegative]] = Field(
        description="the same per card for every card real servers were checked on")
    tail_stages: Count = Field(
        default=0, description="held-out stages the tails' side is counted over: this card's, "
                               "or every checked card's when this one was not checked")
    tail_below_real: dict[NonEmptyStr, Count] = Field(
        default_factory=dict, description="per tail (ttft_p99, e2e_p99): of tail_stages, how "
                                          "many the simulated value was below the real one")
    source: str
    statement: NonEmptyStr = Field(description="the sentence the report prints")


class Perf(_Strict):
    variant: NonEmptyStr
    throughput_by_concurrency: Annotated[list[ThroughputPoint], Field(min_length=1)] | None
    knee: Knee | None = Field(description="null when too few levels were measured for a knee")
    itl_mean: NonNegative | None = Field(description="seconds, at workload.concurrency")
    itl_p95: NonNegative | None
    ttft_p95: NonNegative | None
    throughput_by_request_rate: Annotated[list[RatePoint], Field(min_length=1)] | None = Field(
        default=None, description="the request-rate curve (workload.level_axis request_rate), "
        "knee included; left out on a concurrency sweep")
    latency_fidelity: LatencyFidelity | None = Field(
        default=None, description="simulated data: how far the hardware profile's latencies "
        "held against real servers; null for measured data")

    @model_validator(mode="after")
    def _sorted_unique(self) -> Perf:
        xs = [p.concurrency for p in self.throughput_by_concurrency or []]
        if xs != sorted(set(xs)):
            raise ValueError(f"concurrency levels must be increasing and unique, got {xs}")
        rs = [p.request_rate for p in self.throughput_by_request_rate or []]
        if rs != sorted(set(rs)):
            raise ValueError(f"request rates must be increasing and unique, got {rs}")
        return self


class Check(_Strict):
    """One line of evidence: a symptom, what was observed, and whether it holds."""

    name: NonEmptyStr
    holds: bool | None = Field(description="null when the data could not judge the symptom "
                                           "('missing' says why); false means it is absent")
    observed: NonEmptyStr
    metric: NonEmptyStr


class Comparison(_Strict):
    """The single-variable control: one parameter changed, the knee compared."""

    parameter: NonEmptyStr
    baseline: NonEmptyStr
    variants: Annotated[list[NonEmptyStr], Field(min_length=1)]
    knee_shift: Annotated[float, Field(allow_inf_nan=False)]
    sustained_shift: Annotated[float, Field(allow_inf_nan=False)] = Field(
        description="shift of the end of the sustained range (a curve that holds to the largest "
                    "level counts one level step past it)"
    )
    beyond_noise: bool = Field(description="the knee or the sustained range moved right beyond "
                                           "run-to-run noise")
    noise: NonEmptyStr = Field(description="how run-to-run noise was judged")
    summary: NonEmptyStr


class Remedy(_Strict):
    parameter: NonEmptyStr
    change: NonEmptyStr
    effect: NonEmptyStr
    cost: NonEmptyStr


class Evidence(_Strict):
    checks: Annotated[list[Check], Field(min_length=1)]
    comparison: Comparison | None = Field(
        description="null only when the data holds no controlled comparison (ingested scrapes)"
    )
    interference: NonEmptyStr
    reasons: Annotated[list[NonEmptyStr], Field(min_length=1)]


class InputFile(_Strict):
    path: NonEmptyStr
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Provenance(_Strict):
    kit_version: NonEmptyStr
    vllm_behaviour_version: NonEmptyStr
    mode: Literal["simulation", "ingested"]
    inputs: Annotated[list[InputFile], Field(min_length=1)]
    seed: int | None = Field(description="the workload seed; null only for ingested data")
    vllm_version_served: NonEmptyStr | None = Field(
        default=None,
        description="the vLLM version that served ingested data, when the data says (a server "
                    "log's start-up lines, the server's /version); null for a simulation and "
                    "when unknown")
    seeds: Annotated[list[int], Field(min_length=1)] | None = Field(
        description="every workload seed the sweep ran with, ``seed`` first (the repeats that "
                    "give the run-to-run noise); null only for ingested data"
    )
    platform: NonEmptyStr | None = Field(
        default=None,
        description="the device the data's server ran on (cuda, cpu...) when the data says (a "
                    "server log's engine configuration), or the hardware profile simulated; "
                    "null when unknown")
    load_tool: NonEmptyStr | None = Field(
        default=None,
        description="what produced the load (vllm bench serve, GuideLLM, AIPerf, kvpressure "
                    "collect, the simulation's clients); null when the data does not say")
    engine_args_from: dict[str, str] = Field(
        default_factory=dict,
        description="where each engine setting of the investigation came from (the experiment, "
                    "vllm:cache_config_info, the server log, the engine arguments given)")

    @model_validator(mode="after")
    def _seed_for_simulation(self) -> Provenance:
        if self.mode == "simulation" and (self.seed is None or self.seeds is None):
            raise ValueError("seed and seeds are required for a simulated investigation")
        if self.seeds is not None and self.seeds[0] != self.seed:
            raise ValueError(f"seeds must start with seed {self.seed}, got {self.seeds[0]}")
        return self


# Nulls with a meaning of their own, not missing measurements.
_MEANINGFUL_NULLS = frozenset({"perf.knee.knee_x", "perf.knee.same_schedule_from",
                               "counters.window.request_rate", "workload.request_rate",
                               "workload.request_rates", "workload.max_concurrency",
                               "perf.throughput_by_request_rate",
                               "provenance.vllm_version_served", "provenance.seed",
                               "provenance.platform", "provenance.load_tool",
                               "provenance.seeds", "evidence.comparison",
                               "scheduler.async_scheduling", "perf.latency_fidelity"})


# The closed loop's level fields, empty by design on a request-rate sweep.
_CONCURRENCY_FIELDS = frozenset({"counters.window.concurrency", "workload.concurrency",
                                 "workload.concurrency_levels", "perf.throughput_by_concurrency"})


# Lists whose items each have a reason of their own for a null: their paths carry the index.
_INDEXED_LISTS = frozenset({"evidence.checks"})


def check_path(index: int) -> str:
    """The ``missing`` key of the ``index``-th check's ``holds`` (each check has its own reason)."""
    return f"evidence.checks[{index}].holds"


def null_fields(node: object, path: str = "") -> set[str]:
    """Dotted paths of the null measurements in a dumped record (list items as ``[*]``, or
    ``[i]`` in the lists whose items each have their own reason: the checks)."""
    out: set[str] = set()
    if not path and isinstance(node, dict) and (
            (node.get("workload") or {}).get("level_axis") == "request_rate"):
        # A request-rate sweep has no client counts: its levels are the request rates.
        return {p for p in null_fields({**node, "workload": {**node["workload"],
                                                             "level_axis": "-"}})
                if p not in _CONCURRENCY_FIELDS}
    if node is None:
        return {path} if path not in _MEANINGFUL_NULLS else set()
    if isinstance(node, dict):
        for k, v in node.items():
            if path or k != "missing":
                out |= null_fields(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            out |= null_fields(v, f"{path}[{i if path in _INDEXED_LISTS else '*'}]")
    return out


class Record(_Strict):
    scheduler: Scheduler
    counters: Counters
    workload: Workload
    perf: Perf
    status: Status
    evidence: Evidence
    remedies: list[Remedy]
    provenance: Provenance
    missing: dict[NonEmptyStr, NonEmptyStr] = Field(
        default_factory=dict,
        description="each null measurement (dotted path, list items as [*], a check as "
                    "evidence.checks[i].holds) and why the data could not give it; empty (and left out of record.yaml) when nothing is",
    )

    @model_validator(mode="after")
    def _nulls_are_explained(self) -> Record:
        nulls = null_fields(self.model_dump(mode="python"))
        unexplained = sorted(nulls - set(self.missing))
        if unexplained:
            raise ValueError(f"{', '.join(unexplained)}: null without a reason in 'missing'")
        stale = sorted(set(self.missing) - nulls)
        if stale:
            raise ValueError(f"missing names {', '.join(stale)}, which has a value")
        return self

    @model_validator(mode="after")
    def _complete_for_its_kind(self) -> Record:
        if self.provenance.mode == "simulation" and self.evidence.comparison is None:
            raise ValueError("evidence.comparison is required for a simulated investigation")
        if self.status != STATUS_NOT_ESTABLISHED and not self.remedies:
            raise ValueError(f"remedies may not be empty when status is {self.status!r}")
        return self
