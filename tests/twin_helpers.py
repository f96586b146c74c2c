"""Shared helpers of the twin tests: a small simulated sweep with known step-time coefficients."""

from __future__ import annotations

import datetime as _dt
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


def log_line(t: float, i: int, prefill: int, decode: int, elapsed: float,
             context: int | None = None) -> str:
    """One engine step as vLLM logs it with --enable-logging-iteration-details."""
    when = _dt.datetime.fromtimestamp(t, _dt.UTC)
    context = int(prefill > 0) if context is None else context
    return (f"{when:%Y-%m-%dT%H:%M:%S.%f}Z (APIServer pid=1) INFO {when:%m-%d %H:%M:%S} "
            f"[loggers.py:199] Engine 000: Iteration({i}): {context} context requests, "
            f"{prefill} context tokens, {decode} generation requests, {decode} generation tokens,"
            f" iteration elapsed time: {elapsed * 1000:.2f} ms, CPU KV cache usage: 50.0%\n")


def write_step_log(path: Path, settings, loads, coefficients, *, start: float = 1_750_000_000.0,
                   elapsed_share: float = 0.8) -> tuple[list[tuple[float, float]], int]:
    """Simulate each level with ``coefficients`` and write its steps as vLLM logs them, the
    logged elapsed time ``elapsed_share`` of each step (the rest is outside it, as vLLM's
    scheduling and output processing are), levels 5 s apart; returns the levels' (start, end)
    unix windows and the number of steps written. An open loop's idle time between arrivals
    stays in the log's clock."""
    from kvpressure.simulation.engine import simulate
    from kvpressure.twin.basis import build_scenario
    from kvpressure.twin.step_time import TwinStepTime

    lines, i, windows = [], 0, []
    for c in sorted(loads):
        steps = simulate(build_scenario(settings, loads[c]),
                         cost_model=TwinStepTime(coefficients)).steps_frame()
        # The requests of a step: its decoding ones and the rest (prompts, as vLLM counts
        # context requests), which the twin's return lag is read from.
        for at, p, d, n, dur in zip(steps["time_s"], steps["num_prefill_tokens"],
                                    steps["num_decode_tokens"], steps["num_scheduled_reqs"],
                                    steps["step_duration_s"], strict=True):
            lines.append(log_line(start + at + dur, i, int(p), int(d), elapsed_share * dur,
                                  int(n - d)))
            i += 1
        end = start + float(steps["time_s"].iloc[-1] + steps["step_duration_s"].iloc[-1])
        windows.append((start, end))
        start = end + 5.0
    path.write_text("".join(lines))
    return windows, i
