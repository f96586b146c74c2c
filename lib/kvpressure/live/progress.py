"""The per-level progress line of ``kvpressure collect``.

On a terminal the line is redrawn in place twice a second; into a file or a pipe it is written
every ``every_s`` seconds and once at the level's end, so a CI log stays readable.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class LevelProgress:
    concurrency: int
    planned: int | None  # requests, or None in duration mode
    duration_s: float | None
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 10.0
    engine: str = "builtin"  # with vllm-bench the requests are counted only at the end
    done: int = 0
    failed: int = 0
    tokens: int = 0
    preemptions: float | None = None  # since the level started, from the latest scrape
    running: float | None = None
    waiting: float | None = None
    started: float = field(default_factory=time.monotonic)
    _last_draw: float = field(default_factory=time.monotonic)  # the first line after every_s
    label: str | None = None  # the level's name when not a concurrency (r=2/s, trace)

    @property
    def name(self) -> str:
        return f"{self.label:<8}" if self.label else f"c={self.concurrency:<4}"

    @property
    def tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        of = f"/{self.planned}" if self.planned else ""
        span = f"{elapsed:5.1f}/{self.duration_s:g} s" if self.duration_s else f"{elapsed:5.1f} s"
        if self.engine == "vllm-bench" and not self.done:
            parts = [self.name, "vllm bench serve running", span]
        else:
            parts = [self.name, f"{self.done}{of} req", span,
                     f"{self.tokens / elapsed if elapsed > 0 else 0.0:7.1f} tok/s"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.preemptions is not None:
            parts.append(f"preemptions {self.preemptions:.0f}")
        if self.running is not None:
            parts.append(f"running {self.running:.0f} waiting {self.waiting or 0:.0f}")
        return "  ".join(parts)

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            if force or now - self._last_draw >= 0.5:
                self.stream.write("\r\033[K" + self.line())
                self.stream.flush()
                self._last_draw = now
        elif force or now - self._last_draw >= self.every_s:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last_draw = now

    def finish(self, verdict: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(f"{self.line()}  -> {verdict}\n")
        self.stream.flush()
