"""Errors the command line turns into exit code 2 with a clear message."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Exit codes, one meaning each (the README's table).
EXIT_BUG = 1            # a bug in the kit: one line on screen, the traceback in a log
EXIT_INPUT = 2          # the input's fault: a file, field, line or option named
EXIT_WOULD_NOT_START = 3  # capacity: vLLM would refuse to start with these settings
EXIT_DIVERGES = 4       # verify-vllm: a workload's steps differ from vLLM's
EXIT_INCOMPLETE = 5     # collect, verify-remedy: a live run ended early (a server failed it)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM


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
