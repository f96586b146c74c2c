"""The kit's own invariants on a simulated investigation, stage by stage (the checks the
notebooks used to end with): a simulation knows every answer, so each stage's result must agree
with the tables it was computed from. Ingested data is checked by ingestion, never here."""

from __future__ import annotations

import pandas as pd
import pytest

from kvpressure.analysis.compare import moved_right_by
from kvpressure.analysis.levels import base_repeat
from kvpressure.analysis.status import KV_BOUND
from kvpressure.investigation.collect import load_tables
from kvpressure.investigation.record import build_record
from kvpressure.record.io import load_record
from kvpressure.stages.files import read_stage, read_stages
from kvpressure.stages.results import (
    CollectInfo,
    ComparisonResult,
    InterferenceResult,
    KneeResult,
    RecomputeResult,
    VerdictResult,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(ci_small_report):
    return ci_small_report.run_dir


def test_01_every_variant_replays_the_same_levels_and_seeds(run):
    info = read_stage(run, CollectInfo)
    tables = load_tables(run)
    runs, points = tables.runs, base_repeat(tables.runs)
    levels = set(info.concurrency_levels)
    assert info.simulated and info.engine_metrics and info.load.notes == []
    assert info.focus.t1 > info.focus.t0 and info.focus.concurrency in levels
    assert (runs["output_throughput"] > 0).all(), "a point produced no output"
    assert len(points) >= 3 and len(tables.series) > 0
    assert all(set(g["concurrency"]) == levels for _, g in runs.groupby(["variant", "seed"]))
    # One row per variant, seed and level; the experiment's own seed is repeat 0.
    seeds = info.seeds
    assert sorted(runs["seed"].unique()) == sorted(seeds) and seeds[0] == info.seed
    assert (points["seed"] == info.seed).all() and len(runs) == len(points) * len(seeds)
    assert not runs.duplicated(["variant", "seed", "concurrency"]).any()


def test_02_recompute_is_counted_exactly(run):
    r = read_stage(run, RecomputeResult)
    assert r.available and r.exact and r.missing is None
    assert 0.0 <= r.recompute_ratio_low == r.recompute_ratio == r.recompute_ratio_high <= 1.0
    rec = r.recompute
    assert abs(rec["recomputed_tokens"] / rec["scheduled_tokens"] - r.recompute_ratio) < 1e-12
    # Every recompute follows a preemption.
    assert (r.preemptions > 0) == (r.recomputed_tokens > 0)
    assert r.running_max <= r.max_num_seqs


def test_03_knee_lies_on_its_curve(run):
    res = read_stage(run, KneeResult)
    k, pts = res.knee, pd.DataFrame([p.model_dump(exclude_unset=True) for p in res.curve])
    assert k is not None and k.sustained_end is not None
    assert k.peak_y == pts["output_throughput"].max()
    assert k.knee_x is None or min(pts["concurrency"]) <= k.knee_x <= k.peak_x
    assert k.peak_x <= k.sustained_end
    assert k.decline_onset is None or k.decline_onset > k.sustained_end
    assert 0 <= k.decline_pct <= 100
    assert (pts["repeats"] == res.repeats).all()


def test_04_comparison_shifts_agree_with_the_variants(run):
    info = read_stage(run, CollectInfo)
    c = read_stage(run, ComparisonResult)
    assert c.available, "the experiment defines a comparison but none was made"
    assert c.parameter == info.comparison_parameter
    assert all(s.shift == s.knee_x - s.baseline_knee_x
               for s in c.shifts if s.knee_x is not None and s.baseline_knee_x is not None)
    # Beyond noise means the variant's range lies wholly right of the baseline's, by one of two.
    base = next(v for v in c.variants if v.variant == c.baseline)
    assert base.sustained_range is not None
    for s in c.shifts:
        v = next(v for v in c.variants if v.variant == s.variant)
        assert v.sustained_range is not None
        assert ("knee" in s.moved_right_by) == (
            s.shift > 0 and v.knee_range[0] > base.knee_range[1])
        assert ("sustained range" in s.moved_right_by) == (
            s.sustained_shift > 0 and v.sustained_range[0] > base.sustained_range[1])
    assert c.moved_right_beyond_noise == bool(moved_right_by(c.shifts))


def test_05_interference_is_judged_on_the_steps(run):
    from kvpressure.investigation.stages import interference_stage

    d = read_stage(run, InterferenceResult)
    view = interference_stage(load_tables(run)).frames["steps"]
    assert d.source == "steps" and len(view) > 0
    # Preemption-driven slow steps need preemptions in the window.
    assert not d.preemption or view["kind"].eq("preemption / recompute").any()


def test_06_built_in_case_is_kv_bound_and_fully_measured(run, ci_small_report):
    v = read_stage(run, VerdictResult)
    record = load_record(ci_small_report.record_path)
    # The record file is what the stages' results build, validated on the way out and back in.
    assert record == build_record(read_stages(run))
    # Built to be KV-bound at its focus level: the pool cannot hold the sweep's load, so the
    # KV rule fires (pool near full, with capacity waiting below max_num_seqs or recompute),
    # and lowering max_num_seqs moves the knee right beyond the seeds' noise.
    assert v.status.status == KV_BOUND, v.status.rule
    assert v.status.rule.startswith("2:") and v.status.confirmed, v.status.rule
    assert record.evidence.comparison.beyond_noise and len(record.provenance.seeds) > 1
    assert record.counters.kv_cache_usage_perc > 0.8 and record.counters.recompute_ratio > 0.05
    assert not record.missing  # a simulation measures every field
