"""Each level's request lengths when the data has no per-request arrays, and where they came from.

A random-length workload's preemptions come from its spread: every request at the level's mean
length fills the pool in lockstep, so the twin needs the shape, not only the mean. Best first:

1. the per-request ``input_lens`` / ``output_lens`` of a result saved with ``--save-detailed``
   (or a simulated point's ``requests.csv``): the lengths themselves, in the order sent
   (``measured.py``);
2. the dataset arguments the bench result records (``vllm bench serve --dataset-name random``
   with ``--metadata random_input_len=... random_output_len=... random_range_ratio=... seed=...``)
   when the lengths they draw add up to the level's measured token totals: then they are the
   requests' own lengths, drawn as ``vllm bench serve`` draws them (``random_dataset_lengths``);
3. the request-length histograms of the scrape log over the level's window
   (``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``): a uniform range fitted
   to the bucket counts with the measured mean (the shape of ``--dataset-name random``), or,
   when no uniform range explains the counts, the histogram's own piecewise-linear shape; drawn
   seeded and shuffled;
4. the dataset arguments whose draws do not add up to the totals (named as such);
5. the token counters' means, every request alike: the spread is unknown, which the twin's
   verdict says and its intervals widen for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

PER_REQUEST = "per-request lengths"
DATASET_ARGS = "bench dataset arguments"
HISTOGRAMS = "scrape-log histograms"
MEANS = "token-counter means"
PROMPT_FAMILY = "vllm:request_prompt_tokens"
OUTPUT_FAMILY = "vllm:request_generation_tokens"
# The draws agree with the measured totals to this share when they are the requests' own.
_TOTALS_TOL = 0.005


@dataclass(frozen=True)
class LevelLengths:
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    source: str
    """One of PER_REQUEST, DATASET_ARGS, HISTOGRAMS, MEANS."""
    detail: str
    """How the lengths were made, in words (for the twin's assumptions)."""
    specs: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    """A drawn source's two distributions (prompts, outputs), for ``redrawn``."""

    @property
    def spread_known(self) -> bool:
        return self.source != MEANS

    @property
    def drawn(self) -> bool:
        """The lengths are one seeded draw of a distribution (another seed, another draw)."""
        return bool(self.specs)

    def redrawn(self, seed: int) -> LevelLengths:
        """Another draw of the same distributions (a drawn source only)."""
        if not self.specs:
            raise ValueError("redrawn: the lengths are not a draw")
        return _drawn(self.specs, self.detail.rsplit("; drawn seeded", 1)[0],
                      len(self.prompt_lens), seed)


def random_dataset_lengths(n: int, input_len: int, output_len: int,
                           range_ratio: float | Mapping[str, float] = 0.0, *, seed: int = 0,
                           prefix_len: int = 0, num_special: int = 0
                           ) -> tuple[list[int], list[int]]:
    """The prompt and output lengths ``vllm bench serve --dataset-name random`` gives ``n``
    requests (vLLM 0.33, ``benchmarks/datasets``): integers uniform on ``[floor(L (1 - r)),
    ceil(L (1 + r))]`` from one ``numpy.random.default_rng(seed)``, every prompt length first,
    then every output length; ``L`` is ``input_len`` less the tokenizer's ``num_special``
    tokens, which the server's tokenizer adds back, and every prompt carries ``prefix_len``."""
    r_in, r_out = ((float(range_ratio["input"]), float(range_ratio["output"]))
                   if isinstance(range_ratio, Mapping) else (float(range_ratio),) * 2)
    real = max(0, int(input_len) - int(num_special))
    lo_in, hi_in = math.floor(real * (1 - r_in)), math.ceil(real * (1 + r_in))
    lo_out = max(1, math.floor(output_len * (1 - r_out)))
    hi_out = max(1, math.ceil(output_len * (1 + r_out)))
    rng = np.random.default_rng(seed)
    ins = rng.integers(lo_in, hi_in + 1, size=n)
    outs = rng.integers(lo_out, hi_out + 1, size=n)
    extra = int(prefix_len) + int(num_special)
    return [int(v) + extra for v in ins], [int(v) for v in outs]


def _arg(res: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if res.get(name) not in (None, ""):
            return res[name]
    return None


def dataset_args(res: Mapping[str, Any]) -> dict[str, Any] | None:
    """The random dataset's arguments a bench result records (``--metadata KEY=VALUE`` writes
    them as strings at the top level), or None when it records none or another dataset."""
    name = _arg(res, "dataset_name", "dataset")
    ins, outs = _arg(res, "random_input_len", "input_len"), _arg(res, "random_output_len",
                                                                  "output_len")
    if ins is None or outs is None or (name is not None and str(name) != "random"):
        return None
    ratio: Any = _arg(res, "random_range_ratio") or 0.0
    try:
        if isinstance(ratio, str) and ratio.strip().startswith("{"):
            ratio = {k: float(v) for k, v in json.loads(ratio).items()}
        elif not isinstance(ratio, Mapping):
            ratio = float(ratio)
        out = {"input_len": int(float(ins)), "output_len": int(float(outs)),
               "range_ratio": ratio,
               "prefix_len": int(float(_arg(res, "random_prefix_len") or 0)),
               "seed": None if _arg(res, "seed") is None else int(float(res["seed"]))}
    except (TypeError, ValueError, AttributeError):
        return None
    return out


def from_dataset_args(res: Mapping[str, Any], n: int, totals: tuple[float, float]
                      ) -> tuple[LevelLengths, bool] | None:
    """The level's lengths from the bench result's dataset arguments, and whether they add up
    to the measured ``totals`` (prompt tokens, output tokens of the ``n`` requests). The
    tokenizer's special tokens are not in the result: 0 to 2 are tried, the one whose prompts
    add up kept."""
    args = dataset_args(res)
    if args is None or n < 1:
        return None
    seed = args["seed"] if args["seed"] is not None else 0
    best: tuple[float, int, list[int], list[int]] | None = None
    for special in (0, 1, 2):
        ins, outs = random_dataset_lengths(n, args["input_len"], args["output_len"],
                                           args["range_ratio"], seed=seed,
                                           prefix_len=args["prefix_len"], num_special=special)
        miss = abs(sum(ins) - totals[0]) / max(totals[0], 1.0)
        if best is None or miss < best[0]:
            best = (miss, special, ins, outs)
    assert best is not None  # three tries, the first always kept
    miss_in, special, ins, outs = best
    miss_out = abs(sum(outs) - totals[1]) / max(totals[1], 1.0)
    adds_up = miss_in <= _TOTALS_TOL and miss_out <= _TOTALS_TOL
    ratio = args["range_ratio"]
    shown = (f"{ratio['input']:g}/{ratio['output']:g}" if isinstance(ratio, Mapping)
             else f"{ratio:g}")
    detail = (f"vllm bench serve --dataset-name random --random-input-len {args['input_len']} "
              f"--random-output-len {args['output_len']} --random-range-ratio {shown}"
              + (f" --random-prefix-len {args['prefix_len']}" if args["prefix_len"] else "")
              + f" --seed {seed}"
              + ("" if args["seed"] is not None else " (the seed not recorded: vllm bench "
                 "serve's default assumed)")
              + f", drawn as vllm bench serve draws them ({special} special token(s))")
    detail += ("; they add up to the measured token totals" if adds_up else
               f"; their totals miss the measured ones by {100 * miss_in:.1f}% (prompts) and "
               f"{100 * miss_out:.1f}% (outputs): not the requests' own lengths, their spread "
               "only")
    return LevelLengths(tuple(ins), tuple(outs), DATASET_ARGS, detail), adds_up


def _bucket_counts(buckets: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(upper edges, observations in each bucket) from cumulative counts by ``le``."""
    edges = buckets.index.to_numpy(float)
    cum = buckets.to_numpy(float)
    return edges, np.diff(np.concatenate([[0.0], cum]))


def _uniform_fit(edges: np.ndarray, counts: np.ndarray, mean: float
                 ) -> tuple[int, int, bool] | None:
    """The integer range ``[a, b]`` centred on ``mean`` whose uniform distribution gives the
    bucket counts the highest likelihood, and whether that range is pinned (False: every
    range up to the buckets' edges explains them alike, the middle one is taken); None when no
    uniform explains the counts (a bucket's share off by more than a two-sided 1% test)."""
    n = counts.sum()
    widths = np.arange(0, max(1, math.floor(mean - 1)) + 1)
    lows, highs = np.round(mean - widths), np.round(mean + widths)
    lower = np.concatenate([[-np.inf], edges[:-1]])
    # P(a <= X <= e) for integer X uniform on [a, b], X <= e meaning X <= floor(e).
    def cdf(e: np.ndarray) -> np.ndarray:
        fe = np.floor(np.minimum(e, 1e12))[None, :]
        return np.clip((fe - lows[:, None] + 1) / (highs - lows + 1)[:, None], 0.0, 1.0)
    p = cdf(edges) - cdf(lower)
    seen = counts[None, :] > 0
    # A bucket with observations that the range cannot reach rules the range out.
    terms = np.where(seen, counts[None, :] * np.log(np.where(p > 0, p, 1.0)), 0.0)
    loglik = np.where((seen & (p <= 0)).any(axis=1), -np.inf, terms.sum(axis=1))
    best = np.nanmax(loglik)
    if not np.isfinite(best):
        return None
    top = np.flatnonzero(loglik >= best - 1e-9)
    k = int(top[len(top) // 2])
    expected = p[k] * n
    if np.any(np.abs(counts - expected) > 2.58 * np.sqrt(np.maximum(expected, 1.0)) + 1.0):
        return None
    return int(lows[k]), int(highs[k]), len(top) == 1


def _piecewise(edges: np.ndarray, counts: np.ndarray, n: int, rng: np.random.Generator,
               cap: float) -> np.ndarray:
    """``n`` draws from the histogram's piecewise-linear distribution (uniform within each
    bucket, the first from 1, the open one up to ``cap``)."""
    lower = np.concatenate([[1.0], edges[:-1]])
    top = cap if math.isfinite(cap) else 2.0 * lower[-1]
    upper = np.where(np.isfinite(edges), edges, max(top, lower[-1] + 1.0))
    which = rng.choice(len(counts), size=n, p=counts / counts.sum())
    return rng.uniform(lower[which], upper[which])


def _fit_family(series: pd.DataFrame, family: str, t0: float, t1: float, cap: float
                ) -> tuple[tuple[Any, ...], str] | None:
    """What draws one family's lengths (a uniform range, else the bucket shape) and how it
    was fitted, in words; None without observations in the window."""
    from kvpressure.ingestion.counters import histogram_buckets, histogram_mean

    buckets = histogram_buckets(series, family, t0, t1)
    mean = histogram_mean(series, family, t0, t1)
    if buckets.empty or not math.isfinite(mean) or buckets.iloc[-1] < 1:
        return None
    edges, counts = _bucket_counts(buckets)
    counts = np.maximum(counts, 0.0)
    seen = int(round(counts.sum()))
    fit = _uniform_fit(edges, counts, mean)
    if fit is not None:
        a, b, pinned = fit
        return ("uniform", a, b, mean), (
            f"uniform on [{a}, {b}] around the mean {mean:.0f}"
            + ("" if pinned else " (the buckets do not pin the width: the middle of the "
               "widths they allow)") + f" ({seen} observations)")
    return ("buckets", edges, counts, mean, cap), (
        f"the histogram's own shape, uniform within its buckets, mean {mean:.0f} "
        f"({seen} observations)")


def _draw(spec: tuple[Any, ...], n: int, rng: np.random.Generator) -> tuple[int, ...]:
    if spec[0] == "uniform":
        values = rng.integers(spec[1], spec[2] + 1, size=n).astype(float)
    else:
        values = _piecewise(spec[1], spec[2], n, rng, spec[4])
    mean = spec[-2] if spec[0] == "buckets" else spec[-1]
    # The draw keeps the measured mean: throughput follows the tokens, not the draw's luck.
    if values.mean() > 0:
        values = values * (mean / values.mean())
    return tuple(int(v) for v in np.maximum(1, np.round(values)))


def _drawn(specs: tuple[tuple[Any, ...], tuple[Any, ...]], said: str, n: int, seed: int
           ) -> LevelLengths:
    rng = np.random.default_rng(seed)
    ins, outs = _draw(specs[0], n, rng), _draw(specs[1], n, rng)
    return LevelLengths(ins, outs, HISTOGRAMS, said + f"; drawn seeded ({seed})", specs)


def from_histograms(series: pd.DataFrame, t0: float, t1: float, n: int, *, seed: int = 0,
                    cap: float = math.inf) -> LevelLengths | None:
    """The level's lengths from the scrape log's request-length histograms over ``(t0, t1]``
    (a uniform range fitted to each, else its piecewise shape), ``n`` requests drawn seeded;
    each draw keeps the histogram's measured mean (``LevelLengths.redrawn``: another seed).
    None when the window has no observations of either family."""
    got = [_fit_family(series, f, t0, t1, cap) for f in (PROMPT_FAMILY, OUTPUT_FAMILY)]
    if got[0] is None or got[1] is None:
        return None
    said = (f"{PROMPT_FAMILY} and {OUTPUT_FAMILY} over the level's window: prompts "
            f"{got[0][1]}; outputs {got[1][1]}")
    return _drawn((got[0][0], got[1][0]), said, n, seed)


def from_measured(prompt_lens: tuple[int, ...], output_lens: tuple[int, ...]) -> LevelLengths:
    return LevelLengths(prompt_lens, output_lens, PER_REQUEST,
                        "each request's own prompt and output length, in the order sent")


def from_means(n: int, prompt_mean: float, output_mean: float) -> LevelLengths:
    return LevelLengths((max(1, round(prompt_mean)),) * n, (max(1, round(output_mean)),) * n,
                        MEANS, "every request at the level's mean prompt and output length "
                        "(token counters / requests): the spread is not in the data (no "
                        "per-request lengths, no length histograms, no dataset arguments), so "
                        "preemptions from long requests are not modelled")
