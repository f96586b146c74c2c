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
    assert s["baseline_knee_x"] == 24 and s["knee_x"] == 48
    assert s["shift"] == 24 and s["change"] == "lower"
    assert c.knee_moves_right and c.beyond_noise
    assert "repeated" in c.noise_method
    json.dumps(c.to_dict())


def test_same_knee_is_not_a_move():
    runs = seeded_runs({"baseline": 32, "mns128": 32}, {"baseline": 256, "mns128": 128})
    c = compare_variants(runs, n_boot=50)
    assert not c.beyond_noise
    assert c.shifts[0]["shift"] == 0


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
    assert c.shifts[0]["change"] == "higher" and c.shifts[0]["shift"] == 24
    assert c.beyond_noise  # exact curves: no noise, the shift stands


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
    rep = evaluate_remedies(baseline_runs(), fake, settings=settings, max_sequence_tokens=3000)
    assert [o.remedy for o in rep.outcomes] == list(REMEDY_ORDER)
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
    rep = evaluate_remedies(baseline_runs(), lambda ov: baseline_runs(),
                            settings={"max_model_len": 8192},
                            remedies={"lower_max_model_len": {"max_model_len": 1024}},
                            max_sequence_tokens=3000)
    o = {x.remedy: x for x in rep.outcomes}["lower_max_model_len"]
    assert not o.applicable and "3000" in o.reason
    assert rep.try_first is None
    with pytest.raises(InputError, match="unknown remedy 'swap'"):
        evaluate_remedies(baseline_runs(), lambda ov: baseline_runs(), settings={},
                          remedies={"swap": {}})
