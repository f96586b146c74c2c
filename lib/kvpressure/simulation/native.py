"""The simulation's hot modules compiled by mypyc, used when built (``make native``).

The modules of ``COMPILED`` (the exact step, what it calls, and the loop around it) are plain
typed Python; ``scripts/build_native.py`` compiles them with mypyc into ``native_dir()`` (in the
virtual environment) with a stamp of the sources of ``STAMPED`` (those modules and the ones
they import, whose classes compiled code reads by their declared types). When
``kvpressure.simulation`` is imported, the compiled set is put ahead of the sources only if the
stamp matches the sources as they are now and this interpreter: an edited module sends the
whole set back to the sources (half a set could mix two versions of one class), and nothing
has to be rebuilt for a change to take effect. A compiled class cannot be subclassed by Python
code, and a compiled dataclass's class attributes are descriptors: what others subclass or read
that way stays out of ``COMPILED``. ``KVPRESSURE_NATIVE=0`` keeps the sources. The compiled set decides exactly as the
sources do (tests/test_sim_native.py compares the bytes of every output).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

COMPILED = ("request", "block_pool", "kv_cache_manager", "lazy_decode", "scheduler", "engine",
            "leap", "steps_table", "prom_view", "prom_accounting", "prom_histogram",
            "prom_exposition", "scrape_log")
# The compiled code reads these modules' classes by their declared types: a change to them
# makes the set stale too.
STAMPED = (*COMPILED, "outputs", "recorder", "request_path", "scenario", "step_clock",
           "step_features")
STAMP = "stamp.json"
SOURCE_DIR = Path(__file__).resolve().parent


def native_dir() -> Path:
    """Where the compiled set lives: ``$KVPRESSURE_NATIVE_DIR``, else beside the interpreter's
    environment (``<venv>/kvpressure-native``)."""
    env = os.environ.get("KVPRESSURE_NATIVE_DIR")
    return Path(env) if env else Path(sys.prefix) / "kvpressure-native"


def expected_stamp() -> dict[str, object]:
    """The stamp a build from the sources as they are now, for this interpreter, writes."""
    digests = {name: hashlib.sha256((SOURCE_DIR / f"{name}.py").read_bytes()).hexdigest()
               for name in STAMPED}
    return {"cache_tag": sys.implementation.cache_tag, "sources": digests}


def enable(package_path: list[str]) -> bool:
    """Put the compiled set ahead of the sources in ``package_path`` (the package's
    ``__path__``) when it is built from these very sources; True if it was."""
    if os.environ.get("KVPRESSURE_NATIVE", "1") == "0":
        return False
    root = native_dir()
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if stamp != expected_stamp():
        return False
    package_path.insert(0, str(root / "kvpressure" / "simulation"))
    # mypyc's shared runtime module of the set is a top-level module beside the package.
    if str(root) not in sys.path:
        sys.path.append(str(root))
    return True


def active() -> bool:
    """Whether this process runs the compiled set (the modules already imported say so)."""
    mod = sys.modules.get("kvpressure.simulation.scheduler")
    return mod is not None and not (mod.__file__ or "").endswith(".py")
