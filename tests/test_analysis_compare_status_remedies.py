"""Single-variable comparison, the record's status and the remedies what-if (fake simulation)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis.compare import compare_variants
from kvpressure.analysis.remedies import REMEDY_ORDER, evaluate_remedies
from kvpressure.analysis.status import KV_BOUND, NOT_ESTABLISHED, SEQ_BOUND, decide_status
from kvpressure.analysis.symptoms import Symptom, SymptomChecklist, Thresholds
from kvpressure.errors import InputError

LEVELS = np.array([8, 16, 24, 32, 40, 48, 56, 64.0])


def curve(knee: float, fall: float = 3.0) -> np.ndarray:
    return np.where(LEVELS <= knee, 10 * LEVELS, 10 * knee - fall * (LEVELS - knee))


def seeded_runs(knees: dict[str, float], mns: dict[str, int], seeds: int = 3,
                noise: float = 0.02) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    rows = []
    for v, k in knees.items():
        for s in range(seeds):
            y = curve(k) * (1 + rng.normal(0, noise, len(LEVELS)))
            for x, t in zip(LEVELS, y, strict=True):
                rows.append({"variant": v, "seed": s, "concurrency": x, "output_throughput": t,
                             "max_num_seqs": mns[v], "gpu_memory_utilization": 0.9})
    return pd.DataFrame(rows)


def test_knee_moves_right_beyond_seed_noise():
    runs = seeded_runs({"baseline": 24, "mns32": 48}, {"baseline": 256, "mns32": 32})
    c = compare_variants(runs, baseline="baseline", n_boot=50)
    assert c.parameter == "max_num_seqs"
    (s,) = c.shifts
    assert s.baseline_knee_x == 24 and s.knee_x == 48
    assert s.shift == 24 and s.change == "lower"
    assert c.knee_moves_right and c.beyond_noise
    assert "repeated" in c.noise_method
    json.dumps(c.model_dump(mode="json"))


def test_same_knee_is_not_a_move():
    runs = seeded_runs({"baseline": 32, "mns128": 32}, {"baseline": 256, "mns128": 128})
    c = compare_variants(runs, n_boot=50)
    assert not c.beyond_noise
    assert c.shifts[0].shift == 0


def test_more_than_one_parameter_is_refused_naming_them():
    runs = seeded_runs({"a": 24, "b": 48}, {"a": 256, "b": 32}, seeds=1)
    runs.loc[runs["variant"] == "b", "gpu_memory_utilization"] = 0.95
    with pytest.raises(InputError, match="gpu_memory_utilization, max_num_seqs"):
        compare_variants(runs)
    variants = {"a": {"max_num_seqs": 256}, "b": {"max_num_seqs": 256}}
    with pytest.raises(InputError, match="do not differ"):
        compare_variants(runs, variants)
    with pytest.raises(InputError, match="no settings for variant 'b'"):
        compare_variants(runs, {"a": {"max_num_seqs": 1}})


def test_variants_table_and_no_repeats():
    rows = [{"variant": v, "concurrency": x, "output_throughput": y}
            for v, k in (("base", 24), ("big_pool", 48)) for x, y in zip(LEVELS, curve(k),
                                                                          strict=True)]
    c = compare_variants(pd.DataFrame(rows), {"base": {"gpu_memory_utilization": 0.9},
                                              "big_pool": {"gpu_memory_utilization": 0.95}},
                         baseline="base", n_boot=20)
    assert c.parameter == "gpu_memory_utilization"
    assert c.shifts[0].change == "higher" and c.shifts[0].shift == 24
    assert c.beyond_noise  # exact curves: no noise, the shift stands


# The seed case's shapes at its levels: a concave rise to 40 clients, then either a fall of 39%
# (preemption and recompute) or a hold at the peak (max_num_seqs low enough to avoid them).
SEED_LEVELS = np.array([8, 16, 24, 32, 40, 48, 64, 96.0])
RISE = [218.0, 289.0, 329.0, 353.0, 369.0]
FALLS = np.array([*RISE, 298.0, 225.0, 225.0])
HOLDS = np.array([*RISE, 369.0, 369.0, 369.0])
MNS = {"baseline": {"max_num_seqs": 256}, "max_num_seqs=40": {"max_num_seqs": 40}}


def seed_repeats(curves: dict, levels: np.ndarray = SEED_LEVELS, seeds: int = 3,
                 seed_sd: float = 0.03, point_sd: float = 0.01, rng_seed: int = 5
                 ) -> pd.DataFrame:
    """One row per variant, seed and level. A seed's request set is heavier or lighter for every
    variant alike (``seed_sd``); each point adds its own noise (``point_sd``). A curve may be a
    function of the seed."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for s in range(seeds):
        scale = rng.normal(1.0, seed_sd)
        for v, c in curves.items():
            y = np.asarray(c(s) if callable(c) else c, float)
            y = y * scale * (1 + rng.normal(0, point_sd, len(y)))
            rows += [{"variant": v, "seed": s, "concurrency": x, "output_throughput": t}
                     for x, t in zip(levels, y, strict=True)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_decline_that_disappears_moves_the_knee_right_beyond_seed_noise(rng_seed):
    runs = seed_repeats({"baseline": FALLS, "max_num_seqs=40": HOLDS}, rng_seed=rng_seed)
    c = compare_variants(runs, MNS, baseline="baseline", n_boot=60)
    assert c.knee_moves_right and c.beyond_noise
    base, low = c.variants
    # The baseline holds its peak to 40 clients and turns down at 48 in every resample.
    assert (base.sustained_end, base.decline_onset) == (40, 48)
    assert base.sustained_range == (40, 40) and base.repeats == 3
    # The lower max_num_seqs holds to 96: the decline is gone, the turn lies past the range.
    assert low.decline_onset is None and low.sustained_end == 96
    (s,) = c.shifts
    assert s.moved_right_by == ["sustained range"] and s.beyond_noise
    assert s.sustained_shift == (96 + 32) - 40  # past the range = one step past 96
    assert "repeated measurements" in c.noise_method
    # The status says what moved: the sustained range, not the knee (which stayed within noise)
    st = decide_status(checklist(kv_usage_near_full="present", waiting_persists="present",
                                 running_below_max_num_seqs="present", mean_running=18.0),
                       comparison=c)
    assert st.status == KV_BOUND and st.confirmed
    assert "the end of the sustained range moved right beyond noise (the knee itself did not " \
        "move beyond noise) when max_num_seqs changed" in st.rule


def test_decline_that_disappears_on_exact_curves_without_repeats():
    rows = [{"variant": v, "concurrency": x, "output_throughput": y}
            for v, curve_ in (("baseline", FALLS), ("max_num_seqs=40", HOLDS))
            for x, y in zip(SEED_LEVELS, curve_, strict=True)]
    c = compare_variants(pd.DataFrame(rows), MNS, baseline="baseline", n_boot=60)
    assert c.knee_moves_right and c.beyond_noise
    assert c.shifts[0].moved_right_by == ["sustained range"]
    # Noise from the roughness of the rising part, not from the fall: both curves share the
    # rise up to 40, and the fall does not enter the baseline's estimate.
    base, low = c.variants
    assert base.noise_source.startswith("roughness") and "parametric" in c.noise_method
    assert base.noise_sd < 0.03 * base.peak_y


@pytest.mark.parametrize("rng_seed", range(6))
def test_identical_curves_with_noisy_repeats_do_not_move(rng_seed):
    runs = seed_repeats({"baseline": FALLS, "max_num_seqs=40": FALLS}, point_sd=0.03,
                        rng_seed=rng_seed)
    c = compare_variants(runs, MNS, baseline="baseline", n_boot=60)
    assert not c.beyond_noise
    assert not c.shifts[0].moved_right_by


def test_shift_smaller_than_the_seed_spread_is_within_noise():
    levels = np.array([8, 16, 24, 32, 40, 48, 56, 64, 80, 96.0])

    def turning_after(t: float):
        rise = 400 * (1 - np.exp(-levels / 20))
        return np.where(levels <= t, rise, 0.75 * 400 * (1 - np.exp(-t / 20)))

    # Each seed turns at its own level; the variant turns one level later on average, while
    # the seeds of either variant spread over three levels.
    base_turn, low_turn = {0: 32, 1: 40, 2: 48}, {0: 40, 1: 48, 2: 56}
    for rng_seed in range(4):
        runs = seed_repeats({"baseline": lambda s: turning_after(base_turn[s]),
                             "max_num_seqs=40": lambda s: turning_after(low_turn[s])},
                            levels=levels, rng_seed=rng_seed)
        c = compare_variants(runs, MNS, baseline="baseline", n_boot=60)
        assert not c.beyond_noise, rng_seed
        base, low = c.variants
        assert base.sustained_range[1] >= low.sustained_range[0]  # the ranges overlap


def checklist(**verdicts: str) -> SymptomChecklist:
    ids = ["curve_falls", "waiting_persists", "running_below_max_num_seqs", "kv_usage_near_full",
           "preemption_recompute", "itl_jitter"]
    sy = []
    for i in ids:
        ev = {"mean_running": verdicts.pop("mean_running")} if (
            i == "running_below_max_num_seqs" and "mean_running" in verdicts) else {}
        sy.append(Symptom(i, i, verdicts.get(i, "absent"), ev))
    return SymptomChecklist(sy, (None, None), Thresholds())


def test_status_rules():
    kv = dict(kv_usage_near_full="present", waiting_persists="present",
              running_below_max_num_seqs="present", mean_running=18.0)
    s = decide_status(checklist(**kv))
    assert s.status == KV_BOUND and not s.confirmed and s.rule.startswith("2:")

    runs = seeded_runs({"baseline": 24, "mns32": 48}, {"baseline": 256, "mns32": 32})
    cmp_ = compare_variants(runs, baseline="baseline", n_boot=30)
    s = decide_status(checklist(**kv), comparison=cmp_)
    assert s.status == KV_BOUND and s.confirmed

    flat = compare_variants(seeded_runs({"baseline": 32, "x": 32}, {"baseline": 256, "x": 64}),
                            n_boot=30)
    assert decide_status(checklist(**kv), comparison=flat).status == NOT_ESTABLISHED

    s = decide_status(checklist(**kv), max_sequence_tokens=20000, pool_tokens=32000)
    assert s.status == SEQ_BOUND and s.rule.startswith("1a")
    s = decide_status(checklist(), max_model_len=65536, pool_tokens=32000)
    assert s.status == SEQ_BOUND and s.rule.startswith("1b")
    s = decide_status(checklist(kv_usage_near_full="present", waiting_persists="present",
                                running_below_max_num_seqs="present", mean_running=1.5))
    assert s.status == SEQ_BOUND and s.rule.startswith("1c")

    s = decide_status(checklist(running_below_max_num_seqs="no data"))
    assert s.status == NOT_ESTABLISHED and "no data for running_below_max_num_seqs" in s.rule
    json.dumps(s.to_dict())


def baseline_runs() -> pd.DataFrame:
    return pd.DataFrame({"concurrency": LEVELS, "output_throughput": curve(24, fall=4),
                         "recompute_ratio": np.where(LEVELS > 24, 0.4, 0.0),
                         "mean_running": 20.0, "max_running": 23.0,
                         "ttft_p95_s": 2.0, "itl_p95_s": 0.05, "itl_mean_s": 0.03})


def test_remedies_in_order_with_gain_and_cost():
    calls = []

    def fake(overrides: dict) -> pd.DataFrame:
        calls.append(overrides)
        r = baseline_runs()
        if "max_num_seqs" in overrides:  # no more thrash: the curve plateaus
            r["output_throughput"] = np.minimum(10 * LEVELS, 240.0)
            r["recompute_ratio"] = 0.02
            r["ttft_p95_s"] = 3.0
            r["max_running"] = overrides["max_num_seqs"]
        return r

    settings = {"max_num_seqs": 256, "max_model_len": 8192, "gpu_memory_utilization": 0.9,
                "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,
                "scheduler_reserve_full_isl": False, "watermark": 0.0}
    batches = []

    def fake_all(all_overrides):
        batches.append(list(all_overrides))
        return [fake(ov) for ov in all_overrides]

    rep = evaluate_remedies(baseline_runs(), fake_all, settings=settings,
                            max_sequence_tokens=3000)
    assert [o.remedy for o in rep.outcomes] == list(REMEDY_ORDER)
    assert batches == [calls]  # one sweep for every remedy, in the workflow's order
    assert calls[0] == {"max_num_seqs": 20}  # floor of mean running at the target
    assert calls[1] == {"max_model_len": 3000}
    assert calls[2] == {"gpu_memory_utilization": 0.95}
    assert calls[3] == {"max_num_batched_tokens": 4096}
    assert calls[4] == {"scheduler_reserve_full_isl": True}
    assert calls[5] == {"watermark": 0.01}
    first = rep.outcomes[0]
    base_at_64 = 240 - 4 * 40
    assert first.gain["throughput_at_target_pct"] == pytest.approx(100 * (240 - base_at_64)
                                                                   / base_at_64)
    assert first.cost["peak_concurrency_lost"] == 3.0
    assert first.cost["ttft_p95_change_pct"] == pytest.approx(50.0)
    assert rep.outcomes[1].cost["context_window_lost_tokens"] == 8192 - 3000
    assert rep.try_first == "lower_max_num_seqs"
    json.dumps(rep.to_dict())


def test_remedy_that_would_refuse_requests_is_not_run():
    rep = evaluate_remedies(baseline_runs(), lambda ovs: [baseline_runs() for _ in ovs],
                            settings={"max_model_len": 8192},
                            remedies={"lower_max_model_len": {"max_model_len": 1024}},
                            max_sequence_tokens=3000)
    o = {x.remedy: x for x in rep.outcomes}["lower_max_model_len"]
    assert not o.applicable and "3000" in o.reason
    assert rep.try_first is None
    with pytest.raises(InputError, match="unknown remedy 'swap'"):
        evaluate_remedies(baseline_runs(), lambda ovs: [baseline_runs() for _ in ovs], settings={},
                          remedies={"swap": {}})
