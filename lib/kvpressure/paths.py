"""Where the kit finds its built-in files, and where the user's work lives.

Two layouts hold the same files:

- a checkout: ``data/`` (profiles, experiments) and ``notebooks/`` at the top level, beside
  ``lib/kvpressure``;
- an installed wheel: copies of both under ``kvpressure/_builtin/`` (the build puts them there,
  ``setup.py``), keeping their relative layout, so a path the notebooks write relative to their
  folder (``../data/experiments/seed_case.yaml``) means the same file in both.

The kit's root (:func:`kit_root`) is read-only: what the user makes (``reports/``, the current
run) goes under the work root (:func:`work_root`): the checkout, else the project folder
``kvpressure init`` wrote around the working directory, else the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout's root when running from one (tests and the Makefile use it); in an installed
# wheel it is a folder of the environment that holds none of the kit's files.
REPO_ROOT = PACKAGE_DIR.parents[1]
BUILTIN_DIR = PACKAGE_DIR / "_builtin"
DATA_ENV = "KVPRESSURE_DATA"
# The notebook whose presence marks a folder holding the investigation's notebooks.
_FIRST_NOTEBOOK = "01_collect.ipynb"


def checkout_root() -> Path | None:
    """The checkout these sources run from, or None for an installed package."""
    if (PACKAGE_DIR == REPO_ROOT / "lib" / "kvpressure" and (REPO_ROOT / "pyproject.toml").is_file()
            and (REPO_ROOT / "data").is_dir() and (REPO_ROOT / "notebooks").is_dir()):
        return REPO_ROOT
    return None


def kit_root() -> Path:
    """The folder holding the built-in ``data/`` and ``notebooks/``: the checkout, else the
    installed package's ``_builtin``."""
    return checkout_root() or BUILTIN_DIR


def data_dir() -> Path:
    """Built-in data folder: ``$KVPRESSURE_DATA`` if set, else the kit's ``data/``."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else kit_root() / "data"


def notebooks_dir() -> Path:
    """The investigation's notebooks as the kit ships them."""
    return kit_root() / "notebooks"


def is_project(folder: Path) -> bool:
    """Whether ``folder`` holds the investigation's notebooks (a checkout or a ``kvpressure
    init`` folder) and is not the installed package's own copy."""
    return (folder / "notebooks" / _FIRST_NOTEBOOK).is_file() and not (
        folder == PACKAGE_DIR or PACKAGE_DIR in folder.parents)


def work_root() -> Path:
    """Where relative paths are read from and ``reports/`` is written: the checkout; else the
    nearest folder at or above the working directory holding the notebooks (a project
    ``kvpressure init`` wrote; Jupyter's working directory is its ``notebooks/``); else the
    working directory."""
    root = checkout_root()
    if root is not None:
        return root
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if is_project(d)), here)


def stored_path(path: str | os.PathLike[str]) -> Path:
    """A path as the kit stores it in a run folder (relative to the checkout when inside one,
    else absolute: ``run_folder.display_path``) made absolute."""
    p = Path(path)
    return p if p.is_absolute() else (checkout_root() or work_root()) / p
