"""What ``ingest()`` read and recognised: the report written as ``ingest.json``.

The fields are the file's keys in its order; ``sources`` holds one entry a source read (its
``location``, ``kind`` and ``run``, and what was read of it), ``runs`` one entry a run (its
generation, scrapes, metrics present and missing, counter origin, recompute estimate...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpressure import VLLM_BEHAVIOUR_VERSION, __version__
from kvpressure.jsonable import to_jsonable


@dataclass
class IngestReport:
    kvpressure_version: str = __version__
    vllm_behaviour_version: str = VLLM_BEHAVIOUR_VERSION
    sources: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)  # a live server's silences
    options: dict[str, Any] = field(default_factory=dict)  # the options it was read with
    tables: dict[str, int] = field(default_factory=dict)  # rows of series and runs

    def to_dict(self) -> dict[str, Any]:
        """The report as ``ingest.json`` holds it (plain JSON values, missing numbers null)."""
        return to_jsonable(self)
