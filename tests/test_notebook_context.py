"""One run context for the notebooks: 01 chooses the run, later notebooks read it; a run
folder whose inputs changed is refused."""

from __future__ import annotations

import json
import shutil

import nbformat
import pytest

from kvpressure.errors import InputError
from kvpressure.folders.run_context import (
    CONTEXT_ENV,
    RUN_DIR_ENV,
    changed_inputs,
    choose_run,
    current_run,
)
from kvpressure.paths import REPO_ROOT

pytestmark = pytest.mark.slow

NOTEBOOKS = REPO_ROOT / "notebooks"
SMALL = REPO_ROOT / "data" / "experiments" / "ci_small.yaml"


def _papermill(name, out, **params):
    import papermill

    return papermill.execute_notebook(str(NOTEBOOKS / name), str(out), parameters=params,
                                      kernel_name="python3", cwd=str(NOTEBOOKS),
                                      progress_bar=False)


def _markdown_outputs(nb):
    return ["".join(o.get("data", {}).get("text/markdown", ""))
            for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    """01 run with only its experiment (and folder) given, then 03 run with no parameter."""
    tmp = tmp_path_factory.mktemp("ctx")
    experiment = tmp / "picked_in_01.yaml"
    shutil.copyfile(SMALL, experiment)
    mp = pytest.MonkeyPatch()
    mp.setenv(CONTEXT_ENV, str(tmp / "current-run.json"))
    # The default a notebook would fall back to on its own: must not be what 03 reads.
    mp.setenv("KVPRESSURE_NB_EXPERIMENT", str(REPO_ROOT / "data/experiments/seed_case.yaml"))
    mp.delenv(RUN_DIR_ENV, raising=False)
    mp.delenv("KVPRESSURE_BATCH", raising=False)
    try:
        _papermill("01_collect.ipynb", tmp / "01.ipynb", experiment=str(experiment),
                   run_dir=str(tmp / "run"))
        nb03 = _papermill("03_knee.ipynb", tmp / "03.ipynb")
    finally:
        mp.undo()
    return tmp, experiment, nb03


def test_experiment_changed_in_01_is_what_03_reads(chosen):
    tmp, experiment, nb03 = chosen
    # 03 wrote its stage into the run folder 01 chose, and said so at its top.
    knee = json.loads((tmp / "run" / "analysis" / "knee.json").read_text())
    assert knee["knee"]["peak_x"] in (4, 8, 16, 24, 32, 48)  # ci_small's levels, not the seed's
    banner = _markdown_outputs(nb03)[0]
    assert str(tmp / "run") in banner and experiment.name in banner
    assert "chosen by 01_collect" in banner
    assert not (REPO_ROOT / "reports" / "picked_in_01").exists()


def test_parameters_cells_hold_literals_only():
    import ast

    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        for node in ast.parse(cell.source).body:
            assert isinstance(node, ast.Assign), (path.name, ast.unparse(node))
            ast.literal_eval(node.value)  # raises on a call, a name, an f-string...


def test_stale_run_folder_is_refused(chosen, tmp_path):
    from kvpressure.investigation.collect import open_run

    src, _, _ = chosen
    run = tmp_path / "run"
    shutil.copytree(src / "run", run)
    experiment = tmp_path / "exp.yaml"
    shutil.copyfile(SMALL, experiment)
    info_path = run / "analysis" / "collect.json"
    info = json.loads(info_path.read_text())
    info["inputs"][0]["path"] = str(experiment)  # the same bytes, at a path this test owns
    info_path.write_text(json.dumps(info))
    assert changed_inputs(run) == []
    assert open_run(run).info.name == info["name"]
    experiment.write_text(experiment.read_text() + "\n# edited after 01 ran\n")
    assert changed_inputs(run) == [f"{experiment} (edited)"]
    with pytest.raises(InputError, match=r"inputs changed.*rerun notebooks/01_collect"):
        open_run(run)
    experiment.unlink()
    with pytest.raises(InputError, match=r"\(gone\)"):
        open_run(run)


def test_context_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv(CONTEXT_ENV, str(tmp_path / "ctx.json"))
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.setenv("KVPRESSURE_NB_EXPERIMENT", str(SMALL))
    # Nothing chosen yet: the environment's experiment and its default folder.
    ctx = current_run()
    assert ctx.experiment == str(SMALL) and ctx.run_dir == (REPO_ROOT / "reports/ci_small")
    # 01's choice is remembered; a later notebook without parameters reads it.
    from kvpressure.folders.run_context import remember_run

    remember_run(choose_run(experiment=str(SMALL), run_dir=str(tmp_path / "a")))
    assert current_run().run_dir == tmp_path / "a"
    # Explicit parameters (kvpressure report gives every notebook its run_dir) win...
    assert current_run(run_dir=str(tmp_path / "b")).run_dir == tmp_path / "b"
    # ... and so does $KVPRESSURE_RUN_DIR over the remembered run.
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "c"))
    assert current_run().run_dir == tmp_path / "c"
    # A batch run never changes the user's current run.
    monkeypatch.setenv("KVPRESSURE_BATCH", "1")
    assert remember_run(choose_run(run_dir=str(tmp_path / "d"))) is None
    assert json.loads((tmp_path / "ctx.json").read_text())["run_dir"] == str(tmp_path / "a")
