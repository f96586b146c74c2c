"""Preemption vs prefill interference on steps and series with planted spikes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis.interference import interference_from_series, interference_from_steps
from kvpressure.errors import InputError
from kvpressure.stages.results import Interference, StepPrefillEvidence, StepThresholds


def planted_steps(n: int = 200, spikes: tuple[int, ...] = (20, 60, 100, 140, 180),
                  kv: float = 0.5, preempt_at: tuple[int, ...] = ()) -> pd.DataFrame:
    pre = np.zeros(n)
    dur = np.full(n, 0.010)
    for i in spikes:  # a 4000-token prompt chunk packed with the decodes: a 40 ms step
        pre[i] = 4000
        dur[i] = 0.040
    usage = np.full(n, kv)
    rec = np.zeros(n)
    pmt = np.zeros(n)
    for i in preempt_at:
        pmt[i] = 1
        rec[i + 1] = 2000
        pre[i + 1] = 2000
        dur[i + 1] = 0.030
        usage[i: i + 2] = 1.0
    dec = np.full(n, 32.0)
    return pd.DataFrame({
        "step": np.arange(n), "arrivals": (pre > 0).astype(int) * (rec == 0),
        "num_prefill_tokens": pre, "num_decode_tokens": dec,
        "num_scheduled_tokens": pre + dec, "kv_usage": usage, "preemptions": pmt,
        "recomputed_tokens": rec, "time_s": np.concatenate([[0], np.cumsum(dur)[:-1]]),
        "step_duration_s": dur,
    })


def test_planted_prefill_spikes_with_kv_not_full():
    r = interference_from_steps(planted_steps())
    assert r.prefill_interference is True and r.preemption is False
    ev = r.prefill_evidence
    assert isinstance(ev, StepPrefillEvidence)
    assert ev.prefill_spike_steps == 5 and ev.spike_steps == 5
    assert ev.decode_step_s == pytest.approx(0.010)
    assert ev.prefill_spike_magnitude == pytest.approx(4.0)
    assert ev.share_of_slow_itl == 1.0
    assert ev.share_of_all_itl == pytest.approx(5 / 200)
    # 2.5% of ITLs are 40 ms: p99 is a spike and all of its excess comes from them; the p95
    # is a plain decode step.
    assert ev.itl_p99_s == pytest.approx(0.040)
    assert ev.itl_p99_without_prefill_spikes_s == pytest.approx(0.010)
    assert ev.share_of_itl_p99_excess == pytest.approx(1.0)
    assert ev.itl_p95_s == pytest.approx(0.010)
    # Half the largest step, set once the steps are read; the file gives back the same parts.
    assert isinstance(r.thresholds, StepThresholds) and r.thresholds.long_prefill_tokens
    assert Interference.model_validate_json(r.model_dump_json()) == r


def test_preemption_with_kv_full_is_not_prefill_interference():
    r = interference_from_steps(planted_steps(spikes=(), preempt_at=(50, 120)))
    assert r.preemption is True and r.prefill_interference is False
    assert r.preemption_evidence.preemptions == 2
    assert r.preemption_evidence.kv_usage_at_preemption == 1.0
    assert r.preemption_evidence.preempt_spike_steps == 2


def test_both_can_be_present():
    r = interference_from_steps(planted_steps(preempt_at=(50, 120)))
    assert r.preemption and r.prefill_interference


def test_untimed_steps_refused():
    with pytest.raises(InputError, match="time_s"):
        interference_from_steps(planted_steps().drop(columns=["time_s"]))


def itl_series(spike_at: set[int], burst_at: set[int], preempt_at: set[int],
               kv_full_at: set[int], n: int = 20) -> pd.DataFrame:
    les = [0.01, 0.025, 0.05, 0.1, float("inf")]
    rows = []
    cum = dict.fromkeys(les, 0.0)
    total = count = prompt = pre = 0.0
    for i in range(n):
        t = float(i)
        if i > 0:
            slow = 20.0 if i in spike_at else 0.0
            fast = 100.0
            for le in les:
                cum[le] += fast * (le >= 0.025) + slow * (le >= 0.1)
            total += fast * 0.02 + slow * 0.08
            count += fast + slow
            prompt += 8000 if i in burst_at else 1000
            pre += 1 if i in preempt_at else 0
        for le in les:
            rows.append(("a", t, "vllm:inter_token_latency_seconds_bucket",
                         f"le={'+Inf' if le == float('inf') else le}", cum[le]))
        rows += [("a", t, "vllm:inter_token_latency_seconds_sum", "", total),
                 ("a", t, "vllm:inter_token_latency_seconds_count", "", count),
                 ("a", t, "vllm:prompt_tokens_total", "", prompt),
                 ("a", t, "vllm:num_preemptions_total", "", pre),
                 ("a", t, "vllm:kv_cache_usage_perc", "", 1.0 if i in kv_full_at else 0.6)]
    return pd.DataFrame(rows, columns=["run", "t", "metric", "labels", "value"])


def test_series_spikes_aligned_with_prompt_bursts():
    s = itl_series(spike_at={3, 9, 15}, burst_at={3, 9, 15}, preempt_at=set(), kv_full_at=set())
    r = interference_from_series(s)
    assert r.prefill_interference is True and r.preemption is False
    assert r.prefill_evidence.spike_intervals == 3
    assert r.prefill_evidence.prefill_spike_intervals == 3


def test_series_spikes_with_preemptions_are_not_prefill():
    s = itl_series(spike_at={3, 9, 15}, burst_at=set(), preempt_at={3, 9, 15},
                   kv_full_at={3, 9, 15})
    r = interference_from_series(s)
    assert r.prefill_interference is False and r.preemption is True
    assert r.preemption_evidence.preemptions == 3
    assert r.preemption_evidence.kv_usage_at_preemption == 1.0
