"""JupyterLab as `make lab` starts it: kernels plot inline, saved outputs never reach git."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from kvpressure.notebooks.lab import install_output_filter, lab_environment, stored_outputs
from kvpressure.paths import REPO_ROOT


def test_make_lab_starts_lab_through_the_module_that_drops_agg():
    recipe = subprocess.run(["make", "-n", "lab", "VENV=.venv"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert "-m kvpressure.notebooks.lab" in recipe and "--start" in recipe
    assert "jupyter lab" not in recipe  # no other way in that would keep MPLBACKEND
    # The save hook is named by its import path (the module runs as __main__ under make lab).
    from traitlets.utils.importstring import import_item

    from kvpressure.notebooks.lab import lab_command, strip_before_save

    hook = next(a.split("=", 1)[1] for a in lab_command("nb") if "pre_save_hook" in a)
    assert import_item(hook) is strip_before_save


def _kernel_backend(env: dict[str, str]) -> str:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        seen: list[str] = []
        kc.execute_interactive(
            "import matplotlib.pyplot, matplotlib\nprint(matplotlib.get_backend())",
            output_hook=lambda msg: seen.append(msg["content"].get("text", "")), timeout=60)
        return "".join(seen).strip()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_lab_kernel_environment_has_no_agg_and_plots_inline():
    batch = {**os.environ, "MPLBACKEND": "Agg"}  # what the Makefile exports
    env = lab_environment(batch)
    assert "MPLBACKEND" not in env
    assert "inline" in _kernel_backend(env)
    # The batch environment itself would draw nowhere in Lab: plt.show() shows nothing.
    assert _kernel_backend(batch).lower() == "agg"


@pytest.mark.slow
def test_executed_and_saved_notebook_leaves_git_status_clean(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    nb_path = repo / "notebooks" / "00_capacity.ipynb"
    shutil.copyfile(REPO_ROOT / "notebooks" / "00_capacity.ipynb", nb_path)
    shutil.copyfile(REPO_ROOT / ".gitignore", repo / ".gitignore")  # Lab's checkpoints

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    assert install_output_filter(repo) and install_output_filter(repo)  # twice: idempotent
    assert (repo / ".gitattributes").read_text().count("*.ipynb filter=nbstripout") == 1
    git("add", ".")
    git("commit", "-qm", "notebooks")
    # Run every cell and save over the tracked file, as Lab's save does.
    from nbclient import NotebookClient

    nb = nbformat.read(nb_path, as_version=4)
    env = {**os.environ, "KVPRESSURE_RUN_CONTEXT": str(tmp_path / "ctx.json")}
    os.environ.update(env)
    try:
        NotebookClient(nb, kernel_name="python3", resources={
            "metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    finally:
        os.environ.pop("KVPRESSURE_RUN_CONTEXT", None)
    nbformat.write(nb, nb_path)  # saved with outputs, as an editor without the hook would
    saved = nbformat.read(nb_path, as_version=4)
    assert any("image/png" in o.get("data", {}) for c in saved.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    # The filter: git stores and diffs the notebook without them.
    assert git("diff") == ""
    assert stored_outputs(nb_path, repo) == []
    # Lab's own save (its contents manager, with the hook `make lab` configures) writes the
    # tracked notebook as git has it: git status is clean.
    from jupyter_server.services.contents.filemanager import FileContentsManager

    cm = FileContentsManager(root_dir=str(repo / "notebooks"),
                             pre_save_hook="kvpressure.notebooks.lab.strip_before_save")
    cm.save({"type": "notebook", "format": "json", "content": copy.deepcopy(nb)},
            "00_capacity.ipynb")
    assert git("status", "--porcelain") == ""
    # A notebook of the user's own keeps its outputs.
    cm.save({"type": "notebook", "format": "json", "content": copy.deepcopy(nb)}, "mine.ipynb")
    mine = nbformat.read(repo / "notebooks" / "mine.ipynb", as_version=4)
    assert any(c.get("outputs") for c in mine.cells if c.cell_type == "code")


def test_verify_reads_what_git_stores():
    # The tracked notebooks hold no outputs (whatever Lab saved into the working files).
    assert [p for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
            for p in stored_outputs(nb)] == []
    assert sys.executable
