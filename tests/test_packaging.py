"""The pinned environment: requirements-lock.txt (for pip/conda users) matches uv.lock."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_requirements_lock_is_exported_from_uv_lock() -> None:
    uv = ROOT / ".tools" / "bin" / "uv"
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv")
    if uv_cmd is None:
        pytest.skip("uv is not installed (make test installs it into .tools/)")
    exported = subprocess.run(
        [uv_cmd, "export", "--frozen", "--all-extras", "--no-emit-project", "--no-hashes"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    committed = (ROOT / "requirements-lock.txt").read_text()
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("#")]  # noqa: E731
    assert strip(exported) == strip(committed), "requirements-lock.txt is stale: run `make lock`"


def test_environment_yml_installs_the_package_with_the_same_pins() -> None:
    import yaml

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-c requirements-lock.txt" in pip_section
    assert any(item.startswith("-e .") for item in pip_section)


def test_the_package_and_the_kit_name_one_version() -> None:
    """``kvpressure --version`` and every record's ``provenance.kit_version`` say
    ``kvpressure.__version__``; the wheel's metadata says pyproject's: the same."""
    import tomllib

    from kvpressure import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
