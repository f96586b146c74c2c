"""The scrapes of a simulated run, as ``metrics.prom.jsonl`` holds them: one line per scrape,
``{"t": seconds, "text": "<Prometheus text format>"}``, written as ``json.dumps(scrape,
separators=(", ", ": "))`` would. Consecutive scrapes of one unchanged state (an idle stretch)
share one rendering: memory grows with the number of distinct renderings, not of scrapes."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Sequence


class ScrapeLog(Sequence):
    """The scrapes of a run as a sequence of ``{"t", "text"}`` dicts, stored as runs: each
    periodic run is (first index ``k``, count, text) with ``t = (origin + k * interval) -
    origin`` (the boundary's own expression, so times are those of scrapes taken one by one),
    and the final scrape has its own ``t``. A run of a million idle scrapes is one entry. The
    text is kept as written in the file (JSON-escaped) and unescaped when read here."""

    def __init__(self, origin: float, interval: float) -> None:
        self.origin = origin
        self.interval = interval
        # (first k or None for a final scrape, count, t of a final scrape, text)
        self.runs: list[tuple[int | None, int, float, str]] = []
        self._starts: list[int] = []
        self._len = 0

    def add_periodic(self, k: int, count: int, text: str) -> None:
        if count > 0:
            self._starts.append(self._len)
            self.runs.append((k, count, 0.0, text))
            self._len += count

    def add_final(self, t: float, text: str) -> None:
        self._starts.append(self._len)
        self.runs.append((None, 1, t, text))
        self._len += 1

    def __len__(self) -> int:
        return self._len

    def _t(self, k: int) -> float:
        return float(self.origin + k * self.interval) - self.origin

    def _run_items(self, run: tuple[int | None, int, float, str], lo: int, hi: int):
        k, _count, t, escaped = run
        text = json.loads('"' + escaped + '"')
        if k is None:
            yield {"t": t, "text": text}
            return
        for j in range(lo, hi):
            yield {"t": self._t(k + j), "text": text}

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("scrape index out of range")
        r = bisect_right(self._starts, index) - 1
        return next(self._run_items(self.runs[r], index - self._starts[r],
                                    index - self._starts[r] + 1))

    def __iter__(self):
        for run in self.runs:
            yield from self._run_items(run, 0, run[1])

    def jsonl_lines(self) -> Iterable[str]:
        """The lines of ``metrics.prom.jsonl``, as ``json.dumps(scrape, separators=(", ",
        ": "))`` writes them."""
        for head, body in self.jsonl_parts():
            yield (head + body).decode("ascii")

    def jsonl_parts(self) -> Iterable[tuple[bytes, bytes]]:
        """Each line as its ``{"t": ...`` head and its text part (escaped once per run and
        shared by the run's lines; JSON escaping leaves only ASCII)."""
        for k, count, t, escaped in self.runs:
            body = (', "text": "' + escaped + '"}\n').encode("ascii")
            if k is None:
                yield ('{"t": ' + json.dumps(t)).encode("ascii"), body
            else:
                for j in range(count):
                    yield ('{"t": ' + json.dumps(self._t(k + j))).encode("ascii"), body
