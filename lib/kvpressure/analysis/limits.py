"""Latency limits, one set of names for the report, ``kvpressure twin`` and ``kvpressure tune``:
``ttft_p95=2s,itl_p95=80ms`` -> ``{"ttft_p95_s": 2.0, "itl_p95_s": 0.08}``.

A level meets the limits when every limited statistic is at or below its limit. The names are
the latencies a level can report (TTFT, ITL, TPOT and end-to-end latency, as ``vllm bench
serve`` measures them: mean and percentiles; TPOT per request, ITL per token gap); each source prices some of them (the twin's simulated
requests, an experiment's cost model), and a limit on one it does not price is refused by
``require_priced`` naming those it does, never dropped without a word.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from kvpressure.errors import InputError

LIMIT_NAMES = ("ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_mean_s",
               "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_mean_s", "tpot_p99_s",
               "e2e_mean_s", "e2e_p99_s")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(s|ms|us)?\s*$")


def _short(names: Iterable[str]) -> str:
    return ", ".join(n.removesuffix("_s") for n in names)


def parse_limits(text: str | None, option: str = "--limits") -> dict[str, float]:
    out: dict[str, float] = {}
    for part in str(text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        key = name.strip().lower().removesuffix("_s") + "_s"
        m = _VALUE.match(value)
        if not sep or key not in LIMIT_NAMES or not m:
            raise InputError(
                f"{option} {part.strip()!r}: give NAME=VALUE with NAME one of "
                f"{_short(LIMIT_NAMES)} and VALUE in s, ms or us (e.g. ttft_p95=2s,itl_p95=80ms)")
        limit = float(m.group(1)) * _UNITS[m.group(2) or "s"]
        if not 0 < limit < math.inf:
            raise InputError(f"{option} {part.strip()!r}: the limit must be a finite time > 0")
        out[key] = limit
    return out


def require_priced(limits: Mapping[str, float], priced: Iterable[str], source: str,
                   option: str = "--limits") -> None:
    """Refuse a limit on a latency ``source`` does not price, naming those it does."""
    priced = tuple(priced)
    bad = [k for k in limits if k not in priced]
    if bad:
        raise InputError(f"{option} {_short(bad)}: not priced by {source}, which prices "
                         f"{_short(priced)}")


def format_limits(limits: Mapping[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} <= {seconds(v)}" for k, v in limits.items()) \
        or "no latency limit"


def seconds(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


def broken(level: Mapping[str, float], limits: Mapping[str, float]) -> list[str]:
    """The limits a level breaks, as text (empty: it meets them all)."""
    return [f"{k.removesuffix('_s')} {seconds(float(level[k]))} > {seconds(v)}"
            for k, v in limits.items() if not float(level[k]) <= v]


# vllm bench serve --goodput KEY:VALUE ...: per-request limits in milliseconds.
GOODPUT_KEYS = {"ttft": "ttft_limit_s", "tpot": "tpot_limit_s", "e2el": "e2el_limit_s"}


def parse_goodput(items: Iterable[str], option: str = "--goodput") -> dict[str, float | None]:
    """``["ttft:500", "tpot:50"]`` (``vllm bench serve --goodput``'s words, values in ms) ->
    ``{"ttft_limit_s": 0.5, "tpot_limit_s": 0.05, "e2el_limit_s": None}``: a request is good
    when it meets every limit given; a key not given limits nothing."""
    out: dict[str, float | None] = dict.fromkeys(GOODPUT_KEYS.values())
    for item in items:
        for part in str(item).split():
            key, sep, value = part.partition(":")
            m = _VALUE.match(value)
            if not sep or key.strip().lower() not in GOODPUT_KEYS or not m or m.group(2):
                raise InputError(
                    f"{option} {part!r}: give KEY:VALUE with KEY one of "
                    f"{', '.join(GOODPUT_KEYS)} and VALUE in milliseconds, as vllm bench serve "
                    "takes it (e.g. --goodput ttft:500 tpot:50)")
            limit = float(m.group(1)) / 1000.0
            if not 0 < limit < math.inf:
                raise InputError(f"{option} {part!r}: the limit must be > 0")
            out[GOODPUT_KEYS[key.strip().lower()]] = limit
    if all(v is None for v in out.values()):
        raise InputError(f"{option}: give at least one KEY:VALUE (e.g. ttft:500)")
    return out
