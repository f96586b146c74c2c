"""A Prometheus histogram as vLLM's exporter (prometheus_client) keeps one: counts per bucket
under the ``le`` rule (value <= bound), the number of observations, and ``_sum``, the running
sum of the observations in the order they were made, bit for bit."""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, chain, repeat


class Histogram:
    """Cumulative-bucket histogram with prometheus_client's ``le`` rule (value <= bound).

    Single observations wait in ``pending`` until the numbers are read (``counts``, ``n``,
    ``total``, ``flush``): then they are bucketed and summed in bulk, in order, which costs
    less than one bisection and three updates per observation."""

    __slots__ = ("bounds", "_counts", "_total", "_n", "pending")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound (+Inf)
        self._total = 0.0
        self._n = 0
        self.pending: list[float] = []

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative), the last one above every bound."""
        self.flush()
        return self._counts

    @property
    def n(self) -> int:
        self.flush()
        return self._n

    @property
    def total(self) -> float:
        self.flush()
        return self._total

    def observe(self, value: float) -> None:
        self.pending.append(value)

    def numbers(self) -> tuple[int, float, list[int]]:
        """``(n, total, counts)`` with every pending observation in (one call for a
        rendering, instead of three properties)."""
        if self.pending:
            self.flush()
        return self._n, self._total, self._counts

    def flush(self) -> None:
        pending = self.pending
        if not pending:
            return
        # The exporter's _sum is the running sum: added value by value, in order (in C).
        self._total = deque(accumulate(pending, initial=self._total), maxlen=1)[0]
        self._n += len(pending)
        bounds, counts = self.bounds, self._counts
        if len(pending) < 8 or self._total != self._total:  # few, or a NaN among them
            for v in pending:
                counts[bisect_left(bounds, v)] += 1
        else:
            # Values <= each bound, from the sorted values: one bisection per bucket.
            ordered = sorted(pending)
            below = 0
            for i, bound in enumerate(bounds):
                upto = bisect_right(ordered, bound)
                counts[i] += upto - below
                below = upto
            counts[-1] += len(ordered) - below
        pending.clear()

    def observe_repeated(self, value: float, times: int) -> None:
        """``times`` observations of one value (added one by one, as a server would)."""
        if times <= 0:
            return
        self.flush()
        self._counts[bisect_left(self.bounds, value)] += times
        self._total = running_sum(self._total, [value], [times])
        self._n += times

    def observe_runs(self, values: list[float], times: list[int]) -> None:
        """``times[i]`` observations of ``values[i]``, in order."""
        self.flush()
        bounds, counts = self.bounds, self._counts
        for v, c in zip(values, times):  # noqa: B905 (parallel lists)
            counts[bisect_left(bounds, v)] += c
        self._total = running_sum(self._total, values, times)
        self._n += sum(times)


# Integers up to this are exact in a double.
_EXACT_INTS = 2 ** 53


def running_sum(total: float, values: list[float], times: list[int]) -> float:
    """``total`` plus ``times[i]`` copies of ``values[i]``, added one by one in order, as the
    exporter's ``_sum`` grows: float addition is not associative, so the result is that of
    the sequence, bit for bit.

    When every partial sum is exactly representable the sequence has no rounding at all and
    its result is the exact sum, found with integers in one step per run. That holds when all
    the numbers are multiples of ``1/D`` (``D`` the largest of their power-of-two
    denominators) and no partial sum exceeds ``2**53 / D`` in magnitude: the fixed clock of
    step-level runs (gaps in multiples of 1/64 s) and integer observations always qualify.
    Otherwise the additions are made one by one: in numpy when a timed run has loaded it,
    else by the iterator chain (both in C). Short runs take the chain at once: checking for
    the shortcut would cost more than the additions."""
    count = sum(times)
    ratios = None
    if count > 32 + 8 * len(values):
        try:
            num, den = total.as_integer_ratio()
            ratios = [v.as_integer_ratio() for v in values]
        except (AttributeError, OverflowError, ValueError):  # inf, nan: no shortcut
            ratios = None
    if ratios is not None:
        d = max(den, *(r[1] for r in ratios))
        bound = abs(num) * (d // den) + sum(abs(a) * (d // b) * c
                                            for (a, b), c in zip(ratios, times))  # noqa: B905
        if bound <= _EXACT_INTS:
            exact = num * (d // den) + sum(a * (d // b) * c
                                           for (a, b), c in zip(ratios, times))  # noqa: B905
            # (a zero result keeps the sign the sequence gives it: -0.0 only from -0.0)
            if exact or math.copysign(1.0, total) > 0:
                return exact / d
    np = sys.modules.get("numpy")
    if np is not None and count > 256:
        seq = np.repeat(np.asarray(values, dtype=np.float64), times)
        seq[0] += total  # the first addition of the sequence
        return float(np.add.accumulate(seq)[-1])
    seq = chain.from_iterable(map(repeat, values, times))
    return deque(accumulate(seq, initial=total), maxlen=1)[0]
