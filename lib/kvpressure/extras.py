"""The optional parts of an install: which extra a command needs, checked before it starts.

The core install runs the command line (simulate, sweep, capacity, ingest, knee, twin, tune,
scrape, collect --no-report, analyse, verify-vllm, init); running the notebooks and rendering the
page needs the ``[report]`` extra. A command that needs a missing extra stops with one line naming
what to install (exit 2), before it loads a server or writes a folder, not with an ImportError
from deep inside a run.
"""

from __future__ import annotations

import importlib.util

from kvpressure.errors import InputError

# extra -> the top-level modules it provides (what is looked for, without importing them).
EXTRAS: dict[str, tuple[str, ...]] = {
    "report": ("papermill", "nbconvert", "nbformat", "nbclient", "ipykernel", "seaborn",
               "bleach", "ipywidgets", "tqdm"),
    "lab": ("jupyterlab",),
    "dask": ("distributed",),
    "parquet": ("pyarrow",),
}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` this interpreter cannot import."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, what: str, otherwise: str = "") -> None:
    """Refuse ``what`` (a command, an option) when ``extra`` is not installed; ``otherwise``:
    how to do without it."""
    absent = missing(extra)
    if absent:
        raise InputError(
            f"{what} needs kvpressure's [{extra}] extra ({', '.join(absent)} not installed): "
            f"pip install 'kvpressure[{extra}]'" + (f" ({otherwise})" if otherwise else ""))
