"""Shared helpers of the twin tests: a small simulated sweep with known step-time coefficients."""

from __future__ import annotations

from pathlib import Path

from kvpressure.twin.synthetic import synthetic_workloads, write_synthetic_run

SETTINGS = dict(num_gpu_blocks=40, block_size=16, max_num_seqs=32, max_num_batched_tokens=256,
                max_model_len=1024, enable_prefix_caching=False,
                scheduler_reserve_full_isl=True)
# Per-step, per-prefill-token and per-decoding-sequence costs a small CPU server could have.
TRUE = dict(t0=3e-3, t_prefill_token=4e-5, t_decode_seq=3e-4, t_decode_ctx=0.0,
            t_prefill_attn=0.0)
TTFT_OFFSET = 0.01
LEVELS = (1, 2, 4, 6, 8, 12)


def synthetic_run(folder: Path, *, levels=LEVELS, noise: float = 0.0, seed: int = 3,
                  coefficients=None, settings=None) -> Path:
    workloads = synthetic_workloads(levels, input_len=(32, 400), output_len=(16, 96),
                                    requests_per_level=24)
    write_synthetic_run(folder, settings or SETTINGS, workloads, coefficients or TRUE,
                        ttft_offset=TTFT_OFFSET, noise=noise, seed=seed)
    return folder
