"""The kit as its users install it: the wheel in a fresh virtual environment outside the
checkout, run from a folder outside it with nothing of the checkout on the path.

One environment serves both checks: first the core install alone (the command line works, the
report names the extra it needs), then the same environment with the ``[report]`` extra added
(the report on a built-in experiment, the record naming the kit's version, ``kvpressure init``).
Dependencies come from the package index, pinned to ``requirements-lock.txt`` (the same versions
as the checkout's ``uv.lock``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvpressure import __version__
from kvpressure.paths import REPO_ROOT

pytestmark = pytest.mark.slow


def _uv() -> str:
    uv = REPO_ROOT / ".tools" / "bin" / "uv"
    found = str(uv) if uv.exists() else shutil.which("uv")
    if found is None:
        pytest.skip("uv is not installed (make test installs it into .tools/)")
    return found


def _clean_env(venv: Path, home: Path) -> dict[str, str]:
    """The environment of a user's shell with the venv on PATH: none of the checkout's."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "UV_CACHE_DIR", "XDG_CACHE_HOME", "SSL_CERT_FILE",
            "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
            "UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env["MPLBACKEND"] = "Agg"
    # Jupyter's and matplotlib's per-user folders in the test's own home, not the real one.
    env["JUPYTER_CONFIG_DIR"] = str(home / ".jupyter")
    env["MPLCONFIGDIR"] = str(home / ".matplotlib")
    env["XDG_STATE_HOME"] = str(home / ".state")
    return env


class Installed:
    """A venv outside the checkout and a working folder outside it too."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        self.work = root / "work"
        self.work.mkdir()
        self.env = _clean_env(self.venv, root)
        self.timings: dict[str, float] = {}

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=cwd or self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def install(self, requirement: str, what: str) -> None:
        t0 = time.perf_counter()
        subprocess.run(
            [_uv(), "pip", "install", "--python", str(self.venv / "bin" / "python"),
             "--constraint", str(REPO_ROOT / "requirements-lock.txt"), requirement],
            check=True, capture_output=True, text=True, timeout=900,
            # A throwaway venv: linked from uv's cache where it can be (the Makefile's
            # copy mode is for .venv).
            env={**os.environ, "VIRTUAL_ENV": str(self.venv), "UV_LINK_MODE": "hardlink"})
        self.timings[f"install {what}"] = time.perf_counter() - t0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built the way a release is: an sdist of the checkout, the wheel from it (so
    the sdist carries everything the wheel needs)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([_uv(), "build", "--python", sys.executable, "--out-dir", str(out), str(REPO_ROOT)],
                   check=True, capture_output=True, text=True, timeout=900)
    (found,) = out.glob("kvpressure-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("user")
    assert REPO_ROOT not in root.parents
    inst = Installed(root)
    subprocess.run([_uv(), "venv", "--python", sys.executable, str(inst.venv)],
                   check=True, capture_output=True, timeout=300)
    inst.install(str(wheel), "core")
    return inst


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_wheel_carries_the_builtin_data_and_notebooks(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for tracked in (REPO_ROOT / "data").rglob("*"):
        if tracked.is_file():
            assert f"kvpressure/_builtin/{tracked.relative_to(REPO_ROOT).as_posix()}" in names
    notebooks = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and all(f"kvpressure/_builtin/notebooks/{n}" in names for n in notebooks)
    # Every file the package reads beside its modules (templates, schemas, py.typed).
    package = REPO_ROOT / "lib"
    beside = [f.relative_to(package).as_posix() for f in (package / "kvpressure").rglob("*")
              if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts]
    assert "kvpressure/py.typed" in beside
    assert [f for f in beside if f not in names] == []


def test_core_install_runs_the_command_line_and_names_the_report_extra(
        installed: Installed) -> None:
    where = _ok(installed.run("python", "-c", "import kvpressure; print(kvpressure.__file__)"))
    assert Path(where.strip()).is_relative_to(installed.venv), where

    assert _ok(installed.run("kvpressure", "--version")).strip() == f"kvpressure {__version__}"
    assert "ci_small" in _ok(installed.run("kvpressure", "profiles", "--kind", "experiment"))

    # A built-in experiment by path inside the package, simulated at its focus point.
    exp = _ok(installed.run("python", "-c", "from kvpressure.paths import data_dir; "
                            "print(data_dir() / 'experiments' / 'ci_small.yaml')")).strip()
    assert "site-packages" in exp
    _ok(installed.run("kvpressure", "simulate", exp, "--out", "sim"))
    assert (installed.work / "sim" / "summary.json").is_file()
    _ok(installed.run("kvpressure", "ingest", "sim/metrics.prom.jsonl", "--out", "ingested"))
    assert (installed.work / "ingested" / "series.csv").is_file()
    # tune draws its figures with matplotlib alone (no seaborn, no Jupyter).
    _ok(installed.run("kvpressure", "tune", "ci_small", "--param", "max_num_seqs=8,24",
                      "--limits", "ttft_p95=60s", "--out", "tune"))
    assert (installed.work / "tune" / "tune.csv").is_file()
    assert list((installed.work / "tune").glob("*.png"))

    # Every stage and the record without Jupyter.
    _ok(installed.run("kvpressure", "analyse", "analysed", "--experiment", "ci_small"))
    record = yaml.safe_load((installed.work / "analysed" / "record.yaml").read_text())
    assert record["provenance"]["kit_version"] == __version__

    refused = installed.run("kvpressure", "report", "--experiment", "ci_small", "--out", "r")
    assert refused.returncode == 2, refused.stderr
    assert "pip install 'kvpressure[report]'" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not (installed.work / "r").exists()
    # collect's report too, refused before any server is reached (nothing listens on port 9).
    refused = installed.run("kvpressure", "collect", "http://127.0.0.1:9", "--levels", "4",
                            "--out", "live")
    assert refused.returncode == 2 and "pip install 'kvpressure[report]'" in refused.stderr
    assert "--no-report" in refused.stderr and not (installed.work / "live").exists()


def test_report_extra_runs_the_report_and_init(installed: Installed, wheel: Path) -> None:
    installed.install(f"kvpressure[report] @ {wheel.as_uri()}", "[report]")

    t0 = time.perf_counter()
    _ok(installed.run("kvpressure", "report", "--experiment", "ci_small", "--out", "ci_small"))
    installed.timings["report ci_small"] = time.perf_counter() - t0
    run_dir = installed.work / "ci_small"
    assert (run_dir / "index.html").is_file()
    record = yaml.safe_load((run_dir / "record.yaml").read_text())
    assert record["provenance"]["kit_version"] == __version__

    _ok(installed.run("kvpressure", "init", "proj"))
    proj = installed.work / "proj"
    shipped = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (proj / "notebooks").glob("*.ipynb")) == shipped
    assert (proj / "experiments" / "seed_case.yaml").read_bytes() == (
        REPO_ROOT / "data" / "experiments" / "seed_case.yaml").read_bytes()
    assert "kvpressure report --experiment experiments/seed_case.yaml" in (
        proj / "README.md").read_text()
    again = installed.run("kvpressure", "init", "proj")
    assert again.returncode == 2 and "proj" in again.stderr and "not empty" in again.stderr

    # A project as Lab runs it: 01_collect from its notebooks folder, on the project's copy of
    # the experiment (set as its README says), writes its run folder and the current run under
    # the project.
    _ok(installed.run("kvpressure", "init", "lab", "--experiment", "ci_small"))
    proj = installed.work / "lab"
    t0 = time.perf_counter()
    _ok(installed.run("papermill", "--cwd", "notebooks", "notebooks/01_collect.ipynb",
                      str(installed.root / "01.ipynb"), "-p", "experiment",
                      "../experiments/ci_small.yaml", "--no-progress-bar", cwd=proj))
    installed.timings["01_collect in the project"] = time.perf_counter() - t0
    current = json.loads((proj / "reports" / ".current-run.json").read_text())
    assert Path(current["run_dir"]) == proj / "reports" / "ci_small"
    assert (proj / "reports" / "ci_small" / "runs.csv").is_file()
    # Nothing was written into the installed package (a run folder, the current run).
    site = next((installed.venv / "lib").glob("python*/site-packages/kvpressure"))
    assert not list(site.rglob("reports")) and not list(site.rglob("*.ipynb.*"))

    print("wheel test timings (s):", {k: round(v, 1) for k, v in installed.timings.items()})
