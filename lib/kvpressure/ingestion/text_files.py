"""A source file's text: gunzipped when it is gzip, refused when it is not UTF-8, JSON read
strictly; every reader of ingestion opens its files through here, naming the file on a bad byte."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def open_text(path: Path) -> io.TextIOBase:
    """A text stream over ``path``, gunzipped when it is gzip; a byte that is not UTF-8 is an
    InputError naming the file (Latin-1 read as text would put wrong names in the tables)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    errors = _not_utf8_handler(path)
    if magic == GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors=errors)
    return open(path, encoding="utf-8", errors=errors)


def _not_utf8_handler(path: Path) -> str:
    """The name of a codec error handler refusing ``path``'s first byte that is not UTF-8."""
    import codecs

    name = f"kvpressure-utf8:{path}"

    def refuse(exc: UnicodeError) -> tuple[str, int]:
        byte = exc.object[exc.start] if isinstance(exc, UnicodeDecodeError) else 0
        raise InputError(f"{path}: not UTF-8 text (byte 0x{byte:02x}); save the file as UTF-8")

    codecs.register_error(name, refuse)
    return name


def parse_json(text: str, path: Path) -> Any:
    """``text`` (the content of ``path``) as JSON; InputError naming the file otherwise (the
    strict reader: a key given twice or absurd nesting is refused too)."""
    from kvpressure.user_files import parse_user_json

    return parse_user_json(text, path)
