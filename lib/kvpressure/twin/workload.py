"""The twin's workload: the measured closed loop, level by level.

Each level replays ``num_requests`` requests at its concurrency, like ``vllm bench serve
--max-concurrency C --num-prompts N --request-rate inf``. The lengths are, best first: the
exact prompt and output lengths of the level's requests (a bench result saved with
``--save-detailed``, or a simulated point's ``requests.csv``), in their order; otherwise every
request gets the level's mean lengths (from the token totals), which is said in the twin's
assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvpressure.errors import InputError


@dataclass(frozen=True)
class LevelWorkload:
    concurrency: int
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    exact: bool
    """True: the measured requests' own lengths; False: the level's mean lengths."""
    return_steps: int = 0
    """Engine steps a client takes to send its next request after a finish
    (docs/scheduler.md#loop-closed-return)."""
    first_alone: bool = False
    """The level's first request reaches the engine one step ahead of the others."""

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    def requests(self) -> list[dict[str, Any]]:
        return [{"id": f"r{i}", "prompt_len": int(p), "output_len": int(o)}
                for i, (p, o) in enumerate(zip(self.prompt_lens, self.output_lens, strict=True))]

    def max_sequence_tokens(self) -> int:
        return max(p + o for p, o in zip(self.prompt_lens, self.output_lens, strict=True))

    def describe(self) -> dict[str, Any]:
        n = self.num_requests
        return {
            "concurrency": self.concurrency,
            "num_requests": n,
            "lengths": "measured per request" if self.exact else "level mean (assumed fixed)",
            "prompt_len_mean": sum(self.prompt_lens) / n,
            "output_len_mean": sum(self.output_lens) / n,
            "prompt_len_range": [min(self.prompt_lens), max(self.prompt_lens)],
            "output_len_range": [min(self.output_lens), max(self.output_lens)],
            "return_steps": self.return_steps,
            "first_alone": self.first_alone,
        }


def level_workloads(measured: Any) -> dict[int, LevelWorkload]:
    """One ``LevelWorkload`` per measured level (``Measured`` from ``measured.py``)."""
    out: dict[int, LevelWorkload] = {}
    for _, row in measured.levels.iterrows():
        c = int(row["concurrency"])
        if c in measured.lengths:
            ins, outs = measured.lengths[c]
            out[c] = LevelWorkload(c, tuple(ins), tuple(outs), True)
            continue
        n, p, o = row["num_requests"], row["input_len_mean"], row["output_len_mean"]
        if any(not isinstance(v, float) or math.isnan(v) for v in (n, p, o)) or n < 1:
            raise InputError(
                f"{measured.run_dir / 'runs.csv'}: concurrency {c}: the request lengths are not "
                "in the data (needs num_requests, duration_s, output_throughput and "
                "total_token_throughput, or a bench result saved with --save-detailed)")
        n_i = int(round(n))
        out[c] = LevelWorkload(c, (max(1, round(p)),) * n_i, (max(1, round(o)),) * n_i, False)
    return out
