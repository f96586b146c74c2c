"""Sweep tables of other benchmark tools: a runs CSV with a column mapping, vllm bench sweep
results, GuideLLM and AIPerf exports, through ``kvpressure ingest`` and ``kvpressure knee``.

The files in ``tests/data/bench_tables/`` are one sweep written in each tool's format (laid out
as the tools' own writers lay them out, ``make_tables.py``): levels 1, 4, 8, 16, 32, 64 with
output throughput 60 c tok/s up to 16 (960), then 950 and 900; TTFT 20, 22, 25, 40, 180,
650 ms, ITL 10, 10.5, 11, 13, 26, 55 ms, 200 output tokens a request, 100 s a level.
By hand: the knee and the peak are at 16 (960 tok/s), the plateau (within 5% = 48 of the
peak) runs 16 to 32, and the end of the curve (mean of 950 and 900 = 925) is 3.646% below
the peak: a decline. The rise is straight, so the roughness noise is 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from kvpressure.cli import main
from kvpressure.errors import InputError
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.bench_tables import (
    parse_columns,
    table_format,
    throughput_problem,
    unusable_reason,
)
from kvpressure.ingestion.ingest_options import IngestOptions

DATA = Path(__file__).parent / "data" / "bench_tables"
LEVELS = [1.0, 4.0, 8.0, 16.0, 32.0, 64.0]
TPUT = [60.0, 240.0, 480.0, 960.0, 950.0, 900.0]
TTFT_MS = [20.0, 22.0, 25.0, 40.0, 180.0, 650.0]
ITL_MS = [10.0, 10.5, 11.0, 13.0, 26.0, 55.0]
MAPPING = "concurrency=conc,output_throughput=tok_s,request_throughput=req_per_s,ttft_p95_s=ttft_p95_ms"
KNEE = {"knee_x": 16.0, "peak_x": 16.0, "peak_y": 960.0, "plateau": [16.0, 32.0],
        "declines": True, "decline_pct": 3.646}


def _knee(capsys, *argv: str) -> tuple[dict, str]:
    assert main(["knee", *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _check_knee(d: dict) -> None:
    assert {k: d[k] for k in KNEE} == KNEE
    assert [p["x"] for p in d["points"]] == LEVELS
    assert [p["y"] for p in d["points"]] == TPUT


def _runs(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "runs.csv").sort_values("concurrency").reset_index(drop=True)


# ---------------------------------------------------------------------- a runs CSV and a mapping
def test_csv_with_a_column_mapping_through_ingest(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(DATA / "spreadsheet.csv"), "--columns", MAPPING,
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 8  # every row kept, the unusable ones too
    measured = runs.dropna(subset=["concurrency", "output_throughput"])
    assert measured["concurrency"].tolist() == LEVELS
    assert measured["output_throughput"].tolist() == TPUT
    # ttft_p95_ms is 1.25 x TTFT in ms; the runs table holds seconds.
    assert measured["ttft_p95_s"].tolist() == pytest.approx([1.25 * t / 1000 for t in TTFT_MS])
    assert measured["request_throughput"].tolist() == pytest.approx([t / 200 for t in TPUT])
    # The rows the knee cannot use are said on the console with their reasons, and in
    # ingest.json.
    assert "line 8: kept in runs, left out of the knee: concurrency 'off' is not a number" in err
    assert "line 9: kept in runs, left out of the knee: no output throughput" in err
    assert "'ttft_p95_ms' read as milliseconds" in err
    warnings = json.loads((out / "ingest.json").read_text())["warnings"]
    assert sum("left out of the knee" in w for w in warnings) == 2


def test_csv_with_a_column_mapping_through_knee(capsys):
    d, err = _knee(capsys, str(DATA / "spreadsheet.csv"), "--columns", MAPPING)
    _check_knee(d)
    assert "noise 0 output_throughput" in err
    assert "concurrency 'off' is not a number" in err
    assert "2 row(s) left out of the curve" in err


def test_explicit_units_and_bad_mappings(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("users,tput,first_token\n1,10,0.5\n2,20,0.6\n4,40,0.7\n", encoding="utf-8")
    res = ingest([p], options=IngestOptions(
        columns="concurrency=users,output_throughput=tput,ttft_mean_s=first_token:s"))
    assert res.runs["ttft_mean_s"].tolist() == [0.5, 0.6, 0.7]
    res = ingest([p], options=IngestOptions(
        columns="concurrency=users,output_throughput=tput,ttft_mean_s=first_token:ms"))
    assert res.runs["ttft_mean_s"].tolist() == pytest.approx([5e-4, 6e-4, 7e-4])
    with pytest.raises(InputError, match="no column 'conc'"):
        ingest([p], options=IngestOptions(columns="concurrency=conc,output_throughput=tput"))
    with pytest.raises(InputError, match="no 'concurrency' column; map one with --columns"):
        ingest([p])
    with pytest.raises(InputError, match="'speed' is not a runs column"):
        parse_columns("speed=tput")
    with pytest.raises(InputError, match="unit 'min' unknown"):
        parse_columns("ttft_mean_s=first_token:min")


def test_a_latency_column_is_refused_as_the_throughput(tmp_path, capsys):
    spreadsheet = str(DATA / "spreadsheet.csv")
    assert main(["knee", spreadsheet, "--columns",
                 "concurrency=conc,output_throughput=ttft_p95_ms"]) == 2
    assert "named like a latency" in capsys.readouterr().err
    assert main(["knee", spreadsheet, "--x", "conc", "--y", "ttft_p95_ms"]) == 2
    assert "not a throughput" in capsys.readouterr().err
    assert main(["ingest", spreadsheet, "--columns",
                 "concurrency=conc,output_throughput=itl_avg_ms", "--out",
                 str(tmp_path / "o")]) == 2
    # AIPerf's per-user rate falls as concurrency rises by design: no knee from it.
    assert "per-user rate" in throughput_problem("output_token_throughput_per_user")
    for name in ("tok_s", "output_throughput", "Output Tokens/Sec", "req_per_s", "tps"):
        assert throughput_problem(name) is None, name
    for name in ("p99_itl_ms", "mean_e2el_ms", "latency", "ttft_p95_s", "duration"):
        assert throughput_problem(name), name


def test_a_falling_unnamed_column_is_flagged(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("concurrency,value\n1,90\n2,70\n4,40\n8,20\n", encoding="utf-8")
    d, err = _knee(capsys, str(p), "--y", "value")
    assert d["peak_x"] == 1
    assert "falls from the first level on" in err


def test_rows_the_knee_cannot_place_are_named_with_the_reason():
    assert "infinite request rate" in unusable_reason(
        {"concurrency": math.nan, "request_rate": math.inf, "output_throughput": 10.0})
    assert "request-rate level (4 req/s)" in unusable_reason(
        {"concurrency": math.nan, "request_rate": 4.0, "output_throughput": 10.0})
    assert unusable_reason({"concurrency": math.nan, "output_throughput": 1.0,
                            "_raw": {"concurrency": "off"}}) == "concurrency 'off' is not a number"
    assert unusable_reason({"concurrency": 8.0, "output_throughput": math.nan}) == (
        "no output throughput")
    assert unusable_reason({"concurrency": 8.0, "output_throughput": 5.0}) is None


# ---------------------------------------------------------------------- vllm bench sweep
def test_vllm_bench_sweep_summary_csv(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(DATA / "vllm_sweep" / "summary.csv"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    runs = _runs(out)
    assert runs["concurrency"].tolist() == LEVELS
    assert runs["output_throughput"].tolist() == TPUT
    # The sweep asks for percentiles of ttft, tpot, itl and e2el at the default 99 only.
    assert runs["itl_p99_s"].tolist() == pytest.approx([1.5 * t / 1000 for t in ITL_MS])
    assert runs["itl_p95_s"].isna().all()
    assert runs["e2e_mean_s"].tolist() == pytest.approx(
        [(f + i * 199) / 1000 for f, i in zip(TTFT_MS, ITL_MS, strict=True)])
    assert "ITL p99 stands in for p95" in err
    assert (runs["variant"] == "default").all()
    d, _ = _knee(capsys, str(DATA / "vllm_sweep" / "summary.csv"))
    _check_knee(d)


def test_vllm_bench_sweep_folders():
    # The experiment folder: summary.csv (its combination folders are not read twice).
    assert len(ingest([DATA / "vllm_sweep"]).runs) == 6
    # A combination folder: run=0.json; summary.json repeats it and is left out.
    comb = DATA / "vllm_sweep" / "BENCH-max_concurrency=16"
    res = ingest([comb])
    assert res.runs["output_throughput"].tolist() == [960.0]
    # summary.json alone is a list of results.
    assert table_format(comb / "summary.json") == "vllm_sweep"
    assert ingest([comb / "summary.json"]).runs["concurrency"].tolist() == [16.0]


def test_vllm_bench_sweep_of_a_server_setting_gives_one_curve_per_setting(tmp_path, capsys):
    base = pd.read_csv(DATA / "vllm_sweep" / "summary.csv", index_col=0)
    records = []
    for mns, factor in ((128, 1.0), (256, 0.5)):
        part = base.assign(max_num_seqs=mns, output_throughput=base["output_throughput"] * factor)
        records.append(part)
    p = tmp_path / "summary.csv"
    pd.concat(records, ignore_index=True).to_csv(p)
    res = ingest([p])
    assert sorted(set(res.runs["variant"])) == ["max_num_seqs=128", "max_num_seqs=256"]
    assert any("settings varied between runs, one curve each: max_num_seqs" in w
               for w in res.report.warnings)
    assert main(["knee", str(p)]) == 0
    lines = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    assert [d["group"] for d in lines] == ["max_num_seqs=128", "max_num_seqs=256"]
    assert [d["peak_y"] for d in lines] == [960.0, 480.0]


def test_vllm_bench_sweep_row_without_a_limit_at_inf_rate_is_reported(tmp_path):
    runs = json.loads((DATA / "vllm_sweep" / "BENCH-max_concurrency=16" / "summary.json")
                      .read_text())
    free = dict(runs[0], max_concurrency=None, run_number=1)
    p = tmp_path / "summary.json"
    p.write_text(json.dumps([runs[0], free]), encoding="utf-8")
    res = ingest([p])
    assert len(res.runs) == 2
    assert any("item 2: kept in runs, left out of the knee: no concurrency limit and an "
               "infinite request rate" in w for w in res.report.warnings)


# ---------------------------------------------------------------------- GuideLLM
@pytest.mark.parametrize("name", ["benchmarks.json", "benchmarks.yaml", "benchmarks.csv"])
def test_guidellm_report(name, capsys):
    path = DATA / "guidellm" / name
    assert table_format(path) == "guidellm"
    runs = ingest([path]).runs.sort_values("concurrency")
    assert runs["concurrency"].tolist() == LEVELS
    assert runs["output_throughput"].tolist() == TPUT
    assert runs["request_throughput"].tolist() == pytest.approx([t / 200 for t in TPUT])
    # time_to_first_token_ms p95 is 1.25 x the mean, inter_token_latency_ms p99 1.6 x.
    assert runs["ttft_p95_s"].tolist() == pytest.approx([1.25 * t / 1000 for t in TTFT_MS])
    assert runs["itl_p99_s"].tolist() == pytest.approx([1.6 * t / 1000 for t in ITL_MS])
    # request_latency is in seconds already.
    assert runs["e2e_mean_s"].tolist() == pytest.approx(
        [(f + i * 199) / 1000 for f, i in zip(TTFT_MS, ITL_MS, strict=True)])
    assert runs["num_requests"].tolist() == [t / 2 for t in TPUT]  # 100 s x tput / 200
    assert runs["duration_s"].tolist() == [100.0] * 6
    d, _ = _knee(capsys, str(path))
    _check_knee(d)


def test_guidellm_rate_strategies_are_not_concurrency_levels(tmp_path):
    report = json.loads((DATA / "guidellm" / "benchmarks.json").read_text())
    b = report["benchmarks"]
    b[0]["config"]["strategy"] = {"type_": "synchronous"}
    b[1]["config"]["strategy"] = {"type_": "throughput", "max_concurrency": None}
    b[2]["config"]["strategy"] = {"type_": "constant", "rate": 2.5, "max_concurrency": None}
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps(report), encoding="utf-8")
    res = ingest([p])
    runs = res.runs
    assert runs["concurrency"].tolist()[:3][0] == 1.0
    assert runs["request_rate"].tolist()[1:3] == [math.inf, 2.5]
    warnings = " | ".join(res.report.warnings)
    assert "benchmarks[1] (throughput): kept in runs, left out of the knee: no concurrency " \
           "limit and an infinite request rate" in warnings
    assert "benchmarks[2] (constant): kept in runs, left out of the knee: a request-rate " \
           "level (2.5 req/s)" in warnings


# ---------------------------------------------------------------------- AIPerf
def test_aiperf_exports_of_a_sweep(capsys):
    runs = ingest([DATA / "aiperf"]).runs.sort_values("concurrency")
    assert runs["concurrency"].tolist() == LEVELS
    assert runs["output_throughput"].tolist() == TPUT
    assert runs["ttft_p95_s"].tolist() == pytest.approx([1.25 * t / 1000 for t in TTFT_MS])
    assert runs["itl_p95_s"].tolist() == pytest.approx([1.2 * t / 1000 for t in ITL_MS])
    assert runs["e2e_mean_s"].tolist() == pytest.approx(
        [(f + i * 199) / 1000 for f, i in zip(TTFT_MS, ITL_MS, strict=True)])
    assert runs["failed"].tolist() == [0.0] * 6 and runs["duration_s"].tolist() == [100.0] * 6
    assert set(runs["model"]) == {"Qwen/Qwen3-0.6B"}
    d, _ = _knee(capsys, str(DATA / "aiperf"))
    _check_knee(d)


def test_aiperf_csv_takes_the_level_from_its_folder():
    path = next((DATA / "aiperf_csv").glob("*/profile_export_aiperf.csv"))
    res = ingest([path])
    row = res.runs.iloc[0]
    assert (row["concurrency"], row["output_throughput"], row["num_requests"]) == (16, 960, 480)
    assert row["ttft_p95_s"] == pytest.approx(0.05) and row["itl_p99_s"] == pytest.approx(0.0208)
    assert any("concurrency 16 read from the artifact folder" in w
               for w in res.report.warnings)
