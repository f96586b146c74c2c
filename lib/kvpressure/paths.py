"""Where the kit finds its built-in data (profiles, experiments)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Built-in data folder: ``$KVPRESSURE_DATA`` if set, else ``data/`` of the checkout."""
    env = os.environ.get("KVPRESSURE_DATA")
    return Path(env) if env else REPO_ROOT / "data"
