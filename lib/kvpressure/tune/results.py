"""Results streamed to disk as they arrive: ``results.jsonl``, one finished configuration a
line, flushed and synced before the next batch is awaited.

A crash, a ``kill -9`` or Ctrl-C loses only the batches still running; a rerun into the same
folder reads the lines back and runs only what is missing. A line counts only when it is whole
(the last one may have been cut mid-write) and carries the same target identity (the same
experiment or twin, the same kit version); any other line is left out of the run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"


class ResultStore:
    def __init__(self, folder: str | os.PathLike[str], identity: str) -> None:
        self.path = Path(folder) / RESULTS
        self.identity = identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: Any = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Finished configurations of this identity, by id; a cut last line is dropped from
        the file so the next line starts clean."""
        done: dict[str, dict[str, Any]] = {}
        if not self.path.is_file():
            return done
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(len(whole))
        for line in whole.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("identity") == self.identity and "id" in rec:
                done[str(rec["id"])] = rec
        return done

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
        for rec in records:
            self._fh.write(json.dumps({"identity": self.identity, **rec}, sort_keys=True,
                                      allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
