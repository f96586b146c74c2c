"""The result of each stage, as ``analysis/<stage>.json`` holds it.

One type a stage: :class:`CollectInfo` (01), :class:`RecomputeResult` (02), :class:`KneeResult`
(03), :class:`ComparisonResult` (04), :class:`InterferenceResult` (05) and
:class:`VerdictResult` (06: symptoms, status, remedies). Simulated and ingested collection give
the same :class:`CollectInfo`; what one of them cannot know is an explicit default (``None``,
``False``, an empty list), never an absent key to probe for.

A file holds only the fields its producer set (``exclude_unset``), so the JSON of a simulated
run keeps no ingestion-only keys and the files stay byte for byte what they were before the
types existed. Measured values are ``Number`` (``float | int``): an integer count stays an
integer in the file instead of gaining a ``.0``. Detail a stage only passes through for people
to read (an analysis' evidence, its bootstrap report) stays a mapping. A part the analysis
and a stage share (the knee of a curve) is defined here once: the analysis returns it and the
stage holds it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvpressure.record.schema import LatencyFidelity

Number = float | int
LevelAxis = Literal["concurrency", "request_rate"]
"""What a sweep's levels are: closed-loop clients (``concurrency``) or offered load in
requests/s (``request_rate``: an open loop, or one with a concurrency cap)."""


class _Part(BaseModel):
    """A part of a stage's result: unknown keys are refused, so a renamed field fails loudly."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StageResult(_Part):
    """What one stage writes to ``analysis/<STAGE>.json``."""

    STAGE: ClassVar[str]
    NOTEBOOK: ClassVar[str]
    """The notebook that writes it (named when the file is missing)."""


# --------------------------------------------------------------------------- 01 collect
class InputFile(_Part):
    path: str
    sha256: str


class LengthStats(_Part):
    """A length distribution (prompt or output tokens) and where it was measured."""

    description: str
    mean: Number | None = None
    p50: Number | None = None
    p95: Number | None = None
    max: Number | None = None
    source: str


class _Windowed(_Part):
    """Counters over ``t0``-``t1``; gauges over ``gauge_t0``-``gauge_t1`` when those are given
    (the load's steady part), else over the counters' window."""

    t0: Number | None
    t1: Number | None
    gauge_t0: Number | None = None
    gauge_t1: Number | None = None

    @property
    def window(self) -> tuple[Number | None, Number | None]:
        return self.t0, self.t1

    @property
    def gauge_window(self) -> tuple[Number | None, Number | None]:
        if "gauge_t0" not in self.model_fields_set:
            return self.window
        return self.gauge_t0, self.gauge_t1


class Focus(_Windowed):
    """The point whose counters the investigation reads, and over which window."""

    variant: str
    concurrency: int | None
    run: str
    why: str
    request_rate: Number | None = None
    """The focus level's offered load (requests/s) on a request-rate sweep."""
    point_dir: str | None = None
    """The point folder of a simulated sweep (steps.csv, requests.csv); None for ingested data."""
    counter_origin: str = "first"
    """"zero": the window starts with the server process, its counters count from zero."""

    @property
    def level(self) -> Number | None:
        """The focus level on the sweep's axis (a request rate, else a concurrency)."""
        return self.request_rate if self.request_rate is not None else self.concurrency


class Load(_Part):
    """What was told about the load of ingested data (a simulation has none of it)."""

    idle: bool | None = None
    snapshot: bool = False
    notes: list[str] = Field(default_factory=list)


class IncompleteLevel(_Part):
    """A level ``kvpressure collect`` measured only in part (left off the curve)."""

    concurrency: Number | None
    completed: Number | None
    failed: Number | None
    reason: str
    source: str


class CollectInfo(StageResult):
    """Stage 01: what was read or simulated, the focus point and its window."""

    STAGE: ClassVar[str] = "collect"
    NOTEBOOK: ClassVar[str] = "01_collect"

    mode: Literal["simulation", "ingested"]
    name: str
    description: str
    inputs: list[InputFile]
    seed: int | None
    seeds: list[int] | None
    model_name: str
    baseline_variant: str
    variants: list[str]
    variant_settings: dict[str, dict[str, Any]]
    comparison_parameter: str | None
    comparison_variants: list[str]
    concurrency_levels: list[int]
    settings: dict[str, Any]
    """Engine arguments with vLLM's names (the pool geometry from vllm:cache_config_info)."""
    num_requests: int | None
    input_len_distribution: LengthStats
    output_len_distribution: LengthStats
    focus: Focus
    # What only ingested data can lack or tell; a simulation has every engine metric.
    engine_metrics: bool = True
    bench_results: bool = False
    scrapes: bool = True
    matched: str | None = None
    """How runs were matched with their metrics (ingested data)."""
    bench_timezone: str | None = None
    incomplete_levels: list[IncompleteLevel] = Field(default_factory=list)
    load: Load = Field(default_factory=Load)
    server_version: str | None = None
    """The vLLM version that served ingested data, when the data says (a server log, the
    server's /version); None for a simulation."""
    server_version_from: str | None = None
    server_platform: str | None = None
    """The device the data's server ran on (cuda, cpu...), when the data says; for a simulation,
    the hardware profile simulated."""
    server_platform_from: str | None = None
    load_tool: str | None = None
    """What produced the load (vllm bench serve, GuideLLM, AIPerf, kvpressure collect, the
    simulation's own clients); None when the data does not say (scrapes alone)."""
    settings_from: dict[str, str] = Field(default_factory=dict)
    """Where each of ``settings`` came from (the experiment, vllm:cache_config_info, the server
    log's start-up arguments, the engine arguments given)."""
    latency_fidelity: LatencyFidelity | None = None
    """A simulation's: how far its hardware profile's latencies held against real servers."""
    level_axis: LevelAxis = "concurrency"
    request_rates: list[Number] = Field(default_factory=list)
    """The swept request rates (requests/s) when ``level_axis`` is ``request_rate``."""
    max_concurrency: int | None = None
    """The concurrency cap a request-rate sweep ran under (None: an open loop)."""

    @property
    def simulated(self) -> bool:
        return self.mode == "simulation"

    @property
    def levels(self) -> list[Number]:
        """The swept levels on the sweep's axis."""
        if self.level_axis == "request_rate":
            return list(self.request_rates)
        return list(self.concurrency_levels)


# --------------------------------------------------------------------------- 02 recompute
class Window(_Windowed):
    """A stage's window at the focus point."""

    run: str
    concurrency: int | None
    request_rate: Number | None = None


class RecomputeResult(StageResult):
    """Stage 02: counters over the focus window, the waiting split, the recompute ratio (exact
    from steps, or a range from counters); every counter None without engine metrics."""

    STAGE: ClassVar[str] = "recompute"
    NOTEBOOK: ClassVar[str] = "02_recompute"

    window: Window
    max_num_seqs: Number | None
    available: bool
    exact: bool
    missing: str | None = None
    """Why nothing was measured (``available`` False)."""
    running_mean: Number | None
    running_max: Number | None
    waiting_mean: Number | None
    waiting_capacity_mean: Number | None
    waiting_deferred_mean: Number | None
    frac_waiting: Number | None
    frac_silent: Number | None
    kv_usage_mean: Number | None
    preemptions: Number | None
    recomputed_tokens: Number | None
    recomputed_tokens_low: Number | None
    recomputed_tokens_high: Number | None
    recompute_ratio: Number | None
    recompute_ratio_low: Number | None
    recompute_ratio_high: Number | None
    recompute_time_share: Number | None
    waiting: dict[str, Any]
    """The waiting analysis in full (``analysis.waiting``)."""
    recompute: dict[str, Any]
    """The recompute measurement in full: exact counts, or the estimate with its method."""


# --------------------------------------------------------------------------- 03 knee
class CurvePoint(_Part):
    """One level of a curve as the knee reads it: the mean of its measurements (``y``), how
    many there were (``n``) and their standard deviation (``sd``, None for one)."""

    x: float
    y: float
    n: int
    sd: float | None


class ThroughputKnee(_Part):
    """Knee, peak, plateau, sustained range and decline of a throughput curve
    (``analysis.knee.find_knee``; the method is in its module). Every field is given by the
    analysis, so a file holds each one, known or None."""

    knee_x: float | None
    """Where added load stops paying; None on a curve still rising or too short for a knee."""
    peak_x: float
    peak_y: float
    plateau: tuple[float, float]
    declines: bool
    decline_pct: float
    points: list[CurvePoint]
    method: str
    knee_kneedle: float | None
    knee_broken_stick: float | None
    noise_sd: float | None
    noise_source: str
    still_rising: bool
    sustained_end: float | None
    decline_onset: float | None
    plateau_band: float | None
    notes: list[str]
    same_schedule_from: float | None
    """The smallest level from which every larger level ran the same schedule
    (``analysis.knee.same_schedule_from``); None when the levels all differ."""


class LatencyPoint(_Part):
    x: float
    y: float


class LatencyKnee(_Part):
    """Where a latency curve against offered load turns up (``analysis.knee.latency_knee``):
    ``knee_x`` the last level within ``factor`` times the latency at the lightest load
    (``base``; ``limit`` the product), ``turn_x`` the next one."""

    knee_x: float | None
    turn_x: float | None
    base: float
    factor: float
    limit: float
    points: list[LatencyPoint]


class CurveLevel(_Part):
    """One level of stage 03's curve: the mean over the repeats of each curve column
    (``investigation.stages.CURVE_COLUMNS``) the data has, the repeats and the throughput's
    spread. A column the data lacks is absent from the file (None here)."""

    concurrency: Number | None = None
    request_rate: Number | None = None
    output_throughput: Number | None = None
    itl_mean_s: Number | None = None
    itl_p95_s: Number | None = None
    itl_p99_s: Number | None = None
    ttft_p95_s: Number | None = None
    preemptions: Number | None = None
    recompute_ratio: Number | None = None
    recompute_ratio_low: Number | None = None
    recompute_ratio_high: Number | None = None
    mean_running: Number | None = None
    mean_kv_usage: Number | None = None
    repeats: int | None = None
    output_throughput_sd: Number | None = None
    output_throughput_min: Number | None = None
    output_throughput_max: Number | None = None

    def level(self, x: LevelAxis) -> Number | None:
        """The level on the sweep's axis ``x``."""
        return self.request_rate if x == "request_rate" else self.concurrency


class KneeResult(StageResult):
    """Stage 03: the baseline curve (level means over repeats), its knee and the latencies at
    the focus level."""

    STAGE: ClassVar[str] = "knee"
    NOTEBOOK: ClassVar[str] = "03_knee"

    variant: str
    repeats: int
    available: bool
    why_not: str | None
    levels: int
    knee: ThroughputKnee | None
    curve: list[CurveLevel]
    focus_concurrency: int | None
    focus_request_rate: Number | None = None
    x: LevelAxis = "concurrency"
    """The curve's level column (``request_rate`` on a request-rate sweep)."""
    latency_knees: dict[str, LatencyKnee | None] | None = None
    """On a request-rate sweep, per latency column (TTFT p95, ITL p95) where it turns up
    against offered load (None with too few levels)."""
    itl_mean_s: Number | None
    itl_p95_s: Number | None
    ttft_p95_s: Number | None
    itl_p99_s: Number | None = None
    """Set only when the runs give ITL p99 and no p95 (``itl_tail_note`` says so)."""
    itl_tail_note: str | None = None


# --------------------------------------------------------------------------- 04 compare
SettingValue = bool | int | float | str | None
"""One engine argument's value as a comparison names it (``max_num_seqs`` 64, ``policy``
"fcfs", ``scheduler_reserve_full_isl`` True)."""


class VariantKnee(_Part):
    """One variant's curve in a comparison: its knee and sustained range, each with its
    bootstrap range (5th-95th percentile; past the range = one level step past the largest
    level), its peak and its noise (``analysis.compare``)."""

    variant: str
    settings: dict[str, SettingValue]
    knee_x: float | None
    peak_x: float
    peak_y: float
    declines: bool
    decline_pct: float
    knee_range: tuple[float, float]
    levels: int
    points: list[CurvePoint]
    sustained_end: float | None
    """Last level held within the plateau band of the peak."""
    decline_onset: float | None
    """First level of the decline after ``sustained_end``; None when the curve holds to its
    largest level."""
    sustained_range: tuple[float, float] | None
    repeats: int
    noise_sd: float | None
    noise_source: str


class KneeShift(_Part):
    """How far one variant's knee and sustained range moved from the baseline's, and whether
    beyond noise."""

    variant: str
    value: SettingValue
    baseline_value: SettingValue
    change: str | None
    """"lower" / "higher" for a number, "A -> B" otherwise."""
    knee_x: float | None
    baseline_knee_x: float | None
    shift: float
    knee_beyond_noise: bool
    sustained_end: float | None
    baseline_sustained_end: float | None
    decline_onset: float | None
    baseline_decline_onset: float | None
    sustained_shift: float
    sustained_beyond_noise: bool
    moves_right: bool
    moved_right_by: list[str]
    """What moved right beyond noise: "knee", "sustained range"."""
    beyond_noise: bool
    peak_gain_pct: float | None
    """The peak's change in percent (None when the baseline's peak is 0)."""


class KneeComparison(_Part):
    """A single-variable comparison (``analysis.compare.compare_variants``): each variant's
    knee, the baseline first, and how each moved."""

    parameter: str
    baseline: str
    baseline_value: SettingValue
    variants: list[VariantKnee]
    shifts: list[KneeShift]
    knee_moves_right: bool
    beyond_noise: bool
    noise_method: str
    notes: list[str]


class ComparisonResult(StageResult):
    """Stage 04: the single-variable comparison (a :class:`KneeComparison`'s fields, its
    summary and verdict); only ``available``, ``parameter`` and ``summary`` when the data holds
    none."""

    STAGE: ClassVar[str] = "compare"
    NOTEBOOK: ClassVar[str] = "04_compare"

    available: bool
    parameter: str | None
    summary: str
    baseline: str | None = None
    baseline_value: SettingValue = None
    variants: list[VariantKnee] = Field(default_factory=list)
    """The baseline first."""
    shifts: list[KneeShift] = Field(default_factory=list)
    knee_moves_right: bool = False
    beyond_noise: bool = False
    moved_right_beyond_noise: bool = False
    noise_method: str | None = None
    notes: list[str] = Field(default_factory=list)
    variant_names: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- 05 interference
class NoEvidence(_Part):
    """Nothing measured for this part (``{}`` in the file): no steps or intervals in the
    window, or no metric to judge it on."""


class StepThresholds(_Part):
    """The thresholds of the judgement from simulated steps (``analysis.interference``)."""

    spike_factor: float
    kv_full: float
    min_spike_share: float
    min_itl_share: float
    recompute_ratio: float
    long_prefill_tokens: int | None = None
    """Absent when the window holds no step (no largest step to take half of)."""


class SeriesThresholds(_Part):
    """The thresholds of the judgement from scrape intervals."""

    spike_factor: float
    burst_factor: float
    kv_full: float
    min_spike_share: float


class StepPrefillEvidence(_Part):
    """Prefill interference from steps: the decode-only step, the ITL tail with and without
    the long-prefill spikes and their share of it, the spike steps."""

    decode_step_s: float | None
    itl_mean_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    itl_p99_without_prefill_spikes_s: float | None
    share_of_itl_p95_excess: float | None
    share_of_itl_p99_excess: float | None
    spike_steps: int
    prefill_spike_steps: int
    prefill_spike_magnitude: float | None
    share_of_slow_itl: float | None
    share_of_all_itl: float | None
    kv_usage_in_prefill_spikes: float | None
    arrivals_in_prefill_spikes: int | None


class SeriesPrefillEvidence(_Part):
    """Prefill interference from scrape intervals: ITL p99 spikes against prompt-token bursts."""

    intervals: int
    itl_p99_median_s: float | None
    spike_intervals: int
    prefill_spike_intervals: int
    share_of_spikes: float | None
    prompt_rate_median: float | None
    itl_p99_in_prefill_spikes_s: float | None


class StepPreemptionEvidence(_Part):
    preemptions: int
    recompute_ratio: float | None
    kv_usage_at_preemption: float | None
    preempt_spike_steps: int
    share_of_slow_itl: float | None


class SeriesPreemptionEvidence(_Part):
    preemptions: float | None
    kv_usage_at_preemption: float | None
    intervals_with_preemptions: int


PrefillEvidence = StepPrefillEvidence | SeriesPrefillEvidence | NoEvidence
PreemptionEvidence = StepPreemptionEvidence | SeriesPreemptionEvidence | NoEvidence
Thresholds = StepThresholds | SeriesThresholds | NoEvidence


class Interference(_Part):
    """Prefill interference and preemption-driven slow steps, judged apart
    (``analysis.interference``): what was found, on what evidence, against which thresholds.
    Every field is given by the analysis, so a file holds each one."""

    source: str
    """"steps" (simulated) or "series" (scrapes)."""
    prefill_interference: bool | None
    preemption: bool | None
    prefill_evidence: PrefillEvidence
    preemption_evidence: PreemptionEvidence
    thresholds: Thresholds
    notes: list[str]


class InterferenceResult(StageResult):
    """Stage 05: an :class:`Interference`'s fields at the focus point and its summary; only
    ``source`` "none", the two verdicts None, notes and summary without engine metrics."""

    STAGE: ClassVar[str] = "interference"
    NOTEBOOK: ClassVar[str] = "05_interference"

    source: str
    """"steps" (simulated), "series" (scrapes) or "none" (no engine metrics)."""
    prefill_interference: bool | None
    preemption: bool | None
    prefill_evidence: PrefillEvidence = Field(default_factory=NoEvidence)
    preemption_evidence: PreemptionEvidence = Field(default_factory=NoEvidence)
    thresholds: Thresholds = Field(default_factory=NoEvidence)
    notes: list[str] = Field(default_factory=list)
    summary: str


# --------------------------------------------------------------------------- 06 verdict
class Symptom(_Part):
    id: str
    name: str
    verdict: Literal["present", "absent", "no data"]
    evidence: dict[str, Any] = Field(default_factory=dict)
    threshold: dict[str, Any] = Field(default_factory=dict)


class Symptoms(_Part):
    """The symptom checklist over the gauge window."""

    window: list[Number | None]
    thresholds: dict[str, Any]
    symptoms: list[Symptom]


class StatusResult(_Part):
    status: str
    rule: str
    confirmed: bool
    evidence: dict[str, Any] = Field(default_factory=dict)
    prefill_interference: bool | None = None
    prefill_evidence: PrefillEvidence = Field(default_factory=NoEvidence)
    """Stage 05's, by which ``prefill_interference`` was judged."""
    findings: list[str] = Field(default_factory=list)


class RemedyRow(_Part):
    parameter: str
    change: str
    effect: str
    cost: str
    remedy: str


class Remedies(_Part):
    """Remedies in the order to try them: simulated (``report`` holds the evaluation) or the
    workflow's table without numbers; the recommendation either way."""

    simulated: bool
    try_first: str | None
    why: str
    rows: list[RemedyRow]
    report: dict[str, Any] | None = None
    recommendation: dict[str, Any] = Field(default_factory=dict)


class VerdictResult(StageResult):
    """Stage 06 (``analysis/record.json``): symptoms, status and remedies."""

    STAGE: ClassVar[str] = "record"
    NOTEBOOK: ClassVar[str] = "06_record"

    symptoms: Symptoms
    status: StatusResult
    remedies: Remedies


@dataclass(frozen=True)
class RunStages:
    """Every stage's result of one investigation: what the record is built from."""

    collect: CollectInfo
    recompute: RecomputeResult
    knee: KneeResult
    compare: ComparisonResult
    interference: InterferenceResult
    verdict: VerdictResult


STAGE_TYPES: tuple[type[StageResult], ...] = (
    CollectInfo, RecomputeResult, KneeResult, ComparisonResult, InterferenceResult,
    VerdictResult,
)
