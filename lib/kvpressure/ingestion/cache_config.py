"""The engine's KV-cache geometry as ``vllm:cache_config_info`` exports it in its labels.

vLLM writes the cache config's fields as label values, unset ones as the string ``None``; a
field that is absent, ``None`` or unreadable is left out of the result, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from kvpressure.ingestion.counters import select
from kvpressure.ingestion.labels import parse_labels
from kvpressure.ingestion.names import CACHE_CONFIG_INFO

_FIELDS: dict[str, Callable[[str], Any]] = {
    "num_gpu_blocks": lambda x: int(float(x)),
    "block_size": lambda x: int(float(x)),
    "enable_prefix_caching": lambda x: x.strip().lower() == "true",
    "gpu_memory_utilization": float,
}


def cache_config(series: pd.DataFrame, run: str | None = None) -> dict[str, Any]:
    """``num_gpu_blocks``, ``block_size``, ``enable_prefix_caching`` and
    ``gpu_memory_utilization`` from the labels of ``vllm:cache_config_info``, where present.

    With several label sets (a restart with other settings) a field comes from the first set
    (in label order) that has it.
    """
    out: dict[str, Any] = {}
    for key in select(series, CACHE_CONFIG_INFO, None, run):
        labels = parse_labels(key)
        for name, conv in _FIELDS.items():
            raw = labels.get(name)
            if name in out or raw in (None, "", "None"):
                continue
            try:
                out[name] = conv(raw)
            except ValueError:
                pass
    return out
