"""The steps table: one row per engine iteration (``StepRow``), stored by column."""

from __future__ import annotations

from array import array
from struct import pack
from typing import NamedTuple

# Rows buffered before they move into the columns.
_BLOCK = 512


class StepRow(NamedTuple):
    """One row of steps.csv (docs/scheduler.md#loop-row): ``num_running``, ``num_waiting*``
    and ``kv_usage`` are read right after ``schedule()``, the ``*_after`` ones after
    ``update_from_output()``. ``time_s`` and ``step_duration_s`` are kept in time mode only."""

    step: int
    arrivals: int
    num_running: int
    num_scheduled_reqs: int
    num_waiting: int
    num_waiting_new: int
    num_waiting_preempted: int
    num_waiting_deferred: int
    kv_usage: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    admitted_new: int
    resumed: int
    recomputed_tokens: int
    preemptions: int
    finished: int
    num_running_after: int
    num_waiting_after: int
    kv_usage_after: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    time_s: float = 0.0
    step_duration_s: float = 0.0


TIME_STEP_COLUMNS = ("time_s", "step_duration_s")
STEP_COLUMNS = StepRow._fields[:-len(TIME_STEP_COLUMNS)]
_FLOAT_COLUMNS = {"kv_usage", "kv_usage_after", "time_s", "step_duration_s"}
# Counts of requests fit 32 bits (a run cannot hold 2^31 requests); steps and token counts
# keep 64. Half the bytes of most columns of a long run.
_INT32_COLUMNS = {"arrivals", "num_running", "num_scheduled_reqs", "num_waiting",
                  "num_waiting_new", "num_waiting_preempted", "num_waiting_deferred",
                  "admitted_new", "resumed", "preemptions", "finished", "num_running_after",
                  "num_waiting_after"}


class StepsTable:
    """One row per engine iteration, stored by column (compact ``array``s).

    Plain steps append whole rows to a short buffer, moved into the columns a block at a
    time (``zip(*rows)`` and ``struct.pack`` run in C: one Python call per column and block
    rather than per cell); ``columns`` and ``len`` see the buffered rows too."""

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        names = STEP_COLUMNS + (TIME_STEP_COLUMNS if timed else ())
        self._columns: dict[str, array] = {
            n: array("d" if n in _FLOAT_COLUMNS else "i" if n in _INT32_COLUMNS else "q")
            for n in names}
        self._rows: list[tuple] = []

    def _flush(self) -> None:
        rows = self._rows
        if rows:
            n = len(rows)
            if n < 32:
                # A few rows (a leap reads the columns): not worth a format string per column.
                for col, values in zip(self._columns.values(), zip(*rows)):  # noqa: B905
                    col.extend(values)
            else:
                for col, values in zip(self._columns.values(), zip(*rows)):  # noqa: B905
                    # struct converts each number in C; array.extend parses each one as a
                    # call argument, three times slower (the same bytes either way).
                    col.frombytes(pack(f"{n}{col.typecode}", *values))
            rows.clear()

    @property
    def columns(self) -> dict[str, array]:
        self._flush()
        return self._columns

    def __len__(self) -> int:
        return len(self._columns["step"]) + len(self._rows)

    def append(self, row: tuple) -> None:
        # An untimed table has no time columns: zip() below stops at the last column.
        rows = self._rows
        rows.append(row)
        if len(rows) >= _BLOCK:
            self._flush()

    def extend(self, name: str, values) -> None:
        self.columns[name].extend(values)
