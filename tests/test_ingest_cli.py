"""``kvpressure ingest``: files written, exit codes, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvpressure.cli import main

DATA = Path(__file__).parent / "data"
HEAVY = DATA / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"


def test_ingest_writes_tables_and_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["ingest", str(HEAVY), str(DATA / "bench" / "vllm033_c32.json"), "--out", str(out)])
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"series.csv", "runs.csv", "ingest.json"}
    runs = pd.read_csv(out / "runs.csv")
    # two sources, two runs: the scrape log's (with preemptions) and the bench point
    assert sorted(runs["run"]) == ["heavy_closed_c64_fcfs", "vllm033_c32"]
    assert runs.set_index("run").loc["heavy_closed_c64_fcfs", "preemptions"] == 95
    report = json.loads((out / "ingest.json").read_text())
    assert [s["kind"] for s in report["sources"]] == ["prom_jsonl", "bench"]
    est = report["runs"]["heavy_closed_c64_fcfs"]["recompute_estimate"]
    assert est["assumptions"] and est["low"] < est["high"]
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs_rows"] == 2


def test_bad_file_exits_2_naming_file_and_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "metrics.txt"
    bad.write_text("# TYPE x gauge\nx 1\nx{a=\"1\" 2\n", encoding="utf-8")
    code = main(["ingest", str(bad), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 3" in err


def test_out_is_replaced_only_when_the_kit_made_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    src = str(DATA / "bench" / "vllm033_c32.json")
    assert main(["ingest", src, "--out", str(out)]) == 0
    assert main(["ingest", src, "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["ingest", src, "--out", str(out), "--force"]) == 0
    (out / "keep.txt").write_text("x", encoding="utf-8")
    assert main(["ingest", src, "--out", str(out), "--force"]) == 2
    assert "keep.txt" in capsys.readouterr().err
    assert (out / "keep.txt").exists() and (out / "runs.csv").exists()


def test_engine_arguments_sharpen_the_recompute_range(tmp_path: Path) -> None:
    """vLLM's own run recomputed 127,201 of 601,608 scheduled tokens (0.2114): the range holds
    it with the admission rule unknown, and a narrower one still holds it once it is given."""
    ranges = {}
    for name, flags in (("unknown", []),
                        ("given", ["--policy", "fcfs", "--scheduler-reserve-full-isl", "true"])):
        assert main(["ingest", str(HEAVY), "--out", str(tmp_path / name), *flags]) == 0
        row = pd.read_csv(tmp_path / name / "runs.csv").iloc[0]
        ranges[name] = (row["recompute_ratio_low"], row["recompute_ratio_high"])
        assert ranges[name][0] <= 0.2114 <= ranges[name][1]
    width = {k: hi - lo for k, (lo, hi) in ranges.items()}
    assert width["given"] < 0.5 * width["unknown"]
