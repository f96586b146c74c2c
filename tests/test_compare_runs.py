"""kvpressure compare: two run folders (a sweep before and after max_num_seqs 256 -> 20) side by
side: what differs, the knees with their noise, the change per level read against it."""

from __future__ import annotations

import json

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.paths import data_dir


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    top = tmp_path_factory.mktemp("two")
    exp = yaml.safe_load((data_dir() / "experiments" / "ci_small.yaml").read_text())
    exp.pop("comparison")
    exp.pop("remedies")
    base = top / "base.yaml"
    base.write_text(yaml.safe_dump({**exp, "name": "before"}))
    after = top / "after.yaml"
    after.write_text(yaml.safe_dump({**exp, "name": "after",
                                     "engine": {**exp["engine"], "max_num_seqs": 20}}))
    for name, path in (("a", base), ("b", after)):
        assert main(["sweep", str(path), "--out", str(top / name), "--jobs", "1"]) == 0
    return top


def test_what_differs_and_the_change_per_level(two_sweeps, capsys):
    a, b, out = two_sweeps / "a", two_sweeps / "b", two_sweeps / "cmp"
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "compare.json").read_text())
    assert doc["settings_changed"]["max_num_seqs"] == [256, 20]
    rows = {r["concurrency"]: r for r in doc["levels"]}
    assert sorted(rows) == [4, 8, 16, 24, 32, 48]
    # past the pool, the capped server stops preempting and gains beyond the noise; below
    # it the two curves are the same within it
    for c in (24, 32, 48):
        assert rows[c]["preemptions"][0] > 0 and rows[c]["preemptions"][1] == 0
        assert rows[c]["beyond_noise"] and rows[c]["output_throughput_change_pct"] > 10
    assert rows[4]["beyond_noise"] is False
    assert next(line for line in printed.splitlines() if line.startswith("| 4 |")).endswith(
        "| no measurable change | 0 | 0 |")
    assert (out / "compare.md").read_text() == printed
    assert (out / "compare.png").stat().st_size > 10_000
    # the same folders the other way round: the sign of every change turns
    assert main(["compare", str(b), str(a), "--json"]) == 0
    back = {r["concurrency"]: r for r in json.loads(capsys.readouterr().out)["levels"]}
    assert all((back[c]["output_throughput_change_pct"] < 0) for c in (24, 32, 48))


def test_folders_that_cannot_be_compared_are_refused_naming_them(two_sweeps, tmp_path,
                                                                 capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(two_sweeps / "a"), str(empty)]) == 2
    assert f"{empty}: no runs.csv here" in capsys.readouterr().err
    short = tmp_path / "short"
    short.mkdir()
    runs = (two_sweeps / "a" / "runs.csv").read_text().splitlines()
    keep = [runs[0]] + [r for r in runs[1:] if ",4," in r or ",8," in r]
    (short / "runs.csv").write_text("\n".join(keep) + "\n")
    assert main(["compare", str(two_sweeps / "a"), str(short)]) == 2
    assert "share 2 concurrency level(s) (4, 8)" in capsys.readouterr().err
