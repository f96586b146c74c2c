"""RunFolder: a run folder's files written and read through one object, each read once.

The twin of stage 06 reads on from the folder the stage's tables came from, so a file the
stage read is not read again; what it builds is what it builds from the bare path.
"""

from __future__ import annotations

import builtins
import io
import json
import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pandas.testing as pdt
import pytest

from kvpressure.folders.layout import INGEST_JSON, RUNS_CSV, SERIES_CSV, SOURCES_FILE
from kvpressure.folders.run_folder import RunFolder, as_run_folder
from kvpressure.twin.measured import load_measured
from twin_helpers import synthetic_run


@pytest.fixture()
def opened(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The names of the files opened for reading from now on, counted."""
    seen: Counter[str] = Counter()
    real = io.open

    def counting(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and "r" in mode:
            seen[Path(file).name] += 1
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    return seen


def test_layout_names_and_the_bytes_written(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert folder.runs_path == tmp_path / RUNS_CSV
    assert folder.point_dir("baseline/c8") == tmp_path / "points" / "baseline" / "c8"
    folder.write_sources(["a/b.json", "c"])
    assert (tmp_path / SOURCES_FILE).read_text() == '{\n  "sources": [\n    "a/b.json",\n    "c"\n  ]\n}\n'
    folder.write_ingest({"b": 1, "a": {"z": 0, "y": None}})
    assert (tmp_path / INGEST_JSON).read_text() == json.dumps(
        {"a": {"y": None, "z": 0}, "b": 1}, indent=2) + "\n"
    assert folder.sources() == ["a/b.json", "c"]
    assert folder.ingest() == {"a": {"y": None, "z": 0}, "b": 1}
    assert RunFolder(tmp_path / "none").sources() == []
    assert RunFolder(tmp_path / "none").ingest() == {}


def test_each_file_read_once_and_handed_out_as_copies(tmp_path: Path,
                                                      opened: Counter[str]) -> None:
    folder = RunFolder(tmp_path)
    folder.write_runs(pd.DataFrame({"concurrency": [1, 2], "output_throughput": [3.5, 6.0]}))
    first = folder.runs()
    first.loc[0, "output_throughput"] = -1.0
    again = folder.runs()
    assert again["output_throughput"].tolist() == [3.5, 6.0]
    pdt.assert_frame_equal(again, pd.read_csv(tmp_path / RUNS_CSV))
    assert opened[RUNS_CSV] == 2  # this folder's once, pandas' own once (the comparison)
    # Writing forgets what was read: the next read is of the new file.
    folder.write_runs(pd.DataFrame({"concurrency": [4], "output_throughput": [9.0]}))
    assert folder.runs()["concurrency"].tolist() == [4]
    assert as_run_folder(folder) is folder


def test_bad_ingest_json_named(tmp_path: Path) -> None:
    (tmp_path / INGEST_JSON).write_text('{"runs": \n', encoding="utf-8")
    with pytest.raises(Exception, match=r"ingest\.json: line 2: not JSON"):
        RunFolder(tmp_path).ingest()


def test_the_twin_reads_on_from_the_stage_folder(tmp_path: Path, opened: Counter[str]) -> None:
    run = synthetic_run(tmp_path / "run", levels=(1, 2, 4))
    alone = load_measured(run)
    assert opened[RUNS_CSV] == 1 and opened[SERIES_CSV] == 1
    opened.clear()
    folder = RunFolder(run)
    folder.runs(), folder.series()  # what a stage's tables read
    assert opened[RUNS_CSV] == 1 and opened[SERIES_CSV] == 1
    held = load_measured(folder)
    assert opened[RUNS_CSV] == 1 and opened[SERIES_CSV] == 1  # not again
    assert held.folder is folder and held.run_dir == alone.run_dir
    pdt.assert_frame_equal(held.levels, alone.levels)
    pdt.assert_frame_equal(held.runs, alone.runs)
    assert held.series is not None and alone.series is not None
    pdt.assert_frame_equal(held.series, alone.series)
    assert held.lengths == alone.lengths
