"""Reading a text file the user gave: anything unreadable is refused naming the file.

A binary file, a file in another encoding or a folder where a file was expected is the user's
mistake, reported as an ``InputError`` (exit 2), never as a decoding traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError


def read_user_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The UTF-8 text of ``path``; InputError naming the file when it is missing, a folder,
    binary or not UTF-8 (with the line of the first bad byte)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a folder, expected a {what}") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in data[:1 << 16]:
        raise InputError(f"{p}: binary data, not a text {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{p}, line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start}); save the {what} as UTF-8") from None
    return text.removeprefix("\ufeff")


def parse_user_yaml(text: str, where: str | os.PathLike[str]) -> Any:
    """``text`` parsed as YAML; InputError naming ``where`` and the line when it is not YAML."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{os.fspath(where)}{line}: not valid YAML: {exc}") from None
