"""Errors the command line turns into exit code 2 with a clear message."""

from __future__ import annotations


class InputError(ValueError):
    """Invalid user input: a file, field, line or parameter the kit cannot use.

    The message must name what is wrong and where (file, line, field, request id).
    """
