"""``kvpressure init DIR``: a project folder for the investigation in JupyterLab.

It holds the notebooks as the kit ships them, a copy of one experiment (the user's to edit) and
a README saying how to run both ways. ``DIR`` must be new or an empty folder: a project is
never written over the user's files (as every ``--out`` of the kit refuses them).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from kvpressure.errors import InputError

EXPERIMENTS_DIR = "experiments"
NOTEBOOKS_DIR = "notebooks"
README = "README.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="the project folder to create (new or empty)")
    parser.add_argument("--experiment", metavar="FILE", default="seed_case",
                        help="the experiment copied into DIR/experiments/ (a built-in one's "
                             "name, or a YAML; default seed_case)")


def readme(name: str, experiment: str) -> str:
    """The project's README: what is in it and how to run it."""
    from kvpressure import __version__

    exp = f"{EXPERIMENTS_DIR}/{experiment}.yaml"
    return f"""# {name}

A kvpressure project (written by `kvpressure init`, kvpressure {__version__}).

- `{NOTEBOOKS_DIR}/`: the investigation, one notebook a stage (00_capacity to 07_tune)
- `{exp}`: the experiment, yours to edit (`kvpressure profiles` lists the built-in hardware,
  models and experiments it may name)
- `reports/`: the run folders the notebooks and `kvpressure report` write

## In batch

```
pip install 'kvpressure[report]'
kvpressure report --experiment {exp} --out reports/{experiment}
```

writes `reports/{experiment}/record.yaml` (the record) and `reports/{experiment}/index.html` (the
report). Measured data instead of a simulation: `kvpressure report --source FILES --out
reports/NAME`.

## In JupyterLab

```
pip install 'kvpressure[lab]'
jupyter lab {NOTEBOOKS_DIR}/
```

In `01_collect.ipynb` set `experiment = "../{exp}"` in the parameters cell (or `source` to
measured data) and run it; notebooks 02 to 06 then read the same run folder
(`reports/{experiment}`), and `06_record` writes its `record.yaml`.
"""


def _check_target(out: Path, shown: str) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"{shown}: exists and is not a folder; choose a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"{shown}: exists and is not empty; kvpressure init writes a new "
                         "project only into a new or empty folder")


def write_project(out: str | os.PathLike[str], experiment: str = "seed_case") -> Path:
    """Write the project folder ``out``; return it. InputError for a non-empty folder."""
    from kvpressure.paths import notebooks_dir
    from kvpressure.simulation.experiment import load_experiment

    shown = os.fspath(out)
    target = Path(out).absolute()
    _check_target(target, shown)
    exp = load_experiment(experiment)
    if exp.path is None:
        raise InputError(f"--experiment {experiment}: experiment file not found")
    name = Path(exp.path).stem
    # Filled beside the target and renamed into place, so a failure leaves no half project.
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.kvpressure-init")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(notebooks_dir(), partial / NOTEBOOKS_DIR,
                        ignore=shutil.ignore_patterns(".*", "__pycache__"))
        (partial / EXPERIMENTS_DIR).mkdir()
        shutil.copyfile(exp.path, partial / EXPERIMENTS_DIR / f"{name}.yaml")
        (partial / README).write_text(readme(target.name, name), encoding="utf-8")
        if target.is_dir():
            target.rmdir()  # empty, checked above
        os.rename(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def run(args: argparse.Namespace) -> int:
    path = write_project(args.dir, args.experiment)
    print(path)
    return 0
