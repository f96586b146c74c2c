"""The unit of work a worker runs: a batch of configurations on one target.

Batching keeps the scheduler's cost per task (pickling the target, a round trip to the Dask
scheduler) small beside the simulations; a batch's records come back together and are
written to disk when the batch finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def run_batch(target: Any, configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate ``configs`` in order; a pure function of its arguments (no worker state), so a
    batch lost with its worker can run again anywhere with the same result."""
    return [target.evaluate(config) for config in configs]


def batch_size(todo: int, slots: int, requested: int | None = None) -> int:
    """Configurations per task: ``requested``, else enough tasks for about eight per worker
    slot (so a slow batch at the end leaves little idle time), at most 16 configurations (so a
    Ctrl-C or a lost worker costs little and results reach the disk steadily)."""
    if requested is not None:
        return max(1, int(requested))
    if todo <= 0:
        return 1
    return max(1, min(16, todo // max(1, 8 * slots)))
