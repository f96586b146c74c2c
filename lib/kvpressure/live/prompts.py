"""The requests of a load level: prompts as token ids and output lengths, from a seed.

Token ids are drawn uniformly from ``[low, high)``; the default range (10-1000) lies inside
every tokenizer's vocabulary and avoids the lowest ids, where special tokens usually sit. A
prompt of ``n`` ids is exactly ``n`` prompt tokens on the server. Lengths are fixed, or uniform
in ``[len*(1-r), len*(1+r)]`` with ``range_ratio`` r, as ``vllm bench serve --random-range-ratio``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpressure.errors import InputError

DEFAULT_TOKEN_IDS = (10, 1000)


def parse_token_range(text: str) -> tuple[int, int]:
    """``"LOW:HIGH"`` -> (low, high); InputError naming the option otherwise."""
    low, sep, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo, hi = -1, -1
    if not sep or lo < 0 or hi <= lo:
        raise InputError(f"--token-ids {text!r}: give LOW:HIGH with 0 <= LOW < HIGH, e.g. 10:1000")
    return lo, hi


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> np.ndarray:
    if ratio <= 0:
        return np.full(n, mean, dtype=np.int64)
    lo = max(1, int(np.floor(mean * (1 - ratio))))
    hi = max(lo, int(np.ceil(mean * (1 + ratio))))
    return rng.integers(lo, hi + 1, size=n)


@dataclass(frozen=True)
class RequestSource:
    """Request ``k`` of a stream, drawn from its own seed: never a repeat of another request
    (a repeated prompt would be served from the prefix cache), the same on every run."""

    input_len: int
    output_len: int
    seed: int
    stream: int = 0  # one stream per level, one for the warm-up
    range_ratio: float = 0.0
    token_ids: tuple[int, int] = DEFAULT_TOKEN_IDS

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise InputError(f"--input-len/--output-len: must be >= 1, got {self.input_len}/"
                             f"{self.output_len}")
        if not 0 <= self.range_ratio < 1:
            raise InputError(f"--range-ratio: must be in [0, 1), got {self.range_ratio}")

    def __call__(self, k: int) -> tuple[list[int], int]:
        rng = np.random.default_rng([self.seed, self.stream, k])
        n_in = int(_lengths(rng, 1, self.input_len, self.range_ratio)[0])
        n_out = int(_lengths(rng, 1, self.output_len, self.range_ratio)[0])
        low, high = self.token_ids
        return rng.integers(low, high, size=n_in).tolist(), n_out
