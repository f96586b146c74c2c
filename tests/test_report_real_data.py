"""``kvpressure report --source`` on the data a real load test leaves behind.

A small simulated sweep is replayed as a real load test would have recorded it (one continuous
scrape log of the server, one ``vllm bench serve`` result per level, dates in the bench
machine's time zone), so every answer is known from the simulation: the per-level counters,
the curve, the recompute ratio and the status. The single-level case is vLLM's own Prometheus
output of a reference run whose true recompute ratio is known (127,201 / 601,608).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.analysis.focus import focus_level
from kvpressure.analysis.knee import find_knee
from kvpressure.analysis.status import KV_BOUND, NOT_ESTABLISHED, decide_status
from kvpressure.analysis.symptoms import check_symptoms
from kvpressure.errors import InputError
from kvpressure.ingestion.api import bench_tzinfo, ingest
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.investigation.collect import collect
from kvpressure.investigation.report import make_report
from kvpressure.paths import REPO_ROOT
from kvpressure.record.io import load_record
from kvpressure.stages.files import read_stage
from kvpressure.stages.results import (
    CollectInfo,
    ComparisonResult,
    InterferenceResult,
    RecomputeResult,
    VerdictResult,
)
from kvpressure.sweeps.replay import replay_sweep
from kvpressure.sweeps.sweep import run_sweep
from report_helpers import empty_fields

pytestmark = pytest.mark.slow

EXPERIMENT = REPO_ROOT / "data" / "experiments" / "ci_small.yaml"
REFERENCE = (REPO_ROOT / "tests" / "data" / "vllm-0.33-scheduler"
             / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz")
TRUE_RATIO = 127_201 / 601_608  # recomputed / scheduled tokens of the reference run
ZONE = "+08:00"  # the bench machine's zone the replay writes its dates in
ENGINE = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "scheduling_policy": "fcfs"}
QUIET = {"progress": lambda _m: None, "stream": None}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The small experiment's baseline, one workload seed, every level (about a second)."""
    out = tmp_path_factory.mktemp("sweep")
    runs = run_sweep(EXPERIMENT, out, compare=False, seeds=1, jobs=1)
    return out / "points" / "baseline", runs.sort_values("concurrency").reset_index(drop=True)


@pytest.fixture(scope="module")
def replay(sweep, tmp_path_factory):
    return replay_sweep(sweep[0], tmp_path_factory.mktemp("loadtest"), bench_timezone=ZONE)


@pytest.fixture(scope="module")
def sim_status(sweep):
    """The simulation's own verdict at concurrency 32, from its exact per-step record."""
    points, runs = sweep
    steps = pd.read_csv(points / "c32" / "steps.csv")
    checklist = check_symptoms(None, runs=runs, steps=steps, max_num_seqs=256)
    return decide_status(checklist)


def _summary(points: Path, c: int) -> dict:
    return json.loads((points / f"c{c}" / "summary.json").read_text())


# --------------------------------------------------------------------------- ingestion
def test_replayed_log_gives_each_level_its_own_counts(sweep, replay):
    points, runs = sweep
    res = ingest([replay.log.parent / "bench", replay.log], run="lt",
                 options=IngestOptions(bench_timezone=ZONE))
    got = res.runs.sort_values("concurrency").reset_index(drop=True)
    assert got["concurrency"].astype(int).tolist() == replay.levels == runs["concurrency"].tolist()
    for (_, row), (_, sim) in zip(got.iterrows(), runs.iterrows(), strict=True):
        # Counters cut at the bench window: exactly the level's own, nothing of its neighbours.
        assert row["preemptions"] == sim["preemptions"]
        assert row["output_throughput"] == pytest.approx(sim["output_throughput"], rel=1e-12)
        start, end = replay.spans[int(sim["concurrency"])]
        assert row["t_start"] <= start + 1e-6 and end <= row["t_end"]
    # One server for the whole test: the counter never drops and ends at the sum of the levels.
    pre = res.series[res.series["metric"] == "vllm:num_preemptions_total"].sort_values("t")
    assert pre["value"].is_monotonic_increasing
    assert pre["value"].iloc[-1] == runs["preemptions"].sum() > 0
    # Windows follow one another without overlap.
    assert (got.sort_values("t_start")["t_start"].diff().dropna() > 0).all()


def test_dates_read_in_the_wrong_zone_are_refused_naming_the_fix(replay):
    with pytest.raises(InputError, match=r"lies outside the scrape log.*bench_timezone"):
        ingest([replay.log.parent / "bench", replay.log], run="lt",
               options=IngestOptions(bench_timezone="UTC"))


def test_bench_timezone_forms():
    assert bench_tzinfo("") is None and bench_tzinfo("local") is None
    assert bench_tzinfo("UTC").utcoffset(None).total_seconds() == 0
    assert bench_tzinfo("+08:00").utcoffset(None).total_seconds() == 8 * 3600
    assert bench_tzinfo("-0530").utcoffset(None).total_seconds() == -(5 * 3600 + 1800)
    with pytest.raises(InputError, match="bench_timezone 'Mars/Olympus'"):
        bench_tzinfo("Mars/Olympus")


def test_automatic_focus_is_the_simulations(sweep, replay, tmp_path):
    _, runs = sweep
    info = collect(tmp_path / "c", source=[str(replay.log.parent / "bench"), str(replay.log)],
                   bench_timezone=ZONE, progress=None)
    assert info.engine_metrics and info.bench_results and info.scrapes
    assert info.focus.concurrency == focus_level(runs)[0]


def test_log_of_unknown_concurrency_reads_without_a_level(tmp_path):
    info = collect(tmp_path / "u", source=[str(REFERENCE)], progress=None)
    assert info.focus.concurrency is None and info.concurrency_levels == []
    assert "not known" in info.focus.why
    assert info.model_name == "llama-reference"  # the label ingestion dropped as constant


# --------------------------------------------------------------------------- 1. bench + log
@pytest.fixture(scope="module")
def full(replay, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "prod"
    return make_report(out, sources=[replay.log.parent / "bench", replay.log],
                       params={"bench_timezone": ZONE, "focus_concurrency": 32,
                               "engine_args": ENGINE}, **QUIET)


def test_bench_sweep_with_one_log_is_investigated_like_the_simulation(full, sweep, sim_status):
    points, runs = sweep
    rec = load_record(full.record_path)
    assert sim_status.status == KV_BOUND  # the small case is built KV-bound
    assert rec.status == sim_status.status and rec.evidence.comparison is None
    assert "not confirmed" in rec.evidence.reasons[0]
    curve = rec.perf.throughput_by_concurrency
    assert [p.concurrency for p in curve] == runs["concurrency"].tolist()
    for p, (_, sim) in zip(curve, runs.iterrows(), strict=True):
        assert p.output_throughput == pytest.approx(sim["output_throughput"], rel=1e-9)
        assert p.preemptions == sim["preemptions"]
    knee = find_knee(runs["concurrency"], runs["output_throughput"])
    assert rec.perf.knee.knee_x == knee.knee_x and rec.perf.knee.peak_x == knee.peak_x
    c = rec.counters
    s32 = _summary(points, 32)
    assert c.window.concurrency == 32 and c.num_preemptions_total == s32["preemptions"]
    low, high = c.recompute_ratio_range
    assert not c.recompute_exact and low <= s32["recompute_ratio"] <= high
    assert rec.scheduler.num_gpu_blocks == s32["settings"]["num_gpu_blocks"]
    # The focus level's requests, exactly, from the bench result's per-request lengths.
    lens = pd.read_csv(points / "c32" / "requests.csv")["prompt_len"]
    assert rec.workload.input_len_distribution.mean == pytest.approx(lens.mean())
    # Everything measured: the only nulls are what the data does not hold (the comparison, the
    # seeds, the device its server ran on), the rate axis's fields of a concurrency sweep and
    # the simulated latencies' fidelity (measured ones need none).
    data = load_record(full.record_path).model_dump(mode="json")
    assert list(empty_fields(data)) == ["scheduler.async_scheduling",
                                         "counters.window.request_rate",
                                         "workload.request_rate", "workload.request_rates",
                                         "workload.max_concurrency",
                                         "perf.knee.same_schedule_from",
                                         "perf.throughput_by_request_rate",
                                         "perf.latency_fidelity",
                                         "evidence.comparison",
                                         "provenance.seed", "provenance.vllm_version_served",
                                         "provenance.seeds", "provenance.platform",
                                         "missing"]
    page = full.index_path.read_text()
    assert KV_BOUND in page and "not confirmed" in page and "Not measured" not in page
    from kvpressure.report.page_check import page_problems

    assert page_problems(page, full.run_dir) == []


# --------------------------------------------------------------------------- 2. bench alone
@pytest.fixture(scope="module")
def bench_only(replay, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench"
    return make_report(out, sources=[replay.log.parent / "bench"],
                       params={"bench_timezone": ZONE}, **QUIET)


def test_bench_results_alone_give_the_curve_and_no_cause(bench_only, sweep):
    _, runs = sweep
    rec = load_record(bench_only.record_path)
    assert rec.status == NOT_ESTABLISHED
    assert "no engine metrics were given" in rec.evidence.reasons[0]
    assert [p.output_throughput for p in rec.perf.throughput_by_concurrency] == pytest.approx(
        runs["output_throughput"].tolist(), rel=1e-9)
    assert rec.perf.knee.peak_x == find_knee(runs["concurrency"], runs["output_throughput"]).peak_x
    focus = runs[runs["concurrency"] == rec.workload.concurrency].iloc[0]
    assert rec.perf.itl_mean == pytest.approx(focus["itl_mean_s"], rel=1e-12)  # ms round trip
    # The engine's counters are missing, never zero, and each says why.
    c = rec.counters
    for name in ("num_requests_running", "num_requests_waiting", "waiting_capacity",
                 "kv_cache_usage_perc", "num_preemptions_total", "recompute_ratio"):
        assert getattr(c, name) is None
        assert "no engine metrics" in rec.missing[f"counters.{name}"]
    assert all(p.preemptions is None for p in rec.perf.throughput_by_concurrency)
    symptoms = read_stage(bench_only.run_dir, VerdictResult).symptoms.symptoms
    verdicts = {s.id: s.verdict for s in symptoms}
    assert verdicts["kv_usage_near_full"] == verdicts["preemption_recompute"] == "no data"
    assert verdicts["curve_falls"] == "present" and rec.remedies == []
    # Nothing is judged without engine metrics: not "absent", not measured.
    interference = read_stage(bench_only.run_dir, InterferenceResult)
    assert interference.source == "none"
    assert interference.prefill_interference is None and interference.preemption is None
    assert not read_stage(bench_only.run_dir, CollectInfo).engine_metrics
    page = bench_only.index_path.read_text()
    assert "Not measured" in page and "<th>KV cache usage (mean)</th><td>no data</td>" in page


def test_bench_results_alone_leave_engine_checks_unjudged_not_false(bench_only):
    rec = load_record(bench_only.record_path)
    symptoms = read_stage(bench_only.run_dir, VerdictResult).symptoms.symptoms
    assert sum(s.verdict == "no data" for s in symptoms) >= 2
    # A symptom without data is neither present nor absent: null, with the symptom's reason.
    for i, (s, check) in enumerate(zip(symptoms, rec.evidence.checks, strict=True)):
        assert check.name == s.name
        if s.verdict == "no data":
            assert check.holds is None
            why = rec.missing[f"evidence.checks[{i}].holds"]
            assert s.evidence["missing"] in why and "no engine metrics" in why
        else:
            assert check.holds == (s.verdict == "present")
            assert f"evidence.checks[{i}].holds" not in rec.missing
    page = bench_only.index_path.read_text()
    kv = next(c for c in rec.evidence.checks if c.metric == "vllm:kv_cache_usage_perc")
    assert f"<td>{html.escape(kv.name)}</td><td class='no'>no data</td>" in page


# --------------------------------------------------------------------------- 3. one level
@pytest.fixture(scope="module")
def one_level(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "heavy"
    return make_report(out, sources=[REFERENCE],
                       params={"focus_concurrency": 64, "engine_args": {"max_num_seqs": 256}},
                       **QUIET)


def test_one_scrape_log_of_one_level(one_level):
    rec = load_record(one_level.record_path)
    # No curve: the stages say so instead of drawing a knee through one point.
    assert rec.perf.knee is None and "a knee needs at least 3" in rec.missing["perf.knee"]
    assert [p.concurrency for p in rec.perf.throughput_by_concurrency] == [64]
    assert "one load level measured" in read_stage(one_level.run_dir, ComparisonResult).summary
    # vLLM's own counters of the reference run.
    c = rec.counters
    assert c.num_preemptions_total == 95 and rec.scheduler.max_num_seqs_effective == 23
    assert c.kv_cache_usage_perc > 0.9 and c.num_requests_running < 256
    assert c.waiting_capacity > 0 and c.waiting_deferred == 0
    low, high = c.recompute_ratio_range
    assert low <= TRUE_RATIO <= high
    # KV-bound by the symptom rule, honestly unconfirmed.
    assert rec.status == KV_BOUND and rec.evidence.reasons[0].startswith("2:")
    assert "not confirmed" in rec.evidence.reasons[0]
    assert rec.workload.model_name == "llama-reference"
    assert set(rec.missing) == {"perf.knee", "scheduler.policy",
                                "scheduler.max_num_batched_tokens", "evidence.checks[0].holds"}
    # One level cannot show a falling curve: that check is not judged, and says why.
    assert rec.evidence.checks[0].holds is None
    assert "at least 3 levels" in rec.missing["evidence.checks[0].holds"]
    page = one_level.index_path.read_text()
    assert "One load level measured" in page and "No curve, no knee" in page


def _focus_runs_row(report) -> pd.Series:
    runs = pd.read_csv(report.run_dir / "runs.csv")
    focus = read_stage(report.run_dir, RecomputeResult).window
    return runs[runs["run"] == focus.run].iloc[0]


def test_runs_table_and_record_give_one_recompute_ratio(one_level):
    """One estimator: runs.csv and the record (stage 02) say the same over the same window."""
    row = _focus_runs_row(one_level)
    stage = read_stage(one_level.run_dir, RecomputeResult)
    c = load_record(one_level.record_path).counters
    assert stage.window.window == (row["t_start"], row["t_end"])
    assert row["preemptions"] == stage.preemptions == c.num_preemptions_total == 95
    for col in ("recompute_ratio", "recompute_ratio_low", "recompute_ratio_high",
                "recomputed_tokens"):
        assert row[col] == pytest.approx(getattr(stage, col), rel=1e-12), col
    assert c.recompute_ratio == pytest.approx(row["recompute_ratio"], rel=1e-12)
    # ... and so does the symptom checklist's evidence in stage 06
    symptom = next(s for s in read_stage(one_level.run_dir, VerdictResult).symptoms.symptoms
                   if s.id == "preemption_recompute")
    assert symptom.evidence["recompute_ratio"] == pytest.approx(c.recompute_ratio, rel=1e-12)
    for low, high in ((row["recompute_ratio_low"], row["recompute_ratio_high"]),
                      c.recompute_ratio_range):
        assert low <= round(TRUE_RATIO, 4) <= high
    # The log starts with the process: both count the prompts before the first scrape, so the
    # processed tokens are the run's scheduled ones less its recompute (one token a request).
    processed = stage.recompute["processed_without_recompute"]
    assert abs(processed + 127_201 - 601_608) <= 256


def test_bench_windows_of_one_log_give_one_recompute_ratio(full):
    row = _focus_runs_row(full)
    stage = read_stage(full.run_dir, RecomputeResult)
    assert row["preemptions"] == stage.preemptions
    for col in ("recompute_ratio", "recompute_ratio_low", "recompute_ratio_high"):
        assert row[col] == pytest.approx(getattr(stage, col), rel=1e-12), col
    # The engine arguments name the policy, and ingestion was told it as stage 02 was.
    assert stage.recompute["inputs"]["policy"] == "fcfs"
