"""What the server was started with that ingestion needs and its metrics may not say.

vLLM exports the pool's geometry (``vllm:cache_config_info``: ``num_gpu_blocks``,
``block_size``, ``enable_prefix_caching``) but not the scheduler's rules (``scheduling_policy``,
``scheduler_reserve_full_isl``); the recompute estimate reads all five. Each fact keeps vLLM's
name from the command line (``kvpressure ingest --block-size``) or an ``engine_args`` mapping
to the estimate, so no fact is renamed on the way. None is unknown: the metrics decide, or the
estimate widens to cover every value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineFacts:
    num_gpu_blocks: int | None = None  # the KV pool's blocks (vllm:cache_config_info)
    block_size: int | None = None  # tokens a block
    enable_prefix_caching: bool | None = None
    scheduling_policy: str | None = None  # "fcfs" or "priority"
    scheduler_reserve_full_isl: bool | None = None  # admission by whole prompt (True) or chunk

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> EngineFacts:
        """The facts of an ``engine_args`` mapping (a collect folder's ``engine.json``, a
        notebook's ``engine_args``, a simulation's settings, where the policy may be written
        ``policy``): the same for the ``runs`` table and stage 02, so both give one number."""
        return cls(
            num_gpu_blocks=settings.get("num_gpu_blocks"),
            block_size=settings.get("block_size"),
            enable_prefix_caching=settings.get("enable_prefix_caching"),
            scheduling_policy=settings.get("scheduling_policy", settings.get("policy")),
            scheduler_reserve_full_isl=settings.get("scheduler_reserve_full_isl"),
        )
