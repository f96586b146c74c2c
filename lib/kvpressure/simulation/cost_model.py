"""Step time of one engine iteration from the hardware and model profiles.

An analytic roofline with fitted overheads (per TP rank, all ranks in lock step):

```
N      = P + D                                     P prefill tokens, D decode sequences
F_lin  = 2 * A_active * N / TP                     GEMM FLOPs
F_attn = 4 * L * (H*d / TP) * (sum_prefill_attn + sum_decode_ctx)
B_w    = W_bytes / TP                              weights read once per step
B_kv   = kv_bytes_per_token_rank * (sum_decode_ctx + sum_prefill_ctx)
T_comp = F_lin / (eta_f * peak) + F_attn / (eta_a * peak)
T_mem  = (B_w + B_kv) / (eta_m * bandwidth)
T_comm = 2 * L * (alpha_c + 2 * (TP-1)/TP * N * hidden * 2 B / allreduce_bandwidth)   (TP > 1)
         or 2 * L * AR(N * hidden * 2 B), AR measured per message size (allreduce_latency)
T_step = max(T_comp, T_mem) + T_comm + T0 + t_seq * (D + prefill sequences)
```

With ``cpu_overlap`` (async scheduling, vLLM 0.33.0's default: the engine core processes a
step's outputs and prepares the next step while the GPU computes), the per-sequence CPU work
hides behind the GPU's part of the step and only its excess shows:
``T0 + max(0, t_seq * seqs - (max(T_comp, T_mem) + T_comm))``. Off by default: on the calibration split of
``benchmarks/bench_sim_to_real.py`` (real H100 servers with async scheduling on) the per-sequence
cost still shows in the step (ITL MAPE 9.5% additive, 10.4% overlapped).

``step_time`` works elementwise: every field of the features may be a scalar or a numpy array
(the engine prices a whole leap of decode steps in one call). An empty step (no tokens) costs
nothing: the engine is idle, not iterating.

Calibration follows the piecewise least-squares recipe: decode-only steps are memory-bound and
fix ``T0``, ``t_seq``, ``eta_m`` and the all-reduce scale; steps that carry prefill are
compute-bound and, with those fixed, fix ``eta_f`` and ``eta_a``. Hardware peaks stay as in the
profile, so a fitted profile transfers to other models on the same card.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from kvpressure.errors import InputError
from kvpressure.simulation.request_path import RequestPath
from kvpressure.simulation.step_features import StepFeatures

# Feature values the one-step path takes as they are (numpy scalars and arrays go to terms()).
_PLAIN = (int, float)
ACTIVATION_BYTES = 2  # bf16 activations travel through the all-reduce

FEATURE_FIELDS = (
    "num_prefill_tokens",
    "num_decode_seqs",
    "num_prefill_seqs",
    "sum_decode_ctx",
    "sum_prefill_attn",
    "sum_prefill_ctx",
)


@dataclass(frozen=True)
class CostCoefficients:
    """The calibratable part of the cost model (SI units: FLOP/s, B/s, seconds).

    An efficiency of ``math.inf`` switches its term off (a calibration that found no cost).
    """

    peak_flops: float
    """Dense BF16 matrix peak per card, FLOP/s."""
    hbm_bandwidth: float
    """Device-memory bandwidth per card, B/s."""
    allreduce_bandwidth: float
    """Effective all-reduce bandwidth of the TP group for the ring formula, B/s."""
    eta_f: float = 0.8
    eta_a: float = 0.5
    eta_m: float = 0.9
    alpha_c: float = 10e-6
    """Per all-reduce call latency, s."""
    comm_scale: float = 1.0
    """Multiplier on the bandwidth part of the all-reduce time (a calibration handle)."""
    t0: float = 3e-3
    """Fixed cost of one step (scheduler, input preparation, sampler, launches), s."""
    t_seq: float = 20e-6
    """Per-sequence cost per step (output processing, detokenization), s."""
    overlap: bool = True
    """True: compute and memory traffic overlap (max); False: they add (pessimistic bound)."""
    cpu_overlap: bool = False
    """True (async scheduling): the per-sequence CPU work runs during the GPU's part of the
    step; only what exceeds it adds to the step."""
    allreduce_latency: tuple[tuple[float, float], ...] = ()
    """Measured time of one all-reduce of the TP group by message size, ``((bytes, s), ...)``
    ascending; empty: the ring formula ``alpha_c + volume / allreduce_bandwidth``. Given, it
    replaces that formula: linear between the measured sizes, the smallest size's time below
    them (a latency floor), and above them the largest size's time plus the ring formula's
    bandwidth part for the bytes beyond it (the bandwidth regime a latency table does not
    reach)."""


@dataclass(frozen=True)
class ModelGeometry:
    """What the cost model needs from the model profile, already divided per TP rank."""

    name: str
    active_params: float
    weight_bytes: float
    """All weights of the model (all ranks together), bytes."""
    num_layers: int
    hidden_size: int
    attention_width: int
    """num_attention_heads * head_dim (query side; the attention FLOPs scale with it)."""
    kv_bytes_per_token_rank: float
    """KV-cache bytes per context token held by one TP rank (all layers)."""
    tensor_parallel_size: int = 1
    num_experts: int = 0
    """Routed experts per MoE layer (0: dense model)."""
    experts_per_token: int = 0
    active_weight_bytes: float = 0.0
    """Weights one token touches (MoE: shared parts plus its top-k experts), bytes."""

    def weight_bytes_read(self, num_tokens: Any) -> Any:
        """Weight bytes one step reads on one rank. Dense: all of them. MoE: the shared part
        plus each expert at least one of the ``num_tokens`` tokens was routed to, with
        uniform routing: a given expert is missed by all tokens with probability
        ``(1 - k/E) ** N``."""
        per_rank = self.weight_bytes / self.tensor_parallel_size
        if self.num_experts <= 0 or self.experts_per_token <= 0:
            return per_rank
        active = self.active_weight_bytes / self.tensor_parallel_size
        frac_other = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** np.maximum(
            np.asarray(num_tokens, dtype=float) - 1.0, 0.0
        )
        # One token reads the active weights; the other experts' bytes join as more tokens
        # route to them, up to every expert once.
        return active + (per_rank - active) * frac_other


def _feature(features: Any, name: str) -> Any:
    if isinstance(features, Mapping):
        value = features.get(name, 0)
    elif hasattr(features, "columns"):  # a DataFrame
        value = features[name].to_numpy(dtype=float) if name in features.columns else 0.0
    else:
        value = getattr(features, name, 0)
    return np.asarray(value, dtype=float)


def _result(value: np.ndarray) -> Any:
    return float(value) if np.ndim(value) == 0 else value


REQUEST_PATH_FIELDS = ("api_server_s", "tokenize_s_per_token", "output_s")


class StepCostModel:
    """Duration of one engine step (seconds) from the step's token and context counts.

    ``request_path`` is the host's share of a request's latency priced from the same profile
    (``request_path.py``); the engine loop applies it, this class never adds it to a step."""

    def __init__(self, geometry: ModelGeometry, coefficients: CostCoefficients,
                 request_path: RequestPath | None = None):
        if geometry.tensor_parallel_size < 1:
            raise InputError(
                f"tensor_parallel_size must be >= 1, got {geometry.tensor_parallel_size}"
            )
        for f in fields(CostCoefficients):
            value = getattr(coefficients, f.name)
            if f.name not in ("overlap", "cpu_overlap", "allreduce_latency") and (
                    not isinstance(value, int | float) or value < 0):
                raise InputError(f"cost model coefficient {f.name} must be >= 0, got {value!r}")
        for name in ("eta_f", "eta_a", "eta_m", "peak_flops", "hbm_bandwidth"):
            if getattr(coefficients, name) <= 0:
                raise InputError(f"cost model coefficient {name} must be > 0")
        self.geometry = geometry
        self.coefficients = coefficients
        self.request_path = request_path
        tp = geometry.tensor_parallel_size
        self._ar = _segments(coefficients.allreduce_latency,
                             2.0 * (tp - 1) / tp / coefficients.allreduce_bandwidth
                             if coefficients.allreduce_bandwidth > 0 else 0.0)

    # --- construction --------------------------------------------------------------------
    @classmethod
    def from_profiles(
        cls, hardware: Any, model: Any, tensor_parallel_size: int = 1, **overrides: Any
    ) -> StepCostModel:
        """Build from a ``HardwareProfile`` and a ``ModelProfile``; ``overrides`` replace
        coefficients (``eta_m=0.85``, ``t0=0.004``, ...) or the request path's values
        (``api_server_s``, ``tokenize_s_per_token``, ``output_s``)."""
        tp = int(tensor_parallel_size)
        geometry = geometry_from_profile(model, tp)
        allreduce = (
            hardware.allreduce_bandwidth(tp)
            if callable(getattr(hardware, "allreduce_bandwidth", None))
            else float(hardware.link_bandwidth) * float(hardware.eta_c)
        )
        coeffs = CostCoefficients(
            peak_flops=float(hardware.peak_flops),
            hbm_bandwidth=float(hardware.hbm_bandwidth),
            allreduce_bandwidth=float(allreduce),
            eta_f=float(hardware.eta_f),
            eta_a=float(hardware.eta_a),
            eta_m=float(hardware.eta_m),
            alpha_c=float(hardware.alpha_c),
            t0=float(hardware.t0),
            t_seq=float(hardware.t_seq),
            allreduce_latency=(tuple(hardware.allreduce_latency(tp))
                               if callable(getattr(hardware, "allreduce_latency", None))
                               else ()),
        )
        path = {k: float(getattr(hardware, k, 0.0)) for k in REQUEST_PATH_FIELDS}
        path.update({k: overrides.pop(k) for k in REQUEST_PATH_FIELDS if k in overrides})
        model_ = cls(geometry, coeffs, RequestPath(**path))
        return model_.with_coefficients(**overrides) if overrides else model_

    def with_coefficients(self, **changes: Any) -> StepCostModel:
        """A copy with some coefficients replaced; unknown names raise ``InputError``."""
        known = {f.name for f in fields(CostCoefficients)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InputError(
                f"unknown cost model coefficient(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return StepCostModel(self.geometry, replace(self.coefficients, **changes),
                             self.request_path)

    def describe(self) -> dict[str, Any]:
        """Geometry and coefficients as plain values (for summaries and reports)."""
        out = {"geometry": asdict(self.geometry), "coefficients": asdict(self.coefficients)}
        if self.request_path is not None:
            out["request_path"] = self.request_path.describe()
        return out

    # --- the roofline terms ----------------------------------------------------------------
    def terms(self, features: Any) -> dict[str, Any]:
        """Every term of the step time (seconds), elementwise; keys ``t_comp, t_mem, t_comm,
        t_overhead, flops_linear, flops_attention, bytes_moved``."""
        g, c = self.geometry, self.coefficients
        tp = g.tensor_parallel_size
        p = _feature(features, "num_prefill_tokens")
        d = _feature(features, "num_decode_seqs")
        n_prefill = _feature(features, "num_prefill_seqs")
        dec_ctx = _feature(features, "sum_decode_ctx")
        pre_attn = _feature(features, "sum_prefill_attn")
        pre_ctx = _feature(features, "sum_prefill_ctx")
        n = p + d
        busy = n > 0
        flops_lin = 2.0 * g.active_params * n / tp
        flops_attn = 4.0 * g.num_layers * (g.attention_width / tp) * (pre_attn + dec_ctx)
        bytes_moved = np.where(
            busy, g.weight_bytes_read(n) + g.kv_bytes_per_token_rank * (dec_ctx + pre_ctx), 0.0
        )
        t_comp = flops_lin / (c.eta_f * c.peak_flops) + flops_attn / (c.eta_a * c.peak_flops)
        t_mem = bytes_moved / (c.eta_m * c.hbm_bandwidth)
        if tp > 1:
            t_comm = np.where(busy, 2.0 * g.num_layers * self._allreduce_s(n), 0.0)
        else:
            t_comm = np.zeros_like(n)
        cpu = c.t_seq * (d + n_prefill)
        if c.cpu_overlap:
            gpu = (np.maximum(t_comp, t_mem) if c.overlap else t_comp + t_mem) + t_comm
            cpu = np.maximum(cpu - gpu, 0.0)
        t_overhead = np.where(busy, c.t0 + cpu, 0.0)
        return {
            "t_comp": t_comp,
            "t_mem": t_mem,
            "t_comm": t_comm,
            "t_overhead": t_overhead,
            "flops_linear": flops_lin,
            "flops_attention": flops_attn,
            "bytes_moved": bytes_moved,
        }

    def step_time(self, features: Any) -> Any:
        """Seconds for the step(s) described by ``features`` (a ``StepFeatures``, a mapping or a
        DataFrame with the ``FEATURE_FIELDS``); scalar in, float out; arrays in, array out."""
        f = features
        if (type(f) is StepFeatures and type(f.num_prefill_tokens) in _PLAIN
                and type(f.num_decode_seqs) in _PLAIN and type(f.num_prefill_seqs) in _PLAIN
                and type(f.sum_decode_ctx) in _PLAIN and type(f.sum_prefill_attn) in _PLAIN
                and type(f.sum_prefill_ctx) in _PLAIN):
            return self._one_step_time(f)
        t = self.terms(features)
        if self.coefficients.overlap:
            core = np.maximum(t["t_comp"], t["t_mem"])
        else:
            core = t["t_comp"] + t["t_mem"]
        return _result(core + t["t_comm"] + t["t_overhead"])

    def _one_step_time(self, f: StepFeatures) -> float:
        """``step_time`` of one step of plain numbers, in Python floats: the engine prices every
        step it does not leap over, and numpy's per-call cost on scalars was most of a
        simulated point's time. The same operations in the same order as ``terms``, so the
        same bits (tests/test_cost_model.py holds them equal)."""
        g, c = self.geometry, self.coefficients
        tp = g.tensor_parallel_size
        p = float(f.num_prefill_tokens)
        d = float(f.num_decode_seqs)
        dec_ctx = float(f.sum_decode_ctx)
        n = p + d
        busy = n > 0
        flops_lin = 2.0 * g.active_params * n / tp
        flops_attn = 4.0 * g.num_layers * (g.attention_width / tp) * (
            float(f.sum_prefill_attn) + dec_ctx)
        bytes_moved = 0.0
        if busy:
            if g.num_experts <= 0 or g.experts_per_token <= 0:
                weights = g.weight_bytes / tp
            else:
                weights = float(g.weight_bytes_read(n))
            bytes_moved = weights + g.kv_bytes_per_token_rank * (
                dec_ctx + float(f.sum_prefill_ctx))
        t_comp = flops_lin / (c.eta_f * c.peak_flops) + flops_attn / (c.eta_a * c.peak_flops)
        t_mem = bytes_moved / (c.eta_m * c.hbm_bandwidth)
        t_comm = 0.0
        if tp > 1 and busy:
            t_comm = 2.0 * g.num_layers * float(self._allreduce_s(n))
        cpu = c.t_seq * (d + float(f.num_prefill_seqs))
        if c.cpu_overlap:
            gpu = (max(t_comp, t_mem) if c.overlap else t_comp + t_mem) + t_comm
            cpu = max(cpu - gpu, 0.0)
        core = max(t_comp, t_mem) if c.overlap else t_comp + t_mem
        return core + t_comm + (c.t0 + cpu if busy else 0.0)

    def _allreduce_s(self, n: Any) -> Any:
        """Seconds of one all-reduce of a step of ``n`` tokens (scalar or array; the same
        operations either way, so the engine's scalar path and numpy's give the same bits)."""
        g, c = self.geometry, self.coefficients
        if self._ar is None:
            tp = g.tensor_parallel_size
            volume = 2.0 * (tp - 1) / tp * n * g.hidden_size * ACTIVATION_BYTES
            return c.alpha_c + c.comm_scale * volume / c.allreduce_bandwidth
        sizes, times, slopes = self._ar
        size = n * g.hidden_size * ACTIVATION_BYTES
        if np.ndim(size) == 0:
            i = max(0, min(int(np.searchsorted(sizes, size, side="right")) - 1, len(sizes) - 1))
            t = times[i] + max(size - sizes[i], 0.0) * slopes[i] if size > sizes[0] else times[0]
            return c.comm_scale * float(t)
        size = np.asarray(size, dtype=float)
        i = np.clip(np.searchsorted(sizes, size, side="right") - 1, 0, len(sizes) - 1)
        t = np.where(size > sizes[0],
                     times[i] + np.maximum(size - sizes[i], 0.0) * slopes[i], times[0])
        return c.comm_scale * t

    def recompute_time(self, features: Any, recomputed_tokens: Any) -> Any:
        """Seconds of the step attributable to its recomputed tokens (elementwise).

        The split is marginal: the step's time minus the time of the same step with the
        recomputed tokens taken out of its prefill. The removed tokens take their share of the
        prefill attention term with them (``sum_prefill_attn`` scaled by the surviving
        fraction of prefill tokens); the number of sequences is kept. So a recompute chunk that
        rides in a memory-bound decode step costs almost nothing, and one that fills a
        compute-bound step costs its full GEMM and attention time.
        """
        r = np.asarray(recomputed_tokens, dtype=float)
        p = _feature(features, "num_prefill_tokens")
        if np.any(r < 0) or np.any(r > p + 1e-9):
            raise InputError("recomputed_tokens must lie between 0 and num_prefill_tokens")
        keep = np.divide(p - r, p, out=np.ones_like(p * r), where=p > 0)
        reduced = {
            "num_prefill_tokens": p - r,
            "num_decode_seqs": _feature(features, "num_decode_seqs"),
            "num_prefill_seqs": _feature(features, "num_prefill_seqs"),
            "sum_decode_ctx": _feature(features, "sum_decode_ctx"),
            "sum_prefill_attn": _feature(features, "sum_prefill_attn") * keep,
            "sum_prefill_ctx": _feature(features, "sum_prefill_ctx") - r,
        }
        full = np.asarray(self.step_time(features), dtype=float)
        without = np.asarray(self.step_time(reduced), dtype=float)
        # A step made only of recompute would otherwise lose its fixed overhead too; that
        # overhead buys nothing new either, so it is attributed to recompute in full.
        return _result(np.maximum(full - without, 0.0))

    # --- calibration -------------------------------------------------------------------------
    def calibrate(self, steps: Any, time_column: str = "step_duration_s") -> StepCostModel:
        """Fit the coefficients to measured step times (non-negative least squares).

        ``steps`` holds one row per step with the ``FEATURE_FIELDS`` and ``time_column``.
        Decode-only rows fit ``[1, sequences, bytes moved]`` -> ``T0, t_seq, 1/(eta_m*BW)``;
        rows with prefill then fit the remaining time on ``[F_lin, F_attn]`` ->
        ``1/(eta_f*peak), 1/(eta_a*peak)``. Without decode-only rows all four are fitted on the
        prefill rows at once (``eta_m`` kept). The all-reduce term stays as modelled from the
        measured collective bandwidth: from step times alone its volume, proportional to the
        step's tokens, cannot be told apart from ``t_seq`` in decode steps (tokens = sequences)
        nor from the GEMM term in prefill steps (both linear in tokens).
        """
        from scipy.optimize import nnls

        cols = getattr(steps, "columns", None)
        if cols is None:
            raise InputError("calibrate: expected a table (DataFrame) of steps")
        missing = [c for c in (*FEATURE_FIELDS, time_column) if c not in cols]
        if missing:
            raise InputError(f"calibrate: step table lacks column(s) {', '.join(missing)}")
        table = steps[steps["num_prefill_tokens"] + steps["num_decode_seqs"] > 0]
        if len(table) < 3:
            raise InputError("calibrate: need at least 3 non-empty steps with measured times")
        g, c = self.geometry, self.coefficients
        terms = self.terms(table)
        y = table[time_column].to_numpy(dtype=float)
        seqs = (table["num_decode_seqs"] + table["num_prefill_seqs"]).to_numpy(dtype=float)
        ones = np.ones_like(y)
        tp = g.tensor_parallel_size
        n = (table["num_prefill_tokens"] + table["num_decode_seqs"]).to_numpy(dtype=float)
        # the all-reduce term, kept as modelled
        known = 2.0 * g.num_layers * self._allreduce_s(n) if tp > 1 else np.zeros_like(y)
        decode = (table["num_prefill_tokens"] == 0).to_numpy()
        changes: dict[str, float] = {}

        def inv(coef: float, scale: float) -> float:
            return math.inf if coef <= 0 else 1.0 / (coef * scale)

        if decode.sum() >= 3:
            a = np.column_stack([ones, seqs, terms["bytes_moved"]])[decode]
            x, _ = nnls(a, (y - known)[decode])
            t0, t_seq, c_m = x
            changes.update(t0=t0, t_seq=t_seq, eta_m=inv(c_m, c.hbm_bandwidth))
            rest = ~decode
            if rest.sum() >= 2:
                resid = y - known - t0 - t_seq * seqs
                a = np.column_stack([terms["flops_linear"], terms["flops_attention"]])[rest]
                x, _ = nnls(a, resid[rest])
                changes.update(eta_f=inv(x[0], c.peak_flops), eta_a=inv(x[1], c.peak_flops))
        else:
            a = np.column_stack([ones, seqs, terms["flops_linear"], terms["flops_attention"]])
            x, _ = nnls(a, y - known)
            changes.update(
                t0=x[0], t_seq=x[1], eta_f=inv(x[2], c.peak_flops), eta_a=inv(x[3], c.peak_flops)
            )
        changes = {k: float(v) for k, v in changes.items()}
        # The piecewise fit is additive per regime; keep overlap so each regime's dominant
        # term carries it (the other term is small there by construction).
        return self.with_coefficients(**changes)

    # --- reference numbers ---------------------------------------------------------------------
    def decode_floor_s(self, batch: int = 1, context: int = 0) -> float:
        """Lower bound of a decode step at ``batch`` sequences of ``context`` tokens: weights and
        KV read at the full peak bandwidth, nothing else (the roofline's memory side)."""
        g, c = self.geometry, self.coefficients
        weights = float(g.weight_bytes_read(batch))
        return (weights + batch * context * g.kv_bytes_per_token_rank) / c.hbm_bandwidth


def _segments(table: tuple[tuple[float, float], ...], beyond: float) -> (
        tuple[np.ndarray, np.ndarray, np.ndarray] | None):
    """A measured (bytes, seconds) table as sizes, times and the slope (s/B) from each size
    on: towards the next size, and ``beyond`` past the largest."""
    if not table:
        return None
    pairs = sorted((float(b), float(t)) for b, t in table)
    if len(pairs) < 2 or any(b <= 0 or t <= 0 for b, t in pairs) or len(
            {b for b, _ in pairs}) != len(pairs):
        raise InputError("cost model allreduce_latency: need >= 2 distinct sizes > 0 with "
                         f"times > 0, got {table!r}")
    sizes = np.array([b for b, _ in pairs])
    times = np.array([t for _, t in pairs])
    slopes = np.append(np.diff(times) / np.diff(sizes), beyond)
    return sizes, times, slopes


def calibrate(model: StepCostModel, steps: Any, time_column: str = "step_duration_s") -> (
    StepCostModel
):
    """Module-level form of :meth:`StepCostModel.calibrate`."""
    return model.calibrate(steps, time_column=time_column)


def geometry_from_profile(model: Any, tensor_parallel_size: int) -> ModelGeometry:
    """The cost model's view of a ``ModelProfile`` at a given TP size."""
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise InputError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    check = getattr(model, "check_tp", None)
    if callable(check):
        check(tp)
    num_experts = int(getattr(model, "num_experts", 0) or 0)
    return ModelGeometry(
        name=str(model.name),
        active_params=float(model.num_active_params),
        weight_bytes=float(model.weight_bytes),
        num_layers=int(model.num_hidden_layers),
        hidden_size=int(model.hidden_size),
        attention_width=int(model.num_attention_heads) * int(model.head_dim),
        kv_bytes_per_token_rank=float(model.kv_bytes_per_token(tp)),
        tensor_parallel_size=tp,
        num_experts=num_experts,
        experts_per_token=int(getattr(model, "num_experts_per_tok", 0) or 0),
        active_weight_bytes=float(model.num_active_params * model.weight_dtype_bytes),
    )
