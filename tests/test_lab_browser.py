"""JupyterLab in a real browser: started as `make lab` starts it, 03_knee opened, every cell
run; the figures are drawn and no cell fails."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml

from kvpressure.notebooks.lab import lab_command, lab_environment
from kvpressure.paths import REPO_ROOT
from kvpressure.report.screenshot import chromium_driver, find_chromedriver, find_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]

if find_chromium() is None or find_chromedriver() is None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError("CI is set but chromium/chromium-driver are not installed "
                           "(scripts/system-deps.sh)")
    pytest.skip("chromium or chromium-driver not installed (scripts/system-deps.sh)",
                allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what, check, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from kvpressure.folders.run_context import choose_run
    from kvpressure.investigation.collect import collect

    tmp = tmp_path_factory.mktemp("lab")
    # ci_small with one seed: the same curve, collected in seconds.
    spec = yaml.safe_load((REPO_ROOT / "data/experiments/ci_small.yaml").read_text())
    spec["comparison"]["seeds"] = 1
    experiment = tmp / "lab_small.yaml"
    experiment.write_text(yaml.safe_dump(spec))
    collect(tmp / "run", str(experiment), progress=None)
    ctx_file = tmp / "current-run.json"
    (tmp / "nb").mkdir()
    shutil.copyfile(REPO_ROOT / "notebooks" / "03_knee.ipynb", tmp / "nb" / "03_knee.ipynb")
    port = _free_port()
    env = lab_environment({**os.environ, "MPLBACKEND": "Agg",
                           "KVPRESSURE_RUN_CONTEXT": str(ctx_file),
                           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
                           "JUPYTER_CONFIG_DIR": str(tmp / "config")})
    env.pop("KVPRESSURE_RUN_DIR", None)
    from kvpressure.folders.run_context import remember_run

    os.environ["KVPRESSURE_RUN_CONTEXT"] = str(ctx_file)
    try:
        remember_run(choose_run(str(experiment), run_dir=str(tmp / "run")))
    finally:
        os.environ.pop("KVPRESSURE_RUN_CONTEXT", None)
    cmd = lab_command(tmp / "nb", [
        "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1", "--ServerApp.token=",
        "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
    ])
    log = open(tmp / "lab.log", "w")  # noqa: SIM115
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              cwd=tmp / "nb")

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2):
                return True
        except OSError:
            return server.poll() is not None  # died: stop waiting, fail below

    try:
        _wait("JupyterLab to start", up, 60)
        assert server.poll() is None, (tmp / "lab.log").read_text()[-2000:]
        yield f"http://127.0.0.1:{port}", tmp
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


KERNEL_STATUS = ("const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                 "const k = w && w.sessionContext && w.sessionContext.session"
                 " && w.sessionContext.session.kernel; return k ? k.status : null;")


def test_lab_runs_03_knee_with_figures_and_no_error(lab):
    url, tmp = lab
    driver = chromium_driver(1280, 1000)
    try:
        driver.get(f"{url}/lab/tree/03_knee.ipynb")
        _wait("the notebook's kernel", lambda: driver.execute_script(KERNEL_STATUS) == "idle", 60)
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

        cells = ("const m = window.jupyterapp.shell.currentWidget.content.model; const out = [];"
                 "for (let i = 0; i < m.cells.length; i++) { const c = m.cells.get(i);"
                 " if (c.type === 'code') out.push({count: c.executionCount,"
                 " outputs: c.outputs.toJSON()}); } return out;")

        def finished() -> bool:
            return (all(c["count"] for c in driver.execute_script(cells))
                    and driver.execute_script(KERNEL_STATUS) == "idle")

        _wait("every cell to run", finished, 75)
        outputs = [o for c in driver.execute_script(cells) for o in c["outputs"]]
        errors = [o for o in outputs if o.get("output_type") == "error"]
        assert errors == []
        pngs = [o for o in outputs if "image/png" in (o.get("data") or {})]
        assert len(pngs) >= 3  # the curve, the latencies by level, their distributions
        # ... and the browser drew them (cells far down may not be in the page yet).
        drawn = driver.execute_script(
            "return Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
            ".filter(i => i.complete && i.naturalWidth > 300).length;")
        assert drawn >= 1
        # The banner on top names the run 01 chose, on screen.
        banner = next("".join(o["data"]["text/markdown"]) for o in outputs
                      if "text/markdown" in (o.get("data") or {}))
        assert str(tmp / "run") in banner and "lab_small.yaml" in banner
        driver.execute_script("window.jupyterapp.shell.currentWidget.content.scrollToItem(0);")
        _wait("the banner on screen", lambda: str(tmp / "run") in driver.execute_script(
            "return document.body.innerText;"), 10)
    finally:
        driver.quit()
