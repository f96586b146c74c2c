"""The twin's step-time model: the cost model's terms in the units a measurement can fit.

```
T_step = t0                                  fixed cost of one engine step
       + t_prefill_token * num_prefill_tokens
       + t_decode_seq    * num_decode_seqs
       + t_decode_ctx    * sum_decode_ctx     (KV read by decoding sequences)
       + t_prefill_attn  * sum_prefill_attn   (causal attention of prefill chunks)
```

Each coefficient is the roofline's term expressed per unit of work, so the model needs no
hardware peak or model size and a server the kit has no profile for (a CPU) is described by
measurements alone. Where a hardware and model profile exist, :func:`profile_priors` gives the
same coefficients from the roofline (its additive, no-overlap form), which stand in for the ones
the data cannot identify. An empty step costs nothing (the engine is idle, not iterating).

The model is linear in its coefficients; in a closed loop the scheduler's decisions do not
depend on time, so every duration a simulation reports is the same linear combination of the
durations of one simulation per coefficient (``fit.py`` relies on this).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvpressure.errors import InputError

COEFFICIENTS = ("t0", "t_prefill_token", "t_decode_seq", "t_decode_ctx", "t_prefill_attn")
# The step feature each coefficient multiplies (None: one per non-empty step).
FEATURE_OF = {
    "t0": None,
    "t_prefill_token": "num_prefill_tokens",
    "t_decode_seq": "num_decode_seqs",
    "t_decode_ctx": "sum_decode_ctx",
    "t_prefill_attn": "sum_prefill_attn",
}
UNITS = {
    "t0": "s per step",
    "t_prefill_token": "s per prefill token",
    "t_decode_seq": "s per decoding sequence",
    "t_decode_ctx": "s per context token of a decoding sequence",
    "t_prefill_attn": "s per unit of prefill attention (token x context)",
}


def _feature(features: Any, name: str) -> np.ndarray:
    if isinstance(features, Mapping):
        value = features.get(name, 0)
    else:
        value = getattr(features, name, 0)
    return np.asarray(value, dtype=float)


class TwinStepTime:
    """Step duration from the five coefficients (seconds); a drop-in ``cost_model`` for
    ``simulation.engine.simulate`` (only ``step_time`` is called).

    ``noise``: each busy step's time is multiplied by a seeded log-normal factor of mean 1 and
    that spread (a real server's steps scatter around the model's). It changes nothing in a
    closed loop's decisions, and in an open loop shows how far they move with such scatter."""

    def __init__(self, coefficients: Mapping[str, float], noise: float = 0.0, seed: int = 0):
        unknown = sorted(set(coefficients) - set(COEFFICIENTS))
        if unknown:
            raise InputError(f"unknown step-time coefficient(s) {', '.join(unknown)}; known: "
                             f"{', '.join(COEFFICIENTS)}")
        values = {k: float(coefficients.get(k, 0.0)) for k in COEFFICIENTS}
        bad = [k for k, v in values.items() if not (v >= 0 and np.isfinite(v))]
        if bad:
            raise InputError(f"step-time coefficient(s) {', '.join(bad)} must be finite and >= 0")
        if not (noise >= 0 and np.isfinite(noise)):
            raise InputError(f"step-time noise must be finite and >= 0, got {noise}")
        self.coefficients = values
        self.noise = float(noise)
        self._rng = np.random.default_rng(seed) if noise > 0 else None

    @classmethod
    def basis(cls, name: str) -> TwinStepTime:
        """The model with coefficient ``name`` = 1 and the others 0 (one unit of that work)."""
        if name not in COEFFICIENTS:
            raise InputError(f"unknown step-time coefficient {name!r}")
        return cls({name: 1.0})

    def step_time(self, features: Any) -> Any:
        if self._rng is None and not isinstance(features, Mapping):
            scalar = self._scalar_step_time(features)
            if scalar is not None:
                return scalar
        p = _feature(features, "num_prefill_tokens")
        d = _feature(features, "num_decode_seqs")
        busy = (p + d) > 0
        total = np.zeros(np.broadcast(p, d).shape)
        for name, value in self.coefficients.items():
            if value == 0.0:
                continue
            feat = FEATURE_OF[name]
            total = total + value * (1.0 if feat is None else _feature(features, feat))
        out = np.where(busy, total, 0.0)
        if self._rng is not None:
            out = out * self._rng.lognormal(-0.5 * self.noise ** 2, self.noise, np.shape(out))
        return float(out) if np.ndim(out) == 0 else out

    def _scalar_step_time(self, features: Any) -> float | None:
        """One step's time in plain floats (the engine prices every step of every twin
        simulation, where numpy's per-call cost on scalars dominates); None for arrays. The
        same sum in the same order as the array path, so the same bits."""
        values = []
        for name in ("num_prefill_tokens", "num_decode_seqs", "sum_decode_ctx",
                     "sum_prefill_attn"):
            v = getattr(features, name, 0)
            if not isinstance(v, int | float):
                return None
            values.append(float(v))
        if values[0] + values[1] <= 0:
            return 0.0
        feature = dict(zip(("num_prefill_tokens", "num_decode_seqs", "sum_decode_ctx",
                            "sum_prefill_attn"), values, strict=True))
        total = 0.0
        for name, value in self.coefficients.items():
            if value == 0.0:
                continue
            feat = FEATURE_OF[name]
            total = total + value * (1.0 if feat is None else feature[feat])
        return total

    def describe(self) -> dict[str, float]:
        return dict(self.coefficients)


def profile_priors(cost_model: Any) -> dict[str, float]:
    """The five coefficients from a profile's roofline (``StepCostModel``), term by term:

    * ``t0``: the fixed overhead plus one read of the weights (a memory-bound step pays it
      whatever its batch) plus the all-reduce call latencies;
    * ``t_prefill_token``: one token's GEMM FLOPs at the fitted efficiency, plus its share of
      the all-reduce volume;
    * ``t_decode_seq``: the per-sequence overhead (a decode token's GEMM hides under the weight
      read in a memory-bound step) plus its all-reduce share;
    * ``t_decode_ctx``: one context token's KV bytes at the memory efficiency;
    * ``t_prefill_attn``: the attention FLOPs of one token x context unit.
    """
    g, c = cost_model.geometry, cost_model.coefficients
    tp = g.tensor_parallel_size
    weights = float(g.weight_bytes_read(1))
    comm_call = 2.0 * g.num_layers * c.alpha_c if tp > 1 else 0.0
    comm_token = (2.0 * g.num_layers * c.comm_scale * 2.0 * (tp - 1) / tp * g.hidden_size * 2
                  / c.allreduce_bandwidth) if tp > 1 else 0.0
    return {
        "t0": c.t0 + weights / (c.eta_m * c.hbm_bandwidth) + comm_call,
        "t_prefill_token": 2.0 * g.active_params / tp / (c.eta_f * c.peak_flops) + comm_token,
        "t_decode_seq": c.t_seq + comm_token,
        "t_decode_ctx": g.kv_bytes_per_token_rank / (c.eta_m * c.hbm_bandwidth),
        "t_prefill_attn": 4.0 * g.num_layers * (g.attention_width / tp)
        / (c.eta_a * c.peak_flops),
    }
