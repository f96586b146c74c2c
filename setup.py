"""The wheel's built-in files: the checkout's top-level ``data/`` and ``notebooks/`` (their one
home) copied under ``kvpressure/_builtin/`` at build time, in the same relative layout, so an
installed kit finds its profiles, experiments and notebooks without the checkout
(``kvpressure.paths``). Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILTIN = ("data", "notebooks")
SKIP = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc", ".*")


class BuildWithBuiltin(build_py):
    def run(self) -> None:
        super().run()
        # An editable install runs from the checkout, whose folders paths.py finds itself.
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "kvpressure" / "_builtin"
        for name in BUILTIN:
            if (target / name).exists():
                shutil.rmtree(target / name)
            shutil.copytree(ROOT / name, target / name, ignore=SKIP)


setup(cmdclass={"build_py": BuildWithBuiltin})
