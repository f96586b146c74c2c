"""A ``kvpressure collect`` run folder read as the sources it stands for.

``collect`` writes its levels' bench results under ``bench/``, the scrape log beside them, the
server's log when it was given, and the engine arguments with where each came from in
``engine.json`` (the layout: :mod:`kvpressure.live.runner`). Its own report reads those
parts; so does ``report --source RUN_DIR`` on a folder collected with ``--no-report``, which
otherwise would see a scrape log alone (one run, no curve) and assume the engine's settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError

ENGINE_JSON = "engine.json"
LEVELS_JSON = "levels.json"
SCRAPE_LOG = "metrics.prom.jsonl"
# The server's log as it stood when the sweep ended: the running server goes on writing the
# file given, and the report reads its inputs once, unchanged.
SERVER_LOG_COPY = "server.log"
BENCH_DIR = "bench"


@dataclass
class CollectFolder:
    """What a run folder gives a report: its sources, in the order its own report reads them,
    the engine arguments it was told or read, where each came from, and the model."""

    path: Path
    sources: list[Path]
    engine_args: dict[str, Any] = field(default_factory=dict)
    engine_args_from: dict[str, str] = field(default_factory=dict)
    model_name: str = ""


def is_collect_folder(path: Path) -> bool:
    return path.is_dir() and (path / LEVELS_JSON).is_file() and (path / BENCH_DIR).is_dir()


def _has_scrapes(log: Path) -> bool:
    # A server whose /metrics never answered leaves an empty log: the curve alone, then.
    if not log.is_file():
        return False
    with open(log, encoding="utf-8", errors="replace") as fh:
        return any('"text"' in line for line in fh)


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable as a collect run's JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a collect run's JSON object")
    return doc


def read_collect_folder(path: Path, server_log: Path | None = None) -> CollectFolder:
    """The folder's parts. ``server_log`` overrides the copy in the folder (the sweep that
    is writing the folder passes the one it copied)."""
    path = Path(path)
    sources = [path / BENCH_DIR]
    if _has_scrapes(path / SCRAPE_LOG):
        sources.append(path / SCRAPE_LOG)
    log = server_log if server_log is not None else path / SERVER_LOG_COPY
    if log.is_file():
        sources.append(log)
    engine = _json(path / ENGINE_JSON) if (path / ENGINE_JSON).is_file() else {}
    args = dict(engine.get("engine_args") or {})
    given_from = engine.get("engine_args_from") or {}
    where = f"{path / ENGINE_JSON}"
    origin = {k: f"{given_from[k]} (recorded in {where})" if k in given_from
              else f"recorded in {where}" for k in args}
    model = str(_json(path / LEVELS_JSON).get("model") or "")
    return CollectFolder(path, sources, args, origin, model)


def expand(sources: list[str]) -> tuple[list[str], list[CollectFolder]]:
    """``sources`` with each collect run folder replaced by its parts, and those folders."""
    out: list[str] = []
    folders: list[CollectFolder] = []
    for s in sources:
        path = Path(s)
        if is_collect_folder(path):
            folder = read_collect_folder(path)
            folders.append(folder)
            out.extend(str(p) for p in folder.sources)
        else:
            out.append(s)
    return out, folders
