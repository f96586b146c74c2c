"""Latency limits: ``ttft_p95=2s,itl_p95=80ms`` -> ``{"ttft_p95_s": 2.0, "itl_p95_s": 0.08}``.

A level of a configuration meets the limits when every limited percentile is at or below its
limit; goodput is then the output throughput of the best level that does (see ``ranking``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kvpressure.errors import InputError

# Every latency a tune level reports (experiment and twin alike).
LIMIT_NAMES = ("ttft_p50_s", "ttft_p95_s", "ttft_mean_s", "itl_p95_s", "itl_p99_s",
               "itl_mean_s", "e2e_mean_s")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(s|ms|us)?\s*$")


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
                f"{', '.join(n.removesuffix('_s') for n in LIMIT_NAMES)} and VALUE in s, ms "
                "or us (e.g. ttft_p95=2s,itl_p95=80ms)")
        limit = float(m.group(1)) * _UNITS[m.group(2) or "s"]
        if not limit > 0:
            raise InputError(f"{option} {part.strip()!r}: the limit must be > 0")
        out[key] = limit
    return out


def format_limits(limits: Mapping[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} <= {_seconds(v)}" for k, v in limits.items()) \
        or "no latency limit"


def _seconds(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


def broken(level: Mapping[str, float], limits: Mapping[str, float]) -> list[str]:
    """The limits a level breaks, as text (empty: it meets them all)."""
    return [f"{k.removesuffix('_s')} {_seconds(float(level[k]))} > {_seconds(v)}"
            for k, v in limits.items() if not float(level[k]) <= v]
