"""A sweep point's completion marker: what the point is, its files' sizes and hashes, its row.

Written last, after every file of the point, so a point folder with a valid marker whose files
all match it is complete; anything else (no marker, another point's key, a file cut by a kill
or a full disk, a file too many) is not, and a rerun simulates that point again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kvpressure.folders.output_folder import file_sha256

POINT_MARKER = ".kvpressure-point.json"


def point_key(*parts: Any) -> str:
    """A stable hash of what determines a point's results."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.iterdir()) if p.is_file() and p.name != POINT_MARKER
    }


def write_point_marker(folder: str | os.PathLike[str], key: str, row: dict[str, Any]) -> None:
    folder = Path(folder)
    data = {"key": key, "complete": True, "files": _files(folder), "row": row}
    tmp = folder / f"{POINT_MARKER}.tmp"
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / POINT_MARKER)


def complete_row(folder: str | os.PathLike[str], key: str) -> dict[str, Any] | None:
    """The point's ``runs`` row when its folder is complete for ``key``, else None."""
    folder = Path(folder)
    try:
        data = json.loads((folder / POINT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or data.get("complete") is not True:
        return None
    listed = data.get("files")
    present = {p.name for p in folder.iterdir() if p.name != POINT_MARKER}
    if not isinstance(listed, dict) or set(listed) != present:
        return None
    for name, meta in listed.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != meta.get("size"):
            return None
        if file_sha256(path) != meta.get("sha256"):
            return None
    row = data.get("row")
    return row if isinstance(row, dict) else None
