"""The canonical label string of the ``series`` table: ``k=v,k=v`` sorted by key.

A value holding ``,``, ``=`` or ``\\`` has it backslash-escaped, so the string always splits
back into the same labels (``parse_labels``). Bucket bounds (``le``) and quantiles are written
the way ``prometheus_client`` writes them (``0.5``, ``1.0``, ``+Inf``) whatever the source
spelled, so a bucket read from a text dump and from a Prometheus server is the same series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

_NUMERIC_LABELS = ("le", "quantile")


def _escape(value: str) -> str:
    if "\\" in value or "," in value or "=" in value:
        return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    return value


def normalize_bound(value: str) -> str:
    """``1`` / ``1.0`` / ``1e0`` -> ``1.0``; ``+Inf`` / ``inf`` -> ``+Inf``."""
    try:
        x = float(value)
    except ValueError:
        return value
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(x)


def format_labels(labels: Mapping[str, str], drop: Iterable[str] = ()) -> str:
    """Canonical ``k=v,k=v`` string, keys sorted, ``drop`` keys left out."""
    dropped = set(drop)
    parts = []
    for key in sorted(labels):
        if key in dropped or key == "__name__":
            continue
        value = labels[key]
        if key in _NUMERIC_LABELS:
            value = normalize_bound(value)
        parts.append(f"{key}={_escape(value)}")
    return ",".join(parts)


def parse_labels(text: object) -> dict[str, str]:
    """Inverse of ``format_labels`` (NaN or "" -> {})."""
    if not isinstance(text, str) or not text:
        return {}
    out: dict[str, str] = {}
    key: str | None = None
    buf: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            buf.append(text[i + 1])
            i += 2
            continue
        if ch == "=" and key is None:
            key, buf = "".join(buf), []
        elif ch == ",":
            if key is not None:
                out[key] = "".join(buf)
            key, buf = None, []
        else:
            buf.append(ch)
        i += 1
    if key is not None:
        out[key] = "".join(buf)
    return out
