"""One run context for every notebook: which run folder (and so which experiment or sources)
the investigation reads.

It is chosen once: by ``01_collect`` (its ``experiment``/``source``/``run_dir`` parameters), by
``kvpressure report`` (which hands every notebook its ``run_dir``), or by the environment
(``KVPRESSURE_RUN_DIR``; ``KVPRESSURE_NB_EXPERIMENT`` for the default experiment). ``01_collect``
remembers its choice in a small file (``reports/.current-run.json``, or
``$KVPRESSURE_RUN_CONTEXT``), and notebooks 02-06 opened without parameters read it from there,
so changing the experiment in 01 is what 03 then shows.

A run folder whose inputs changed since stage 01 read them (their sha256 in
``analysis/collect.json``) is refused: its tables describe files that no longer exist as such.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.folders.output_folder import file_sha256
from kvpressure.folders.run_folder import (
    DEFAULT_EXPERIMENT,
    RunFolder,
    as_run_folder,
    as_sources,
    default_experiment,
    default_run_dir,
    display_path,
)
from kvpressure.paths import data_dir, kit_root, stored_path, work_root
from kvpressure.stages.files import ANALYSIS_DIR, has_stage, read_stage
from kvpressure.stages.results import CollectInfo

CONTEXT_ENV = "KVPRESSURE_RUN_CONTEXT"
RUN_DIR_ENV = "KVPRESSURE_RUN_DIR"
# Set in the kernels `kvpressure report` starts: a batch run never changes the user's context.
BATCH_ENV = "KVPRESSURE_BATCH"
CONTEXT_NAME = ".current-run.json"


@dataclass(frozen=True)
class RunContext:
    run_dir: Path
    experiment: str = ""
    source: list[str] = field(default_factory=list)
    chosen_by: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "experiment": self.experiment,
                "source": list(self.source), "chosen_by": self.chosen_by}


def context_file() -> Path:
    """Where ``01_collect`` remembers the run it collected."""
    env = os.environ.get(CONTEXT_ENV)
    return Path(env) if env else work_root() / "reports" / CONTEXT_NAME


def _absolute(path: str) -> str:
    """``path`` made absolute: from the working directory (``notebooks/`` in Jupyter), else
    from the project root when it names a file there (``data/experiments/x.yaml``, as the
    README writes paths), else from the kit's own folder (an installed package's built-in
    ``data/experiments/ci_small.yaml``)."""
    if not path:
        return ""
    here = Path(path)
    if not here.is_absolute() and not here.exists():
        for root in (work_root(), kit_root()):
            if (root / here).exists():
                return str((root / here).resolve())
    return str(here.resolve())


def _experiment_path(given: str) -> str:
    """An experiment parameter made absolute; a bare name not found as a file is a built-in
    experiment's (``ci_small``), as the command line takes it."""
    path = _absolute(given)
    if given and not Path(path).is_file() and Path(given).name == given and not Path(
            given).suffix:
        builtin = data_dir() / "experiments" / f"{given}.yaml"
        if builtin.is_file():
            return str(builtin.resolve())
    return path


def _check_experiment(experiment: str, given: str) -> None:
    """Refuse an experiment file that does not exist before anything is shown or created (no
    banner claiming a collection, no empty run folder)."""
    if not experiment or Path(experiment).is_file():
        return
    from kvpressure.simulation.experiment import list_experiments

    raise InputError(
        f"experiment {given!r}: no such file, looked for from {Path.cwd()} and from the project "
        f"root {work_root()}; give a path to an experiment YAML, or a built-in one's name "
        f"({', '.join(list_experiments())})")


def choose_run(experiment: Any = "", source: Any = "", run_dir: Any = "") -> RunContext:
    """The run ``01_collect`` collects: its parameters, else the environment, else the seed case.

    Empty parameters fall back to ``$KVPRESSURE_NB_EXPERIMENT`` (the experiment) and
    ``$KVPRESSURE_RUN_DIR`` (the folder); the folder defaults to ``reports/<name>``.
    """
    sources = [_absolute(s) for s in as_sources(source)]
    experiment = os.fspath(experiment or "")
    by = "parameters" if (experiment or sources or run_dir) else "defaults"
    if not sources and not experiment:
        experiment = _from_notebooks(default_experiment())
        if os.environ.get("KVPRESSURE_NB_EXPERIMENT"):
            by = "$KVPRESSURE_NB_EXPERIMENT"
    if not run_dir and os.environ.get(RUN_DIR_ENV):
        run_dir, by = os.environ[RUN_DIR_ENV], f"${RUN_DIR_ENV}"
    given = experiment
    experiment = "" if sources else _experiment_path(experiment)
    _check_experiment(experiment, given)
    folder = (Path(os.fspath(run_dir)).resolve() if run_dir
              else Path(_from_notebooks(default_run_dir(given, sources))))
    return RunContext(folder, experiment, sources, by)





def _from_notebooks(path: str) -> str:
    """A default path (written relative to the notebooks folder, their working directory) made
    absolute wherever this runs: the built-in default experiment from the kit's notebooks, the
    rest (``../reports/NAME``, ``$KVPRESSURE_NB_EXPERIMENT``) from the project's."""
    p = Path(path)
    if p.is_absolute():
        return str(p)
    root = kit_root() if path == DEFAULT_EXPERIMENT else work_root()
    return str((root / "notebooks" / p).resolve())


def remember_run(ctx: RunContext) -> Path | None:
    """Record ``ctx`` as the current run for the notebooks opened after 01 (not in batch)."""
    if os.environ.get(BATCH_ENV):
        return None
    path = context_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**ctx.as_dict(), "chosen_by": "01_collect"}, indent=2) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def current_run(experiment: Any = "", source: Any = "", run_dir: Any = "") -> RunContext:
    """The run notebooks 02-06 read: their own parameters when given (``kvpressure report``
    gives them), else ``$KVPRESSURE_RUN_DIR``, else the run 01 last collected, else the default
    experiment's folder."""
    if experiment or as_sources(source) or run_dir:
        return choose_run(experiment, source, run_dir)
    if os.environ.get(RUN_DIR_ENV):
        return _from_folder(Path(os.environ[RUN_DIR_ENV]).resolve(), f"${RUN_DIR_ENV}")
    path = context_file()
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return RunContext(Path(data["run_dir"]), data.get("experiment") or "",
                              list(data.get("source") or []), f"01_collect ({display_path(path)})")
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}: not a run context written by 01_collect; delete it or "
                             "rerun notebooks/01_collect.ipynb") from None
    return choose_run()


def _from_folder(folder: Path, by: str) -> RunContext:
    """A context for a folder given by path: its experiment or sources from its stage 01."""
    if has_stage(folder, CollectInfo):
        info = read_stage(folder, CollectInfo)
        paths = [_repo_path(i.path) for i in info.inputs]
        if info.simulated:
            return RunContext(folder, paths[0] if paths else "", [], by)
        return RunContext(folder, "", paths, by)
    return RunContext(folder, _from_notebooks(default_experiment()), [], by)


def _repo_path(path: str) -> str:
    """A path as stage 01 stored it (relative to the checkout when inside it), made absolute."""
    return str(stored_path(path))


def changed_inputs(run_dir: RunFolder | str | os.PathLike[str]) -> list[str]:
    """The inputs of stage 01 whose bytes differ now (or that are gone), as text."""
    info = as_run_folder(run_dir).stage(CollectInfo)
    out = []
    for item in info.inputs:
        path = Path(_repo_path(item.path))
        if not path.exists():
            out.append(f"{item.path} (gone)")
        elif path.is_file() and file_sha256(path) != item.sha256:
            out.append(f"{item.path} (edited)")
    return out


def check_fresh(run_dir: RunFolder | str | os.PathLike[str]) -> None:
    """Refuse a run folder whose inputs changed since 01 collected them."""
    folder = as_run_folder(run_dir)
    changed = changed_inputs(folder)
    if changed:
        raise InputError(
            f"{display_path(folder.path)}: its inputs changed since 01_collect read them: "
            f"{', '.join(changed)}; rerun notebooks/01_collect.ipynb (or `kvpressure report`) "
            "so the run folder describes them")


def collected_at(run_dir: str | os.PathLike[str]) -> str | None:
    """When stage 01 wrote the folder's tables (UTC), from its result file."""
    path = Path(run_dir) / ANALYSIS_DIR / "collect.json"
    if not path.is_file():
        return None
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))


def banner_text(ctx: RunContext, collecting: bool = False) -> str:
    """The Markdown line at the top of every notebook: which run it reads (``collecting``: 01,
    about to write it)."""
    what = (f"experiment `{display_path(ctx.experiment)}`" if ctx.experiment else
            "sources " + ", ".join(f"`{display_path(s)}`" for s in ctx.source))
    when = collected_at(ctx.run_dir)
    state = ("collected now, by this notebook" if collecting else f"collected {when}" if when
             else "not collected yet (this notebook runs stage 01 first)")
    return (f"**Run folder** `{display_path(ctx.run_dir)}` · {what} · {state} · chosen by "
            f"{ctx.chosen_by or 'defaults'}. To investigate another, change `experiment` or "
            "`source` in `01_collect` and run it.")
