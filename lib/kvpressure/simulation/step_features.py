"""What a cost model needs to price one engine step (or many at once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class StepFeatures:
    """Work of one step; each field is a scalar, or a numpy array with one entry per step
    when a leap (``leap.py``) prices a run of decode-only steps at once.

    * ``num_prefill_tokens``: tokens of prefill chunks (prompt, recompute, resumed prefill).
    * ``num_decode_seqs``: requests decoding one token.
    * ``num_prefill_seqs``: requests given a prefill chunk.
    * ``sum_decode_ctx``: sum over decoding requests of their context after the step
      (``num_computed_tokens + 1``: the tokens the new token attends to, itself included).
    * ``sum_prefill_attn``: sum over prefill chunks of ``p * (c + p / 2)`` (chunk of ``p``
      tokens after ``c`` computed ones: the causal attention work).
    * ``sum_prefill_ctx``: sum over prefill chunks of ``c + p``.
    """

    num_prefill_tokens: Any = 0
    num_decode_seqs: Any = 0
    num_prefill_seqs: Any = 0
    sum_decode_ctx: Any = 0
    sum_prefill_attn: Any = 0.0
    sum_prefill_ctx: Any = 0
