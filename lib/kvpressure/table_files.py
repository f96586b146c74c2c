"""The kit's tables on disk: CSV, and the same table as Parquet beside it when pyarrow is
installed (``pip install 'kvpressure[parquet]'``), for tools that read Parquet (DuckDB, Spark,
Polars, pandas without parsing)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any


@functools.cache
def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_table(frame: Any, path: str | os.PathLike[str]) -> list[Path]:
    """``frame`` as ``path`` (CSV) and, with pyarrow, ``path`` with ``.parquet``; the files
    written."""
    path = Path(path)
    frame.to_csv(path, index=False, lineterminator="\n")
    written = [path]
    if parquet_available():
        frame.to_parquet(path.with_suffix(".parquet"), index=False)
        written.append(path.with_suffix(".parquet"))
    return written
