"""The twin's workload: the measured load, level by level.

A closed-loop level replays ``num_requests`` requests at its concurrency, like ``vllm bench
serve --max-concurrency C --num-prompts N --request-rate inf``. An open-loop level (``vllm bench
serve --request-rate R`` without a client limit) replays them at their arrival times: the
measured send times (``start_times`` of a result saved with ``--save-detailed``), else a seeded
draw of the arrival process ``vllm bench serve`` uses (gaps from a gamma distribution of mean
``1 / R`` and shape ``burstiness``; 1 is Poisson), which the twin's assumptions say.

The lengths are, best first: the exact prompt and output lengths of the level's requests (a
bench result saved with ``--save-detailed``, or a simulated point's ``requests.csv``), in their
order; otherwise made from what the data has (``lengths.py``: the bench result's dataset
arguments, the scrape log's length histograms), else every request gets the level's mean
lengths (from the token totals); the twin's assumptions say which, level by level.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpressure.errors import InputError
from kvpressure.folders.layout import RUNS_CSV

# Other versions of a level the data cannot tell apart (``LevelWorkload.redrawn``), seeds 1..N:
# what the twin's preemption ranges and a remedy's interval are read over. The lowest and
# highest of N draws hold on average (N - 1) / (N + 1) of the distribution: 88% for 16, near
# the 90% the kit's other intervals claim (8 draws hold 78%: a level of the first-chunk sweep
# in tests/data/twin_saved/quiet measured 197 preemptions against 142-178 over 8 draws and
# 141-192 over 16).
REDRAWS = 16


@dataclass(frozen=True)
class LevelWorkload:
    concurrency: int
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    exact: bool
    """True: the measured requests' own lengths; False: the level's mean lengths."""
    return_steps: int = 0
    """Engine steps a client takes to send its next request after a finish
    (docs/scheduler.md#loop-closed-return)."""
    first_alone: bool = False
    """The level's first request reaches the engine one step ahead of the others."""
    request_rate: float | None = None
    """Open loop: the level's request rate (req/s); ``concurrency`` is then 0 (no limit)."""
    arrival_times_s: tuple[float, ...] | None = None
    """Open loop: each request's arrival, seconds from the first."""
    arrivals_measured: bool = True
    """Open loop: the arrivals are the measured send times (False: drawn at the rate)."""
    lengths_source: str = ""
    """Where the lengths came from (``lengths.py``: PER_REQUEST, DATASET_ARGS, HISTOGRAMS,
    MEANS; empty: given by the caller)."""
    lengths_detail: str = ""
    drawn_from: Any = field(default=None, compare=False, repr=False)
    """The ``lengths.LevelLengths`` the lengths are one draw of (None: not a draw)."""

    def redrawn(self, seed: int) -> LevelWorkload:
        """Another version of the level the data cannot tell from this one: its lengths drawn
        again where they are a draw, and, in a closed loop, the requests it sends at once (the
        first ``concurrency``) in another order. Those reach the engine core together, in an
        order no bench result or scrape records, and past the pool's capacity which of them is
        admitted first moves the level's preemptions by tens of percent."""
        got = self
        if self.drawn_from is not None and self.drawn_from.drawn:
            lengths = self.drawn_from.redrawn(seed)
            got = dataclasses.replace(self, prompt_lens=lengths.prompt_lens,
                                      output_lens=lengths.output_lens, drawn_from=lengths)
        together = min(self.concurrency, self.num_requests)
        if self.open_loop or together < 2:
            return got
        order = [int(i) for i in np.random.default_rng(seed).permutation(together)]
        order += range(together, self.num_requests)
        return dataclasses.replace(got, prompt_lens=tuple(got.prompt_lens[i] for i in order),
                                   output_lens=tuple(got.output_lens[i] for i in order))

    @property
    def open_loop(self) -> bool:
        return self.arrival_times_s is not None

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    def requests(self) -> list[dict[str, Any]]:
        out = [{"id": f"r{i}", "prompt_len": int(p), "output_len": int(o)}
               for i, (p, o) in enumerate(zip(self.prompt_lens, self.output_lens, strict=True))]
        if self.arrival_times_s is not None:
            for r, t in zip(out, self.arrival_times_s, strict=True):
                r["arrival_time_s"] = float(t)
        return out

    def max_sequence_tokens(self) -> int:
        return max(p + o for p, o in zip(self.prompt_lens, self.output_lens, strict=True))

    def describe(self) -> dict[str, Any]:
        n = self.num_requests
        return {
            "concurrency": self.concurrency,
            "num_requests": n,
            "lengths": "measured per request" if self.exact else (
                self.lengths_source or "level mean (assumed fixed)"),
            **({"lengths_detail": self.lengths_detail} if self.lengths_detail else {}),
            "prompt_len_mean": sum(self.prompt_lens) / n,
            "output_len_mean": sum(self.output_lens) / n,
            "prompt_len_range": [min(self.prompt_lens), max(self.prompt_lens)],
            "output_len_range": [min(self.output_lens), max(self.output_lens)],
            **({"request_rate": self.request_rate,
                "arrivals": "measured send times" if self.arrivals_measured
                else "drawn at the rate (seeded)",
                "arrival_span_s": max(self.arrival_times_s, default=0.0)}
               if self.arrival_times_s is not None else
               {"return_steps": self.return_steps, "first_alone": self.first_alone}),
        }


def drawn_arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0
                   ) -> tuple[float, ...]:
    """``n`` arrival times from 0 at ``rate`` req/s, gaps gamma-distributed with mean ``1 /
    rate`` and shape ``burstiness`` (the process of ``vllm bench serve --request-rate
    --burstiness``), seeded; every one at 0 for an infinite rate."""
    if not math.isfinite(rate):
        return (0.0,) * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=max(n - 1, 0))
    return (0.0, *np.cumsum(gaps).tolist())


def level_workloads(measured: Any) -> dict[Any, LevelWorkload]:
    """One ``LevelWorkload`` per measured level (``Measured`` from ``measured.py``), keyed as
    the levels are (``Measured.key``)."""
    from kvpressure.twin.lengths import from_means, from_measured
    from kvpressure.twin.measured import level_name, level_value

    out: dict[Any, LevelWorkload] = {}
    for _, row in measured.levels.iterrows():
        c = level_value(row[measured.key], measured.key)
        drawn = measured.drawn_lengths.get(c)
        if c in measured.lengths:
            ins, outs = (tuple(v) for v in measured.lengths[c])
            exact, made = True, from_measured(ins, outs)
        elif drawn is not None:
            ins, outs, exact, made = drawn.prompt_lens, drawn.output_lens, False, drawn
        else:
            n, p, o = row["num_requests"], row["input_len_mean"], row["output_len_mean"]
            if any(not isinstance(v, float) or math.isnan(v) for v in (n, p, o)) or n < 1:
                raise InputError(
                    f"{measured.run_dir / RUNS_CSV}: {level_name(c, measured.key)}: the "
                    "request lengths are not in the data (needs num_requests, duration_s, "
                    "output_throughput and total_token_throughput, or a bench result saved "
                    "with --save-detailed)")
            made = from_means(int(round(n)), p, o)
            ins, outs, exact = made.prompt_lens, made.output_lens, False
        said = LevelWorkload(c, ins, outs, exact, lengths_source=made.source,
                             lengths_detail=made.detail, drawn_from=made if made.drawn else None)
        if not measured.open_loop:
            out[c] = said
            continue
        sent = measured.arrivals.get(c)
        measured_times = sent is not None and len(sent) == len(ins)
        times = (tuple(sent) if measured_times else
                 drawn_arrivals(len(ins), c, measured.burstiness.get(c, 1.0)))
        out[c] = dataclasses.replace(said, concurrency=0, request_rate=c,
                                     arrival_times_s=times, arrivals_measured=measured_times)
    return out
