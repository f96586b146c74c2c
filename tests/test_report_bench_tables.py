"""``kvpressure report --source`` on other benchmark tools' sweeps: the report's knee is the one
``kvpressure knee`` prints (hand-worked in ``test_ingest_bench_tables``), and a sweep too short
for a knee says so instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.record.io import load_record

# Each test runs a report or fits a twin on real data: seconds each.
pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "bench_tables"
MAPPING = "concurrency=conc,output_throughput=tok_s,ttft_p95_s=ttft_p95_ms"
SOURCES = {
    "spreadsheet": (DATA / "spreadsheet.csv", ["--param", f"columns={MAPPING}"],
                    ["--columns", MAPPING]),
    "vllm_sweep": (DATA / "vllm_sweep" / "summary.csv", [], []),
    "guidellm": (DATA / "guidellm" / "benchmarks.json", [], []),
    "aiperf": (DATA / "aiperf", [], []),
}
KEYS = ("knee_x", "peak_x", "peak_y", "plateau", "declines", "decline_pct")


@pytest.mark.parametrize("name", list(SOURCES))
def test_report_on_a_sweep_table_has_the_knee_the_command_prints(name, tmp_path, capsys):
    source, report_args, knee_args = SOURCES[name]
    assert main(["knee", str(source), *knee_args]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / name
    code = main(["report", "--source", str(source), "--out", str(out), "--jobs", "1",
                 *report_args])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    stage = json.loads((out / "analysis" / "knee.json").read_text())
    assert {k: stage["knee"][k] for k in KEYS} == {k: printed[k] for k in KEYS}
    assert stage["knee"]["knee_x"] == 16.0 and stage["levels"] == 6
    rec = load_record(out / "record.yaml")
    assert rec.perf.knee.knee_x == 16 and rec.perf.knee.peak_y == 960
    assert [p.concurrency for p in rec.perf.throughput_by_concurrency] == [1, 4, 8, 16, 32, 64]
    if name == "vllm_sweep":
        # p99 only: the record keeps p95 null and says what was measured instead (focus 32,
        # the first level past the knee: 1.5 x 26 ms).
        assert rec.perf.itl_p95 is None
        assert "the runs have ITL p99 only (39.0 ms at the focus level" in rec.missing[
            "perf.itl_p95"]
        assert stage["itl_p99_s"] == pytest.approx(0.039)


def test_report_on_two_levels_says_there_is_no_knee(tmp_path, capsys):
    p = tmp_path / "two.csv"
    p.write_text("users,tok_per_s\n8,400\n32,900\n", encoding="utf-8")
    assert main(["knee", str(p), "--columns", "concurrency=users,output_throughput=tok_per_s"]
                ) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["knee_x"] is None
    assert "2 levels: a slope, not a bend; no knee" in captured.err
    out = tmp_path / "two"
    code = main(["report", "--source", str(p), "--out", str(out), "--jobs", "1",
                 "--param", "columns=concurrency=users,output_throughput=tok_per_s"])
    err = capsys.readouterr().err
    assert code == 0, err
    stage = json.loads((out / "analysis" / "knee.json").read_text())
    assert stage["knee"] is None and "a knee needs at least 3" in stage["why_not"]
    assert load_record(out / "record.yaml").perf.knee is None


def test_report_on_request_rate_levels_reads_the_rate_axis(tmp_path, capsys):
    report = json.loads((DATA / "guidellm" / "benchmarks.json").read_text())
    for k, b in enumerate(report["benchmarks"]):
        b["config"]["strategy"] = {"type_": "poisson", "rate": float(k + 1),
                                   "max_concurrency": None}
    p = tmp_path / "rates.json"
    p.write_text(json.dumps(report), encoding="utf-8")
    out = tmp_path / "r"
    code = main(["report", "--source", str(p), "--out", str(out), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    record = load_record(out / "record.yaml")
    assert record.workload.level_axis == "request_rate"
    assert record.workload.request_rates == [float(k + 1) for k in range(6)]
    assert record.workload.max_concurrency is None  # Poisson, no cap: an open loop
    # The report's knee is the one `kvpressure knee --x request_rate` finds.
    assert main(["knee", str(p), "--x", "request_rate"]) == 0
    knee = json.loads(capsys.readouterr().out)
    assert record.perf.knee.peak_x == knee["peak_x"]
    assert knee["peak_x"] == 4.0
