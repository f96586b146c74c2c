"""The diagnosis on simulated runs seen through their own Prometheus view (as a real server).

Each run goes simulate -> metrics.prom.jsonl -> ingestion -> series, so the analysis reads it
exactly like ingested data; the exact steps table is the truth to check against.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.analysis.interference import interference_from_steps
from kvpressure.analysis.recompute import (
    EstimatorCase,
    recompute_from_steps,
    validate_recompute_estimator,
)
from kvpressure.analysis.status import KV_BOUND, NOT_ESTABLISHED, decide_status
from kvpressure.analysis.symptoms import check_symptoms

sim = pytest.importorskip("kvpressure.simulation.engine")
from kvpressure.ingestion.api import ingest  # noqa: E402
from kvpressure.simulation.cost_model import (  # noqa: E402
    CostCoefficients,
    ModelGeometry,
    StepCostModel,
)
from kvpressure.simulation.prom_view import PromRecorder  # noqa: E402
from kvpressure.simulation.scenario import load_scenario  # noqa: E402

# An 8B-class dense model on one 2 TB/s card.
COST = StepCostModel(
    ModelGeometry(name="dense-8b", active_params=8e9, weight_bytes=16e9, num_layers=32,
                  hidden_size=4096, attention_width=4096, kv_bytes_per_token_rank=131072),
    CostCoefficients(peak_flops=300e12, hbm_bandwidth=2e12, allreduce_bandwidth=100e9),
)


def run(tmp_path, seed: int, *, concurrency: int, blocks: int, reserve: bool, budget: int,
        prompt: tuple[int, int], output: tuple[int, int], n: int, max_num_seqs: int = 256,
        scrape_s: float = 1.0, prefix_caching: bool = False):
    rng = np.random.default_rng(seed)
    reqs = [{"id": f"r{i}", "prompt_len": int(rng.integers(*prompt)),
             "output_len": int(rng.integers(*output))} for i in range(n)]
    scenario = load_scenario({
        "mode": {"type": "closed", "concurrency": concurrency},
        "settings": {"num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": max_num_seqs,
                     "max_num_batched_tokens": budget, "scheduler_reserve_full_isl": reserve,
                     "max_model_len": 8192, "enable_prefix_caching": prefix_caching},
        "requests": reqs,
    })
    rec = PromRecorder(scrape_interval_s=scrape_s, max_model_len=8192,
                       cache_config={"num_gpu_blocks": blocks, "block_size": 16,
                                     "gpu_memory_utilization": 0.9,
                                     "enable_prefix_caching": prefix_caching})
    res = sim.simulate(scenario, cost_model=COST, recorder=rec)
    out = tmp_path / f"s{seed}-{concurrency}-{blocks}-{reserve}-{budget}"
    res.write(out)
    series = ingest(out / "metrics.prom.jsonl", run="sim").series
    return res.steps_frame(), series, res


def test_estimator_coverage_over_seeded_workloads(tmp_path):
    cases = []
    for seed in range(9):
        # Admission by full sequence or by first chunk; prefix caching off or on.
        reserve, caching = seed % 3 != 1, seed % 3 == 2
        steps, series, _ = run(tmp_path, 100 + seed, concurrency=32, blocks=1500,
                               reserve=reserve, budget=2048 if not reserve else 4096,
                               prompt=(800, 3000), output=(128, 768), n=70,
                               prefix_caching=caching)
        cases.append(EstimatorCase(f"seed{seed}", steps, series,
                                   scheduler_reserve_full_isl=reserve))
    v = validate_recompute_estimator(cases, windows_per_case=4)
    assert v.n_windows >= 18
    # Truth inside the range in at least 85% of windows, and at least as often as inside the
    # plain average-context (D4) range.
    assert v.coverage >= 0.85
    assert v.coverage >= v.d4_coverage
    print(f"coverage={v.coverage:.3f} width={v.median_rel_width:.2f} "
          f"point_err={v.median_abs_point_error:.2f} d4_coverage={v.d4_coverage:.3f} "
          f"d4_width={v.d4_median_rel_width:.2f} windows={v.n_windows}")


def test_kv_bound_workload_comes_out_kv_bound(tmp_path):
    steps, series, res = run(tmp_path, 7, concurrency=48, blocks=1200, reserve=True,
                             budget=4096, prompt=(300, 1000), output=(800, 1600), n=90)
    c = check_symptoms(series, max_num_seqs=256)
    v = {s.id: s.verdict for s in c.symptoms}
    assert v["waiting_persists"] == "present"
    assert v["running_below_max_num_seqs"] == "present"
    assert v["kv_usage_near_full"] == "present"
    st = decide_status(c, pool_tokens=1200 * 16, max_sequence_tokens=int(
        (res.requests_frame()["prompt_len"] + res.requests_frame()["output_len"]).max()))
    assert st.status == KV_BOUND, st.rule
    assert recompute_from_steps(steps).preemptions == res.summary["preemptions"]


def test_long_prompts_big_pool_is_prefill_interference_not_kv(tmp_path):
    steps, series, res = run(tmp_path, 8, concurrency=16, blocks=40000, reserve=True,
                             budget=8192, prompt=(6000, 7000), output=(64, 128), n=48)
    c = check_symptoms(series, max_num_seqs=256)
    inter = interference_from_steps(steps)
    assert res.summary["preemptions"] == 0
    assert inter.prefill_interference is True and inter.preemption is False
    st = decide_status(c, interference=inter)
    assert st.status == NOT_ESTABLISHED and st.prefill_interference is True
    assert c.by_id("kv_usage_near_full").verdict == "absent"


def test_no_pressure_is_not_established(tmp_path):
    steps, series, res = run(tmp_path, 9, concurrency=4, blocks=20000, reserve=True,
                             budget=8192, prompt=(200, 400), output=(64, 128), n=24)
    c = check_symptoms(series, max_num_seqs=256)
    assert c.by_id("preemption_recompute").verdict == "absent"
    assert decide_status(c).status == NOT_ESTABLISHED
    assert isinstance(steps, pd.DataFrame)
