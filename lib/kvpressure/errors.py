"""Errors the command line turns into exit code 2 with a clear message."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class InputError(ValueError):
    """Invalid user input: a file, field, line or parameter the kit cannot use.

    The message must name what is wrong and where (file, line, field, request id).
    """


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a typo (``mdoe`` -> ``mode``), or None when none is close."""
    import difflib

    match = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return match[0] if match else None


def refuse_unknown(keys: Iterable[Any], known: Iterable[str], where: str) -> None:
    """InputError for the first key not in ``known``, suggesting the nearest valid name.

    ``where`` names the file and field holding the keys (``"run.json: settings"``).
    """
    known = list(known)
    for key in keys:
        if key in known:
            continue
        guess = nearest(key, known)
        hint = f"; did you mean {guess!r}?" if guess else f"; known: {', '.join(sorted(known))}"
        raise InputError(f"{where}: unknown key {key!r}{hint}")
