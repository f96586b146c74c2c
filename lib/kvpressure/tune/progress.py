"""Progress lines with the rate so far and the time left at that rate."""

from __future__ import annotations

import time
from collections.abc import Callable


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Counts finished configurations; ``every_s`` apart at most, one line to ``sink``."""

    def __init__(self, total: int, reused: int, sink: Callable[[str], None] | None,
                 every_s: float = 2.0) -> None:
        self.total = total
        self.reused = reused
        self.done = 0
        self.sink = sink
        self.every_s = every_s
        self.started = time.perf_counter()
        self._last = -float("inf")

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        todo = self.total - self.reused
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (todo - self.done) / rate if rate > 0 else float("nan")
        left = _clock(eta) if eta == eta else "?"
        return (f"[{self.reused + self.done}/{self.total}] configurations "
                f"({self.reused} reused), {rate:.2f}/s, elapsed {_clock(elapsed)}, "
                f"ETA {left}")

    def advance(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.sink is not None and (now - self._last >= self.every_s
                                      or self.reused + self.done >= self.total):
            self._last = now
            self.sink(self.line())
