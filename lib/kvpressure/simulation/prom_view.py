"""The Prometheus view of a simulated run: what vLLM 0.33.0's ``/metrics`` would have shown.

``PromRecorder`` is the recorder the engine drives (``recorder.py``): the accounting of
``prom_accounting.py`` (what vLLM counts, and when) with a scrape clock, each scrape rendered
by ``prom_exposition.py`` (vLLM's families and text format) and kept in a ``ScrapeLog``
(``scrape_log.py``), written as ``metrics.prom.jsonl``.

Scrapes are taken every ``scrape_interval_s`` of simulated time (at ``k * interval``, showing
every event stamped at or before that instant) plus a final one when the run ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.simulation.prom_accounting import PromAccounting
from kvpressure.simulation.prom_exposition import (  # noqa: F401 (this module's public names)
    MODELLED_FAMILIES,
    Exposition,
    format_value,
)
from kvpressure.simulation.scrape_log import ScrapeLog

# A ``metrics.prom.jsonl`` of more scrapes than this (tens of gigabytes) is refused: the run
# asks for an unreasonable file, not for a longer wait. Idle stretches cost no memory per
# scrape (one rendering shared by the whole stretch), so the bound is on the output alone.
MAX_SCRAPES = 500_000


class PromRecorder(PromAccounting):
    """Records a simulated run as vLLM 0.33.0's Prometheus exporter would see it.

    ``cache_config`` holds the ``vllm:cache_config_info`` labels (at least ``num_gpu_blocks``,
    ``block_size``, ``gpu_memory_utilization``, ``enable_prefix_caching``); prefix-cache
    counters move only when ``enable_prefix_caching`` is true there.

    ``time_origin_s`` is the engine clock's reading when the run starts (0 for timed runs; 1.0
    for the fixed clock of step-level runs): scrapes fall at ``time_origin_s + k *
    scrape_interval_s`` and their ``t`` is counted from it. ``epoch_s`` is added to the origin
    for the ``_created`` samples (the wall-clock time the metrics were created).
    """

    def __init__(
        self,
        model_name: str = "simulated",
        *,
        scrape_interval_s: float = 5.0,
        max_model_len: int = 8192,
        cache_config: Mapping[str, Any] | None = None,
        engine: str = "0",
        epoch_s: float = 0.0,
        time_origin_s: float = 0.0,
    ) -> None:
        if not scrape_interval_s > 0:
            raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s!r}")
        config = dict(cache_config or {})
        super().__init__(max_model_len=max_model_len,
                         enable_prefix_caching=bool(config.get("enable_prefix_caching", False)))
        self.model_name = model_name
        self.engine = str(engine)
        self.scrape_interval_s = float(scrape_interval_s)
        self.epoch_s = float(epoch_s)
        self.time_origin_s = float(time_origin_s)
        self.cache_config = {
            "block_size": 16,
            "cache_dtype": "auto",
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.92,
            "num_gpu_blocks": None,
            "num_gpu_blocks_override": None,
            "prefix_caching_hash_algo": "sha256",
            **config,
        }
        self.exposition = Exposition(self.model_name, self.engine,
                                     self.epoch_s + self.time_origin_s, self.cache_config)
        self.scrapes = ScrapeLog(self.time_origin_s, self.scrape_interval_s)
        self._next_scrape_k = 1
        self._boundary = self.time_origin_s + self.scrape_interval_s
        self._last_t = self.time_origin_s
        self._closed = False

    @classmethod
    def for_step_clock(cls, scenario: Any, t0: float = 1.0, dt: float = 0.015625,
                       scrape_every_steps: int = 50) -> PromRecorder:
        """The Prometheus view of a step-level workload under the engine's fixed clock (step k
        at ``t0 + k * dt``), scraped every ``scrape_every_steps`` steps like the reference
        runs' own metrics."""
        s = scenario.settings
        return cls(
            scenario.name or "simulated",
            scrape_interval_s=scrape_every_steps * dt,
            max_model_len=s.max_model_len,
            cache_config={"num_gpu_blocks": s.num_gpu_blocks, "block_size": s.block_size,
                          "enable_prefix_caching": s.enable_prefix_caching},
            time_origin_s=t0,
        )

    # --- scrape clock ------------------------------------------------------------------------
    @property
    def next_scrape_time(self) -> float:
        """Engine-clock time of the next periodic scrape."""
        return self._boundary

    def _advance_boundary(self) -> None:
        self._next_scrape_k += 1
        # k * interval, not a running sum: no drift over thousands of scrapes
        self._boundary = self.time_origin_s + self._next_scrape_k * self.scrape_interval_s

    def _last_due(self, t: float, inclusive: bool) -> int:
        """The last scrape index ``k`` whose boundary lies before ``t`` (at or before it when
        ``inclusive``), by the same float expression as ``_advance_boundary``."""
        origin, dt = self.time_origin_s, self.scrape_interval_s

        def due(k: int) -> bool:
            b = origin + k * dt
            return b <= t if inclusive else b < t

        k = max(self._next_scrape_k - 1, int((t - origin) / dt))
        while due(k + 1):
            k += 1
        while k >= self._next_scrape_k and not due(k):
            k -= 1
        return k

    def _scrape_due(self, t: float, inclusive: bool) -> None:
        """Take the scrapes due before ``t``. Nothing happens between them (every event is
        applied before its own time's scrapes are taken), so they all show one state: it is
        rendered once, whatever the number of scrapes, and an idle stretch costs O(1)."""
        if not (self._boundary <= t if inclusive else self._boundary < t):
            return
        last = self._last_due(t, inclusive)
        count = last - self._next_scrape_k + 1
        text = self._render_escaped()
        self._check_size(count, self.time_origin_s + last * self.scrape_interval_s, len(text))
        self.scrapes.add_periodic(self._next_scrape_k, count, text)
        self._next_scrape_k = last
        self._advance_boundary()

    def _flush_before(self, t: float) -> None:
        """Scrape every boundary strictly before ``t``: an event at ``t`` is not in them."""
        self._apply_pending_leap()
        self._scrape_due(t, False)

    def maybe_scrape(self, t: float) -> None:
        """Called after a step's outputs (stamped ``t``) were applied: take every scrape due at
        or before ``t``."""
        if self._pending_leap is not None:
            self._apply_pending_leap()
        if self._boundary <= t:
            self._scrape_due(t, True)
        if t > self._last_t:
            self._last_t = t

    def finish(self, t: float | None = None) -> None:
        """The run ended at ``t``: take the due scrapes and a final one (once)."""
        if self._closed:
            return
        t = self._last_t if t is None else t
        self.maybe_scrape(t)
        if not self.scrapes or self.scrapes[-1]["t"] < t - self.time_origin_s:
            text = self._render_escaped()
            self._check_size(1, t, len(text))
            self.scrapes.add_final(float(t) - self.time_origin_s, text)
        self._closed = True

    def close(self, t: float | None = None) -> None:
        self.finish(t)

    def _check_size(self, count: int, t: float, text_len: int) -> None:
        if len(self.scrapes) + count > MAX_SCRAPES:
            # Refused as soon as it is known: the file alone would be tens of gigabytes.
            n = len(self.scrapes) + count
            raise InputError(
                f"scrape_interval_s {self.scrape_interval_s:g}: the run reaches "
                f"{float(t) - self.time_origin_s:.4g} s of simulated time, {n:,} scrapes "
                f"(~{n * text_len / 1e9:,.3g} GB of metrics.prom.jsonl; at most "
                f"{MAX_SCRAPES:,}); "
                "raise scrape_interval_s, shorten the idle gaps, or leave the metrics out "
                "(--no-metrics)")

    # --- output ----------------------------------------------------------------------------
    def render(self) -> str:
        """The current state in the Prometheus text format."""
        return self.exposition.render(self)

    def _render_escaped(self) -> str:
        return self.exposition.render_escaped(self)

    def to_jsonl(self) -> str:
        return "".join(self.scrapes.jsonl_lines())

    def write(self, path: str | Path) -> Path:
        """Write ``metrics.prom.jsonl`` (``path`` may be the file or its folder), streamed:
        a long idle stretch is never held in memory as text."""
        path = Path(path)
        if path.is_dir():
            path = path / "metrics.prom.jsonl"
        if not self._closed:
            self.finish()
        with path.open("wb", buffering=1 << 20) as fh:
            for head, body in self.scrapes.jsonl_parts():
                fh.write(head)
                fh.write(body)
        return path
