"""How the kit says a number and a level: the vocabulary every sentence is made of.

The sentences themselves live in :mod:`kvpressure.report.sentences`; what is here is what
lower layers word too (the focus level's reason names the level axis), so it sits below them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpressure.jsonable import finite_or_none as finite

NO_DATA = "no data"


def num(value: Any, digits: int = 3) -> str:
    """A number as a reader writes it: whole numbers without a decimal point (a level is "16",
    not "16.0") and with thousands separators, others to ``digits`` significant figures."""
    f = finite(value)
    if f is None:
        return NO_DATA
    if f.is_integer():
        return f"{int(f):,}"
    return f"{f:,.{digits}g}" if abs(f) < 1000 else f"{f:,.0f}"


@dataclass(frozen=True)
class LevelWords:
    """How a sweep's levels are said: closed-loop clients or offered load in requests/s."""

    axis: str
    singular: str
    plural: str
    unit: str
    label: str
    """The axis of a figure."""
    more: str
    """What a larger level adds, as the subject of a sentence ("more clients")."""
    lowers: str
    """"lower" or "lowers", to agree with ``more``."""

    def at(self, value: Any, bold: bool = False) -> str:
        """``concurrency 16`` or ``request rate 2 req/s`` (the number bold when asked)."""
        n = f"**{num(value)}**" if bold else num(value)
        return f"{self.singular} {n}{self.unit}"


_CONCURRENCY = LevelWords("concurrency", "concurrency", "concurrency levels", "",
                          "concurrency (clients)", "more clients", "lower")
_REQUEST_RATE = LevelWords("request_rate", "request rate", "request rates", " req/s",
                           "offered load (requests/s)", "more offered load", "lowers")


def level_words(axis: str | None = "concurrency") -> LevelWords:
    """The words of a level axis (``concurrency`` or ``request_rate``)."""
    return _REQUEST_RATE if axis == "request_rate" else _CONCURRENCY
