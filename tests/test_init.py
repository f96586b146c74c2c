"""``kvpressure init DIR``: a project folder for the notebooks, never written over the user's
files; and where an installed kit's notebooks put their run folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpressure import paths
from kvpressure.cli import main
from kvpressure.paths import REPO_ROOT


def test_init_writes_the_notebooks_an_experiment_and_a_readme(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path / "proj"), "--experiment", "ci_small"]) == 0
    proj = tmp_path / "proj"
    assert sorted(p.name for p in (proj / "notebooks").iterdir()) == sorted(
        p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert (proj / "experiments" / "ci_small.yaml").read_bytes() == (
        REPO_ROOT / "data" / "experiments" / "ci_small.yaml").read_bytes()
    readme = (proj / "README.md").read_text()
    assert "kvpressure report --experiment experiments/ci_small.yaml --out reports/ci_small" in readme
    assert 'experiment = "../experiments/ci_small.yaml"' in readme
    assert not list(tmp_path.glob(".*"))  # no partial folder left beside it


def test_init_fills_an_empty_folder(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path)]) == 0
    assert (tmp_path / "experiments" / "seed_case.yaml").is_file()


@pytest.mark.parametrize("content", ["file", "folder"])
def test_init_refuses_a_folder_with_anything_in_it(
        tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    if content == "file":
        (target / "notes.txt").write_text("mine\n")
    else:
        (target / "empty").mkdir()
    assert main(["init", str(target)]) == 2
    err = capsys.readouterr().err
    assert str(target) in err and "not empty" in err
    assert [p.name for p in target.iterdir()] == (["notes.txt"] if content == "file" else ["empty"])


def test_init_refuses_a_file_and_an_unknown_experiment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    assert main(["init", str(tmp_path / "f")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["init", str(tmp_path / "p"), "--experiment", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_installed_notebooks_write_under_the_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a checkout the run folders and the current run go under the project ``init``
    wrote (Jupyter's working directory is its notebooks/), else under the working directory;
    the built-in default experiment is the kit's."""
    from kvpressure.folders.run_context import choose_run, context_file

    assert main(["init", str(tmp_path / "proj")]) == 0
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    monkeypatch.delenv("KVPRESSURE_NB_EXPERIMENT", raising=False)
    monkeypatch.delenv("KVPRESSURE_RUN_DIR", raising=False)
    monkeypatch.delenv("KVPRESSURE_RUN_CONTEXT", raising=False)
    monkeypatch.chdir(tmp_path / "proj" / "notebooks")
    assert paths.work_root() == tmp_path / "proj"
    assert context_file() == tmp_path / "proj" / "reports" / ".current-run.json"
    ctx = choose_run(experiment="../experiments/seed_case.yaml")
    assert ctx.run_dir == tmp_path / "proj" / "reports" / "seed_case"
    assert Path(ctx.experiment) == tmp_path / "proj" / "experiments" / "seed_case.yaml"
    monkeypatch.chdir(tmp_path)
    assert paths.work_root() == tmp_path


def test_a_notebook_takes_a_builtin_experiment_by_name(tmp_path: Path) -> None:
    from kvpressure.folders.run_context import choose_run

    ctx = choose_run(experiment="ci_small", run_dir=tmp_path / "r")
    assert Path(ctx.experiment) == paths.data_dir() / "experiments" / "ci_small.yaml"


def test_a_builtin_name_beside_a_folder_of_that_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvpressure report --experiment ci_small --out ci_small`` run again: the run folder in
    the working directory does not hide the built-in experiment."""
    from kvpressure.simulation.experiment import load_experiment

    (tmp_path / "ci_small").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_experiment("ci_small").path == paths.data_dir() / "experiments" / "ci_small.yaml"
