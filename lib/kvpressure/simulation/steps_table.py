"""The steps table: one row per engine iteration (``StepRow``), stored by column."""

from __future__ import annotations

import sys
from array import array
from struct import Struct
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from kvpressure.simulation.scheduler import SchedulerOutput

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
    time by strided copies (one C call per column and block rather than one per cell): by
    numpy when it is loaded (its copies are the faster), else by ``memoryview`` (a run on the
    step clock needs no numpy, whose import would cost a short run's process more than its
    loop; the bytes are the same);
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
                # A few rows (a long leap reads the columns): the strided copies cost more
                # than unpacking them.
                # An untimed table has no time columns: zip() stops at its last column.
                for col, values in zip(self._columns.values(),
                                       zip(*_ROW.iter_unpack(buf), strict=True),
                                       strict=False):
                    col.extend(values)
            else:
                np = sys.modules.get("numpy")
                if np is not None:
                    rows = np.frombuffer(buf, dtype=_row_dtype(np))
                    for name, col in self._columns.items():
                        col.frombytes(rows[name].tobytes())
                else:
                    for name, col in self._columns.items():
                        col.frombytes(_column_bytes(buf, name))
            self._rows.clear()
            self._num_rows = 0

    @property
    def columns(self) -> dict[str, array]:
        self._flush()
        return self._columns

    def __len__(self) -> int:
        return len(self._columns["step"]) + self._num_rows

    def add_step(self, step: int, arrivals: int, num_running: int, num_waiting: int,
                 num_waiting_preempted: int, num_waiting_deferred: int, kv_usage: float,
                 out: SchedulerOutput, num_finished: int, num_running_after: int,
                 num_waiting_after: int, kv_usage_after: float, time_s: float = 0.0,
                 step_duration_s: float = 0.0) -> None:
        """One step's row: the queues and the KV usage right after ``schedule()`` (``out``,
        what it decided) and after ``update_from_output()`` (``num_finished`` requests
        finished), and in time mode the step's start and duration (dropped when untimed).
        The one place the columns' order is written: packed at once (one ``struct`` call),
        the row kept as bytes until the next flush."""
        if self._num_rows >= _BLOCK:
            # Before the row, not after: the row just added stays the last of ``_rows``
            # (``add_decode_steps`` repeats it).
            self._flush()
        self._rows.append(self._pack(
            step, arrivals, num_running, len(out.granted) + out.num_lazy, num_waiting,
            num_waiting - num_waiting_preempted, num_waiting_preempted, num_waiting_deferred,
            kv_usage, out.num_scheduled_tokens, out.num_prefill_tokens, out.num_decode_tokens,
            out.admitted_new, out.resumed, out.recomputed_tokens, len(out.preempted),
            num_finished, num_running_after, num_waiting_after, kv_usage_after,
            out.prefix_cache_queries, out.prefix_cache_hits, time_s, step_duration_s))
        self._num_rows += 1

    def add_decode_steps(self, step: int, arrivals: int, num_running: int, num_waiting: int,
                         num_waiting_preempted: int, num_waiting_deferred: int,
                         out: SchedulerOutput, usage: list[float], num_finished: int,
                         usage_last: float, t_start: float, durations: Any, ends: Any
                         ) -> None:
        """The rows of a leap (docs/scheduler.md#loop-row): ``len(usage)`` steps from
        ``step``, each with the output ``out`` (the ``num_running`` decoding requests one
        token each, nothing else) and no change to a queue but by the finishes of the last;
        only the step, the KV usage (``usage``, after each step's blocks; ``usage_last``
        after the last step's finishes) and the times (time mode: from ``t_start``, then
        ``ends``, lasting ``durations``) differ. Short leaps go in row by row; longer ones
        as one run of packed rows (the first row repeated, the columns that differ written
        over it by numpy); the longest by column (no run of rows that long is held twice in
        memory while the table joins it)."""
        num_steps = len(usage)
        if num_steps <= _ROWS_MAX:
            t = t_start
            last = num_steps - 1
            for k in range(num_steps):
                time_s = duration = 0.0
                if ends is not None:
                    time_s = t
                    duration = float(durations[k])
                    t = float(ends[k])
                finished = num_finished if k == last else 0
                self.add_step(step + k, arrivals if k == 0 else 0, num_running, num_waiting,
                              num_waiting_preempted, num_waiting_deferred, usage[k], out,
                              finished, num_running - finished, num_waiting,
                              usage_last if k == last else usage[k], time_s, duration)
        elif num_steps <= _RUN_MAX:
            duration = float(durations[0]) if durations is not None else 0.0
            self.add_step(step, arrivals, num_running, num_waiting, num_waiting_preempted,
                          num_waiting_deferred, usage[0], out, 0, num_running, num_waiting,
                          usage[0], t_start, duration)
            self._repeat_last(num_steps, usage, arrivals, num_finished,
                              num_running - num_finished, usage_last, t_start, durations,
                              ends)
        else:
            self._add_decode_columns(step, arrivals, num_running, num_waiting,
                                     num_waiting_preempted, num_waiting_deferred, usage,
                                     num_finished, usage_last, t_start, durations, ends)

    def _repeat_last(self, num_rows: int, usage: list[float], arrivals: int,
                     num_finished: int, num_running_after: int, usage_after: float,
                     t_start: float, durations: Any, ends: Any) -> None:
        """The row just added, as the first of ``num_rows`` like it but for ``step``
        (counting up), ``kv_usage`` and ``kv_usage_after`` (``usage``), ``arrivals`` (the
        first row's; 0 after), the last row's ``finished``, ``num_running_after`` and
        ``kv_usage_after``, and in time mode ``time_s`` (from ``t_start``, then ``ends``) and
        ``step_duration_s`` (``durations``): the packed row repeated and the few columns
        that differ written over it by strided copies, not one row at a time."""
        last: Any = self._rows[-1]  # a packed row: bytes
        buf = bytearray(last * num_rows)
        np = sys.modules.get("numpy")
        if np is not None:
            self._repeat_numpy(np, buf, num_rows, usage, arrivals, num_finished,
                               num_running_after, usage_after, t_start, durations, ends)
            return
        step0: int = _ROW.unpack_from(last)[0]
        _put_column(buf, "step", 0, array("q", range(step0, step0 + num_rows)).tobytes())
        u = array("d", usage).tobytes()
        _put_column(buf, "kv_usage", 0, u)
        _put_column(buf, "kv_usage_after", 0, u)
        if arrivals and num_rows > 1:
            _put_column(buf, "arrivals", 1, bytes(4 * (num_rows - 1)))
        last_row = num_rows - 1
        _put_value(buf, "finished", last_row, num_finished)
        _put_value(buf, "num_running_after", last_row, num_running_after)
        _put_value(buf, "kv_usage_after", last_row, usage_after)
        if ends is not None:
            # The times are float64 arrays (engine.py ``decode_step_times``): their bytes
            # are the column's.
            _put_column(buf, "time_s", 0,
                        array("d", (t_start,)).tobytes() + ends[:num_rows - 1].tobytes())
            _put_column(buf, "step_duration_s", 0, durations[:num_rows].tobytes())
        self._rows[-1] = buf
        self._num_rows += num_rows - 1

    def _repeat_numpy(self, np: Any, buf: bytearray, num_rows: int, usage: list[float],
                      arrivals: int, num_finished: int, num_running_after: int,
                      usage_after: float, t_start: float, durations: Any, ends: Any) -> None:
        """``_repeat_last`` by numpy's strided copies (``buf``: the row repeated)."""
        rows = np.frombuffer(buf, dtype=_row_dtype(np))
        step0 = int(rows["step"][0])
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
        self._rows[-1] = buf
        self._num_rows += num_rows - 1

    def _add_decode_columns(self, step0: int, arrivals: int, num_running: int,
                            num_waiting: int, num_preempted: int, num_deferred: int,
                            usage: list[float], num_finished: int, usage_last: float,
                            t_start: float, durations: Any, ends: Any) -> None:
        """A long leap's rows straight into the columns, by name."""
        num_steps = len(usage)
        cols = self.columns
        cols["step"].extend(range(step0, step0 + num_steps))
        # One array per distinct value and width (request counts in 32 bits, token counts
        # in 64), shared by the columns that repeat it.
        zeros = array("q", (0,)) * num_steps
        zeros32 = array("i", (0,)) * num_steps
        running64 = array("q", (num_running,)) * num_steps
        running32 = array("i", (num_running,)) * num_steps
        waiting32 = array("i", (num_waiting,)) * num_steps if num_waiting else zeros32
        for name in ("num_running", "num_scheduled_reqs", "num_running_after"):
            cols[name].extend(running32)
        for name in ("num_scheduled_tokens", "num_decode_tokens"):
            cols[name].extend(running64)
        for name in ("num_waiting", "num_waiting_after"):
            cols[name].extend(waiting32)
        for name, value in (("num_waiting_new", num_waiting - num_preempted),
                            ("num_waiting_preempted", num_preempted),
                            ("num_waiting_deferred", num_deferred)):
            cols[name].extend(array("i", (value,)) * num_steps if value else zeros32)
        for name in ("num_prefill_tokens", "recomputed_tokens", "prefix_cache_queries",
                     "prefix_cache_hits"):
            cols[name].extend(zeros)
        for name in ("arrivals", "admitted_new", "resumed", "preemptions", "finished"):
            cols[name].extend(zeros32)
        cols["kv_usage"].extend(usage)
        cols["kv_usage_after"].extend(usage)
        # The first step's arrivals; the last step's finishes.
        cols["arrivals"][-num_steps] = arrivals
        cols["finished"][-1] = num_finished
        cols["num_running_after"][-1] = num_running - num_finished
        cols["kv_usage_after"][-1] = usage_last
        if ends is not None:
            cols["time_s"].append(t_start)
            cols["time_s"].extend(ends[:-1].tolist())
            cols["step_duration_s"].extend(durations.tolist())

    def extend(self, name: str, values) -> None:
        self.columns[name].extend(values)


# Leaps up to this many steps long go into the table row by row (one packed row each); up to
# _RUN_MAX as one run of packed rows; longer ones by column.
_ROWS_MAX: Final = 16
_RUN_MAX: Final = 16384


def _typecode(name: str) -> str:
    return "d" if name in _FLOAT_COLUMNS else "i" if name in _INT32_COLUMNS else "q"


# A row's bytes: every field at its column's width and at an offset a multiple of it, the
# row a multiple of 8 bytes (pad bytes between), native byte order (an ``array``'s): a column
# of packed rows is then one strided ``memoryview`` of its own item type.
def _layout() -> tuple[str, dict[str, tuple[int, int]], int]:
    fmt = "="
    out = {}
    offset = 0
    for name in StepRow._fields:
        width = Struct("=" + _typecode(name)).size
        pad = -offset % width
        fmt += "x" * pad + _typecode(name)
        offset += pad
        out[name] = (offset, width)
        offset += width
    pad = -offset % 8
    return fmt + "x" * pad, out, offset + pad


_FORMAT, _FIELDS, _SIZE = _layout()
_ROW = Struct(_FORMAT)
# Each field's (offset in a row, width).
_LAYOUT: Final = _FIELDS


_ROW_DTYPE: list[Any] = []


def _row_dtype(np: Any) -> Any:
    """The packed row as a numpy record (the same offsets and size)."""
    if not _ROW_DTYPE:
        kinds = {"d": np.float64, "i": np.int32, "q": np.int64}
        names = list(StepRow._fields)
        _ROW_DTYPE.append(np.dtype({
            "names": names, "formats": [kinds[_typecode(n)] for n in names],
            "offsets": [_LAYOUT[n][0] for n in names], "itemsize": _SIZE}))
    return _ROW_DTYPE[0]


def _column_bytes(rows: bytes, name: str) -> bytes:
    """The column ``name`` of packed rows, as its array's bytes (one strided copy)."""
    offset, width = _LAYOUT[name]
    whole: Any = memoryview(rows)  # cast by a type code known at run time
    view = whole.cast(_typecode(name))
    return view[offset // width::_SIZE // width].tobytes()


def _put_value(rows: bytearray, name: str, row: int, value: Any) -> None:
    """Write one cell of packed rows (``value`` as it is: an int stays an int when
    compiled, where a tuple of ints and floats would be typed float)."""
    offset, _ = _LAYOUT[name]
    Struct("=" + _typecode(name)).pack_into(rows, row * _SIZE + offset, value)


def _put_column(rows: bytearray, name: str, first: int, values: bytes) -> None:
    """Write the column ``name`` of packed rows from row ``first`` to the last, from its
    values' bytes (one value a row; one strided copy)."""
    offset, width = _LAYOUT[name]
    code = _typecode(name)
    whole: Any = memoryview(rows)  # cast by a type code known at run time
    view = whole.cast(code)
    step = _SIZE // width
    source: Any = memoryview(values)
    view[first * step + offset // width::step] = source.cast(code)
