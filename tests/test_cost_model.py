"""Step cost model: hand-worked roofline numbers, regimes, monotonicity, arrays, calibration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.errors import InputError
from kvpressure.profiles.hardware import load_hardware
from kvpressure.profiles.model import load_model
from kvpressure.simulation.cost_model import StepCostModel
from kvpressure.simulation.step_features import StepFeatures


@pytest.fixture(scope="module")
def llama8b_h100() -> StepCostModel:
    return StepCostModel.from_profiles(load_hardware("h100-80g"), load_model("llama-3.1-8b"), 1)


@pytest.fixture(scope="module")
def llama70b_910b() -> StepCostModel:
    return StepCostModel.from_profiles(
        load_hardware("ascend-910b-64g"), load_model("llama-3.1-70b"), 8
    )


def test_single_stream_tpot_floor_llama8b_h100(llama8b_h100):
    # by hand: W / BW = 16.06e9 B / 3.35e12 B/s = 4.79 ms
    assert llama8b_h100.decode_floor_s() == pytest.approx(16.06e9 / 3.35e12, rel=1e-9)
    assert llama8b_h100.decode_floor_s() == pytest.approx(4.8e-3, abs=0.05e-3)
    # the same through step_time with no overhead and ideal bandwidth: one decode, context 1
    ideal = llama8b_h100.with_coefficients(t0=0.0, t_seq=0.0, eta_m=1.0)
    t = ideal.step_time(StepFeatures(num_decode_seqs=1, sum_decode_ctx=1))
    assert t == pytest.approx((16.06e9 + 131072) / 3.35e12, rel=1e-9)


def test_tpot_floor_qwen72b_tp8_910b():
    # by hand: Qwen2.5-72B TP8 on 910B: 145.4e9 / 8 / 1.6e12 = 11.4 ms
    model = StepCostModel.from_profiles(
        load_hardware("ascend-910b-64g"), load_model("qwen2.5-72b"), 8
    )
    assert model.decode_floor_s() == pytest.approx(145.4e9 / 8 / 1.6e12, rel=1e-9)


def test_decode_is_memory_bound_and_prefill_compute_bound(llama8b_h100):
    decode = llama8b_h100.terms({"num_decode_seqs": 64, "sum_decode_ctx": 64 * 1024})
    assert decode["t_mem"] > 5 * decode["t_comp"]
    prefill = {"num_prefill_tokens": 8192, "num_prefill_seqs": 1,
               "sum_prefill_attn": 8192 * 4096, "sum_prefill_ctx": 8192}
    terms = llama8b_h100.terms(prefill)
    assert terms["t_comp"] > 10 * terms["t_mem"]
    # hand-worked: GEMM 2 * 8.03e9 * 8192 / (0.78 * 989e12) + attention
    # 4 * 32 * 4096 * (8192 * 8192/2) / (0.5 * 989e12)
    gemm = 2 * 8.03e9 * 8192 / (0.78 * 989e12)
    attn = 4 * 32 * 4096 * (8192 * 4096) / (0.5 * 989e12)
    assert terms["t_comp"] == pytest.approx(gemm + attn, rel=1e-12)
    assert gemm == pytest.approx(0.17055, rel=1e-4)
    # step = compute + fixed overhead + one sequence; no all-reduce at TP 1
    c = llama8b_h100.coefficients
    assert llama8b_h100.step_time(prefill) == pytest.approx(gemm + attn + c.t0 + c.t_seq)


def test_allreduce_term_matches_spec_example(llama70b_910b):
    # by hand: 70B-class, TP 8, N = 64 decode: 2*80*2*(7/8)*64*8192*2 B = 294 MB over
    # the measured 72 GB/s 8-card all-reduce = ~4 ms (latency per call switched off here)
    no_alpha = llama70b_910b.with_coefficients(alpha_c=0.0)
    t = no_alpha.terms({"num_decode_seqs": 64, "sum_decode_ctx": 64})["t_comm"]
    volume = 2 * 80 * 2 * (7 / 8) * 64 * 8192 * 2
    assert volume == pytest.approx(294e6, rel=0.01)
    assert t == pytest.approx(volume / 72e9, rel=1e-9)
    assert 3.9e-3 < t < 4.2e-3
    # the per-call latency adds 2 calls x 80 layers x 10 us
    with_alpha = llama70b_910b.terms({"num_decode_seqs": 64, "sum_decode_ctx": 64})["t_comm"]
    assert with_alpha - t == pytest.approx(2 * 80 * 10e-6)


def test_empty_step_costs_nothing(llama70b_910b):
    assert llama70b_910b.step_time(StepFeatures()) == 0.0


def test_monotone_in_batch_context_and_prefill(llama70b_910b):
    batch = np.arange(1, 257)
    t_batch = llama70b_910b.step_time({"num_decode_seqs": batch, "sum_decode_ctx": batch * 4096})
    assert np.all(np.diff(t_batch) > 0)
    ctx = np.arange(0, 200_000, 1000)
    t_ctx = llama70b_910b.step_time({"num_decode_seqs": 32, "sum_decode_ctx": ctx})
    assert np.all(np.diff(t_ctx) >= 0)
    p = np.arange(1, 8193, 64)
    t_p = llama70b_910b.step_time({"num_prefill_tokens": p, "num_prefill_seqs": 1,
                                   "sum_prefill_attn": p * (p / 2), "sum_prefill_ctx": p})
    assert np.all(np.diff(t_p) > 0)


_MODELS = {
    "dense TP 8": lambda: StepCostModel.from_profiles(
        load_hardware("ascend-910b-64g"), load_model("llama-3.1-70b"), 8),
    "dense TP 1, compute and memory added": lambda: StepCostModel.from_profiles(
        load_hardware("h100-80g"), load_model("llama-3.1-8b"), 1).with_coefficients(
        overlap=False),
    "dense TP 4, measured all-reduce": lambda: StepCostModel.from_profiles(
        load_hardware("h100-80g"), load_model("llama-2-70b"), 4),
    "MoE TP 8, CPU work overlapped": lambda: StepCostModel.from_profiles(
        load_hardware("h200"), load_model("qwen3-235b-a22b"), 8).with_coefficients(
        cpu_overlap=True, t_seq=5e-5),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_scalar_and_array_results_agree(name):
    # One step of plain numbers takes the engine's Python path, an array of steps numpy's:
    # the same bits, or a leap would not reproduce the step-by-step times.
    model = _MODELS[name]()
    rng = np.random.default_rng(3)
    n = 200
    feats = {
        "num_prefill_tokens": rng.integers(0, 2048, n) * (rng.random(n) < 0.7),
        "num_decode_seqs": rng.integers(0, 64, n) * (rng.random(n) < 0.7),
        "num_prefill_seqs": rng.integers(0, 3, n),
        "sum_decode_ctx": rng.integers(0, 500_000, n),
        "sum_prefill_attn": rng.uniform(0, 1e8, n),
        "sum_prefill_ctx": rng.integers(0, 30_000, n),
    }
    idle = rng.random(n) < 0.1
    for v in feats.values():
        v[idle] = 0
    vec = model.step_time(StepFeatures(**feats))
    assert isinstance(vec, np.ndarray) and vec.shape == (n,)
    assert (vec == 0).any() and (vec > 0).any()  # idle steps among them
    for i in range(n):
        one = model.step_time(StepFeatures(**{k: v[i].item() for k, v in feats.items()}))
        assert type(one) is float
        assert one == vec[i]
        # numpy scalars take the array path: the same value again
        assert model.step_time(StepFeatures(**{k: v[i] for k, v in feats.items()})) == one
    # a DataFrame with the same columns prices the same
    assert np.array_equal(model.step_time(pd.DataFrame(feats)), vec)


def test_overlap_off_adds_compute_and_memory(llama8b_h100):
    f = {"num_prefill_tokens": 512, "num_prefill_seqs": 1, "sum_prefill_attn": 512 * 256,
         "sum_prefill_ctx": 512, "num_decode_seqs": 16, "sum_decode_ctx": 16 * 2000}
    terms = llama8b_h100.terms(f)
    summed = llama8b_h100.with_coefficients(overlap=False).step_time(f)
    assert summed == pytest.approx(terms["t_comp"] + terms["t_mem"] + terms["t_overhead"])
    assert summed > llama8b_h100.step_time(f)


def test_recompute_time_split(llama8b_h100, llama70b_910b):
    # a memory-bound decode step (TP 1: no all-reduce) carrying a small recomputed chunk:
    # the chunk rides along almost free
    decode_heavy = {"num_decode_seqs": 64, "sum_decode_ctx": 64 * 4000,
                    "num_prefill_tokens": 32, "num_prefill_seqs": 1,
                    "sum_prefill_attn": 32 * (4000 + 16), "sum_prefill_ctx": 4032}
    r = llama8b_h100.recompute_time(decode_heavy, 32)
    assert 0 <= r < 0.01 * llama8b_h100.step_time(decode_heavy)
    # at TP 8 the same chunk still pays its all-reduce volume (token-proportional):
    # 2 calls x 80 layers x 2*(7/8) x 32 tokens x 8192 x 2 B / 72 GB/s
    at_tp8 = dict(decode_heavy, sum_decode_ctx=64 * 20_000)
    r8 = llama70b_910b.recompute_time(at_tp8, 32)
    comm = 2 * 80 * 2 * (7 / 8) * 32 * 8192 * 2 / 72e9
    assert r8 == pytest.approx(comm, rel=0.02)
    # a compute-bound step that is nothing but recompute: all of it is attributable
    only_recompute = {"num_prefill_tokens": 2048, "num_prefill_seqs": 1,
                      "sum_prefill_attn": 2048 * 1024, "sum_prefill_ctx": 2048}
    assert llama70b_910b.recompute_time(only_recompute, 2048) == pytest.approx(
        llama70b_910b.step_time(only_recompute))
    # half of a compute-bound chunk recomputed: about half of its token-proportional work
    # (GEMMs, attention, all-reduce volume); the fixed costs stay with the new tokens
    half = llama70b_910b.recompute_time(only_recompute, 1024)
    terms = llama70b_910b.terms(only_recompute)
    per_token = terms["t_comp"] + terms["t_comm"] - 2 * 80 * 10e-6
    assert 0.4 * per_token < half < 0.6 * per_token
    with pytest.raises(InputError):
        llama70b_910b.recompute_time(only_recompute, 4096)


def test_with_coefficients_rejects_unknown_names(llama8b_h100):
    with pytest.raises(InputError, match="eta_x"):
        llama8b_h100.with_coefficients(eta_x=0.5)
    with pytest.raises(InputError, match="eta_m"):
        llama8b_h100.with_coefficients(eta_m=0.0)


def test_moe_reads_more_experts_as_tokens_grow():
    moe = StepCostModel.from_profiles(load_hardware("h200"), load_model("qwen3-235b-a22b"), 8)
    g = moe.geometry
    one = g.weight_bytes_read(1)
    many = g.weight_bytes_read(4096)
    assert one == pytest.approx(g.active_weight_bytes / 8)
    assert many == pytest.approx(g.weight_bytes / 8, rel=1e-6)
    assert np.all(np.diff(g.weight_bytes_read(np.arange(1, 200))) > 0)


def _synthetic_steps(model: StepCostModel, rng: np.random.Generator) -> pd.DataFrame:
    n = 400
    decode = rng.random(n) < 0.6
    d = rng.integers(1, 128, n)
    ctx = d * rng.integers(500, 30_000, n)
    p = np.where(decode, 0, rng.integers(1024, 8192, n))
    c = rng.integers(0, 20_000, n)
    frame = pd.DataFrame({
        "num_prefill_tokens": p,
        "num_decode_seqs": d,
        "num_prefill_seqs": np.where(decode, 0, 1),
        "sum_decode_ctx": ctx,
        "sum_prefill_attn": p * (c + p / 2),
        "sum_prefill_ctx": np.where(decode, 0, c + p),
    })
    frame["step_duration_s"] = model.step_time(frame)
    return frame


def test_calibration_recovers_known_coefficients(llama70b_910b):
    truth = llama70b_910b.with_coefficients(
        eta_f=0.6, eta_a=0.35, eta_m=0.7, t0=6e-3, t_seq=50e-6
    )
    steps = _synthetic_steps(truth, np.random.default_rng(11))
    # the synthetic mixed steps must be compute-bound for the piecewise fit to apply
    mixed = steps[steps.num_prefill_tokens > 0]
    terms = truth.terms(mixed)
    assert np.all(terms["t_comp"] > terms["t_mem"])
    fitted = llama70b_910b.calibrate(steps).coefficients
    assert fitted.eta_m == pytest.approx(0.7, rel=1e-3)
    assert fitted.t0 == pytest.approx(6e-3, rel=1e-3)
    assert fitted.t_seq == pytest.approx(50e-6, rel=1e-2)
    assert fitted.eta_f == pytest.approx(0.6, rel=1e-3)
    assert fitted.eta_a == pytest.approx(0.35, rel=1e-2)
    # and the calibrated model reproduces the measured times
    again = llama70b_910b.with_coefficients(**{
        k: getattr(fitted, k) for k in ("eta_f", "eta_a", "eta_m", "t0", "t_seq")})
    assert np.allclose(again.step_time(steps), steps.step_duration_s, rtol=1e-3)


def test_calibration_errors_name_missing_columns(llama70b_910b):
    with pytest.raises(InputError, match="step_duration_s"):
        llama70b_910b.calibrate(pd.DataFrame({"num_prefill_tokens": [1], "num_decode_seqs": [1],
                                              "num_prefill_seqs": [1], "sum_decode_ctx": [1],
                                              "sum_prefill_attn": [1], "sum_prefill_ctx": [1]}))


def test_async_scheduling_hides_the_per_sequence_cpu_work_behind_the_gpu(llama8b_h100):
    # 64 decode sequences of context 1: GPU part = (16.06e9 + 64 * 131072) B at eta_m 1 on
    # 3.35 TB/s = 4.797 ms. CPU part: t_seq 100 us x 64 = 6.4 ms; t0 1 ms always shows.
    m = llama8b_h100.with_coefficients(eta_m=1.0, t0=1e-3, t_seq=100e-6)
    f = StepFeatures(num_decode_seqs=64, sum_decode_ctx=64)
    gpu = (16.06e9 + 64 * 131072) / 3.35e12
    assert m.step_time(f) == pytest.approx(gpu + 1e-3 + 6.4e-3, rel=1e-9)
    # Overlapped: only the CPU's 6.4 ms beyond the GPU's 4.797 ms shows.
    hidden = m.with_coefficients(cpu_overlap=True)
    assert hidden.step_time(f) == pytest.approx(gpu + 1e-3 + (6.4e-3 - gpu), rel=1e-9)
    # With less CPU work than GPU work, none of it shows.
    small = StepFeatures(num_decode_seqs=8, sum_decode_ctx=8)
    gpu8 = (16.06e9 + 8 * 131072) / 3.35e12
    assert hidden.step_time(small) == pytest.approx(gpu8 + 1e-3, rel=1e-9)


def test_a_measured_all_reduce_table_prices_each_call_by_its_message():
    h100 = load_hardware("h100-80g")
    model = StepCostModel.from_profiles(h100, load_model("llama-2-70b"), 4)
    table = dict(h100.allreduce_latency(4))
    layers, hidden = 80, 8192

    def call_s(tokens):
        t = model.terms({"num_decode_seqs": tokens, "sum_decode_ctx": tokens})["t_comm"]
        return t / (2 * layers)

    # A size the table measured: its time; between two: on the line joining them.
    assert call_s(32) == pytest.approx(table[32 * hidden * 2], rel=1e-12)
    mid = (table[524288] + table[1048576]) / 2
    assert call_s(48) == pytest.approx(mid, rel=1e-12)
    # Below the smallest size the latency floor holds (no call is cheaper than measured).
    assert call_s(0.01) == pytest.approx(table[1024], rel=1e-12)
    # Past the largest, the ring formula's bandwidth part carries on from the last point.
    ring = 2 * 3 / 4 / h100.allreduce_bandwidth(4)
    assert call_s(2048) == pytest.approx(table[2097152] + (2048 * hidden * 2 - 2097152) * ring,
                                         rel=1e-12)
    # Group sizes the table does not hold keep the ring formula with alpha_c.
    assert h100.allreduce_latency(3) == ()


def test_a_bad_all_reduce_table_names_the_field(tmp_path):
    text = open(load_hardware("h100-80g").path).read()
    bad = tmp_path / "h100-bad.yaml"
    bad.write_text(text.replace("2: {1024: 9.5,", "2: {1024: -9.5,"))
    with pytest.raises(InputError, match="allreduce_latency_us"):
        load_hardware(str(bad))
