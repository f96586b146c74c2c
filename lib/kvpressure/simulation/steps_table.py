"""The steps table: one row per engine iteration (``StepRow``), stored by column."""

from __future__ import annotations

from array import array
from struct import Struct
from typing import Any, Final, NamedTuple

# Imported with the module, not at the first flush: a lazy import would land inside the
# simulation's timed loop (tens of milliseconds against a loop of a few).
import numpy as np

# Rows buffered before they move into the columns (Final: a constant in compiled code, not a
# module lookup at every row).
_BLOCK: Final = 2048


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

    Plain steps pack each row into bytes as it comes (one ``struct`` call converts its
    numbers in C; the row is dropped at once), joined and moved into the columns a block at a
    time by numpy's strided copies (one C call per column and block rather than per cell);
    ``columns`` and ``len`` see the buffered rows too."""

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        names = STEP_COLUMNS + (TIME_STEP_COLUMNS if timed else ())
        self._columns: dict[str, array] = {n: array(_typecode(n)) for n in names}
        # Packed rows joined once a block (a growing bytearray would copy itself over and
        # over as it grows).
        self._rows: list[Any] = []  # bytes of one row, or a bytearray of a run of rows
        self._num_rows = 0
        self._pack = _ROW.pack

    def _flush(self) -> None:
        n = self._num_rows
        if n:
            buf = b"".join(self._rows)
            if n < 4:
                # A few rows (a long leap reads the columns): numpy's per-column calls cost
                # more than unpacking them (from 4 rows on, they cost less).
                # An untimed table has no time columns: zip() stops at its last column.
                for col, values in zip(self._columns.values(),
                                       zip(*_ROW.iter_unpack(buf), strict=True),
                                       strict=False):
                    col.extend(values)
            else:
                rows = np.frombuffer(buf, dtype=_row_dtype())
                for name, col in self._columns.items():
                    col.frombytes(rows[name].tobytes())
            self._rows.clear()
            self._num_rows = 0

    @property
    def columns(self) -> dict[str, array]:
        self._flush()
        return self._columns

    def __len__(self) -> int:
        return len(self._columns["step"]) + self._num_rows

    def append(self, row: tuple) -> None:
        """A whole ``StepRow`` as a plain tuple, time fields included (0.0 when untimed)."""
        self._rows.append(self._pack(*row))
        self._num_rows += 1
        if self._num_rows >= _BLOCK:
            self._flush()

    def append_run(self, row: tuple, num_rows: int, usage: list[float], arrivals: int,
                   num_finished: int, num_running_after: int, usage_after: float,
                   t_start: float, durations: Any, ends: Any) -> None:
        """``num_rows`` rows like ``row`` (a ``StepRow`` tuple, that of the first) but for
        ``step`` (counting up), ``kv_usage`` and ``kv_usage_after`` (``usage``), ``arrivals``
        (the first row's; 0 after), the last row's ``finished``, ``num_running_after`` and
        ``kv_usage_after``, and in time mode ``time_s`` (from ``t_start``, then ``ends``) and
        ``step_duration_s`` (``durations``). The packed row is repeated and the few
        columns that differ written over it by numpy, one call each, not one row at a
        time."""
        buf = bytearray(self._pack(*row) * num_rows)
        rows = np.frombuffer(buf, dtype=_row_dtype())
        step0 = row[0]
        rows["step"] = np.arange(step0, step0 + num_rows, dtype=np.int64)
        u = np.array(usage, dtype=np.float64)
        rows["kv_usage"] = u
        rows["kv_usage_after"] = u
        if arrivals and num_rows > 1:
            rows["arrivals"][1:] = 0
        k = num_rows - 1
        rows["finished"][k] = num_finished
        rows["num_running_after"][k] = num_running_after
        rows["kv_usage_after"][k] = usage_after
        if ends is not None:
            times = rows["time_s"]
            times[0] = t_start
            times[1:] = ends[:num_rows - 1]
            rows["step_duration_s"] = durations[:num_rows]
        self._rows.append(buf)
        self._num_rows += num_rows
        if self._num_rows >= _BLOCK:
            self._flush()

    def extend(self, name: str, values) -> None:
        self.columns[name].extend(values)


def _typecode(name: str) -> str:
    return "d" if name in _FLOAT_COLUMNS else "i" if name in _INT32_COLUMNS else "q"


# A row's bytes: every field at its column's width, standard sizes, no padding (the same
# layout for numpy below).
_ROW = Struct("=" + "".join(_typecode(n) for n in StepRow._fields))
_ROW_DTYPE: list[Any] = []


def _row_dtype() -> Any:
    if not _ROW_DTYPE:
        kinds = {"d": np.float64, "i": np.int32, "q": np.int64}
        _ROW_DTYPE.append(np.dtype([(n, kinds[_typecode(n)]) for n in StepRow._fields]))
    return _ROW_DTYPE[0]
