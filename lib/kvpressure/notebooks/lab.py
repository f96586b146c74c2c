"""JupyterLab for the notebooks: what ``make lab`` and ``make test`` set up.

- The Lab server and its kernels plot inline: ``MPLBACKEND=Agg`` (which the Makefile exports for
  batch runs, tests and the report) is taken out of their environment, else ``plt.show()`` draws
  nothing in Lab.
- Outputs never reach git: Lab saves the tracked notebooks without their outputs (a
  pre-save hook), and nbstripout is installed as the repository's git filter for
  ``*.ipynb`` (``.gitattributes``), so a notebook Lab saved with its outputs is stored, diffed and
  committed without them. ``--verify`` checks what git stores, not the working file Lab saved.

``python -m kvpressure.notebooks.lab [--choose EXPERIMENT] [--install-filter] [--verify]
[--start [-- jupyter lab args]]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvpressure.paths import REPO_ROOT

BATCH_ONLY = ("MPLBACKEND",)
STRIPPED_METADATA = "metadata.language_info"


def lab_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for the Lab server and its kernels: batch-only settings left out."""
    return {k: v for k, v in env.items() if k not in BATCH_ONLY}


_CELL_KEYS = ("execution", "collapsed", "scrolled", "ExecuteTime")
_NOTEBOOK_KEYS = ("language_info", "widgets", "signature")


def strip_outputs(content: dict) -> dict:
    """A notebook (nbformat's JSON dict) without outputs, counts and run-dependent metadata,
    in place: what the repository tracks."""
    for key in _NOTEBOOK_KEYS:
        content.get("metadata", {}).pop(key, None)
    for cell in content.get("cells", []):
        for key in _CELL_KEYS:
            cell.get("metadata", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return content


def _tracked(path: Path) -> bool:
    if _in_git(path.parent):
        return subprocess.run(["git", "-C", str(path.parent), "ls-files", "--error-unmatch",
                               path.name], capture_output=True, check=False).returncode == 0
    return (REPO_ROOT / "notebooks" / path.name).is_file()


def strip_before_save(model: dict, path: str, contents_manager: Any, **_: Any) -> None:
    """Jupyter's ``FileContentsManager.pre_save_hook``: a tracked notebook is saved without its
    outputs (they stay on screen until the notebook is closed), so a save never changes what
    git tracks; notebooks of the user's own keep theirs."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    root = Path(getattr(contents_manager, "root_dir", "."))
    if _tracked(root / path.lstrip("/")):
        strip_outputs(model["content"])


def lab_command(notebook_dir: str | os.PathLike[str], extra: Sequence[str] = ()) -> list[str]:
    """The command line that starts JupyterLab on ``notebook_dir``."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={os.fspath(notebook_dir)}",
           "--FileContentsManager.pre_save_hook=kvpressure.notebooks.lab.strip_before_save"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")  # containers and CI machines run as root
    return cmd + list(extra)


def _in_git(repo: Path) -> bool:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--git-dir"],
                          capture_output=True, check=False).returncode == 0


def install_output_filter(repo: str | os.PathLike[str] = REPO_ROOT) -> bool:
    """Install nbstripout as ``repo``'s git filter for notebooks (idempotent: nbstripout leaves
    an existing ``.gitattributes`` line as it is). False outside a git checkout."""
    repo = Path(repo)
    if not _in_git(repo):
        return False
    subprocess.run([sys.executable, "-m", "nbstripout", "--install", "--attributes",
                    ".gitattributes"], cwd=repo, check=True)
    # Running a notebook also records the kernel's language_info (its Python version): not
    # part of the notebook either.
    subprocess.run(["git", "-C", str(repo), "config", "filter.nbstripout.extrakeys",
                    STRIPPED_METADATA], check=True)
    return True


def stored_outputs(path: str | os.PathLike[str], repo: str | os.PathLike[str] = REPO_ROOT
                   ) -> list[str]:
    """What of a notebook's outputs git stores (the index's copy, through the filter when one
    is installed; the working file outside git): one line per cell with outputs or a count."""
    import nbformat

    repo, path = Path(repo), Path(path)
    text = None
    if _in_git(repo):
        rel = path.resolve().relative_to(repo.resolve()).as_posix()
        shown = subprocess.run(["git", "-C", str(repo), "show", f":{rel}"],
                               capture_output=True, text=True, check=False)
        if shown.returncode == 0:
            text = shown.stdout
    if text is None:
        text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    return [f"{path.name}: cell {i} has outputs or an execution count"
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra = args[args.index("--") + 1:] if "--" in args else []
    own = args[:args.index("--")] if "--" in args else args
    if "--choose" in own:  # make lab EXPERIMENT=...: the run 02-06 read until 01 chooses another
        from kvpressure.folders.run_context import choose_run, remember_run

        chosen = own[own.index("--choose") + 1]
        os.environ["KVPRESSURE_NB_EXPERIMENT"] = str(Path(chosen).resolve())
        ctx = choose_run(str(Path(chosen).resolve()))
        remember_run(ctx)
        print(f"run context: {ctx.run_dir} ({chosen})", file=sys.stderr)
    if "--install-filter" in own:
        install_output_filter()
    if "--verify" in own:
        problems = [p for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
                    for p in stored_outputs(nb)]
        for p in problems:
            print(f"notebook outputs would reach git: {p}", file=sys.stderr)
        if problems:
            return 1
    if "--start" in own:
        env = lab_environment(os.environ)
        env.setdefault("JUPYTER_RUNTIME_DIR", str(REPO_ROOT / ".venv" / "jupyter-runtime"))
        cmd = lab_command(REPO_ROOT / "notebooks", extra)
        os.execve(cmd[0], cmd, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
