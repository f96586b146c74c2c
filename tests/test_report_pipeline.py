"""The batch report end to end on the small built-in experiment, and on its data read back."""

from __future__ import annotations

import os
import re
import shutil
import sys

import nbformat
import pytest
import yaml

from kvpressure.analysis.status import KV_BOUND
from kvpressure.errors import InputError
from kvpressure.investigation.report import make_report, parse_params
from kvpressure.notebooks.batch import NOTEBOOKS, NotebookFailed, run_notebooks
from kvpressure.paths import REPO_ROOT
from kvpressure.record.io import load_record
from kvpressure.report.html import embedded_images
from kvpressure.stages.files import read_stage
from kvpressure.stages.results import CollectInfo, ComparisonResult, KneeResult, VerdictResult
from report_helpers import empty_fields

EXPERIMENT = REPO_ROOT / "data" / "experiments" / "ci_small.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def simulated(ci_small_report):
    return ci_small_report


def test_record_is_complete_and_agrees_with_the_stages(simulated):
    data = yaml.safe_load(simulated.record_path.read_text())
    # Only a status that calls for no remedy may leave the remedies empty.
    allowed = [] if data["status"] == KV_BOUND else [["remedies"], []]
    # A simulation was served by no vLLM; a curve whose levels all differ has no same-schedule
    # tail: those nulls mean something, every other field has a value.
    meaningful = {"provenance.vllm_version_served", "perf.knee.same_schedule_from"}
    assert [p for p in empty_fields(data) if p not in meaningful] in (allowed or [[]])
    record = load_record(simulated.record_path)
    verdict = read_stage(simulated.run_dir, VerdictResult)
    knee = read_stage(simulated.run_dir, KneeResult)
    assert record.status == verdict.status.status
    assert record.scheduler.preemption_mode == "recompute"
    # The curve in the record is the baseline's runs.csv rows, level by level (means over seeds).
    assert [p.concurrency for p in record.perf.throughput_by_concurrency] == [4, 8, 16, 24, 32, 48]
    assert record.perf.knee.peak_y == max(
        p.output_throughput for p in record.perf.throughput_by_concurrency)
    assert knee.knee is not None and record.perf.knee.knee_x == knee.knee.knee_x
    # Simulation counts recompute exactly: the range collapses to the value.
    c = record.counters
    assert c.recompute_exact and c.recompute_ratio_range == (c.recompute_ratio, c.recompute_ratio)
    assert record.scheduler.max_num_seqs_effective <= record.scheduler.max_num_seqs
    assert record.workload.concurrency == 32  # the experiment's focus
    assert record.provenance.seed == 7 and record.provenance.mode == "simulation"


def test_kv_bound_case_is_kv_bound(simulated):
    record = load_record(simulated.record_path)
    assert record.status == KV_BOUND
    # Confirmed by the single-variable control: lowering max_num_seqs moves the turn of the
    # curve right beyond the spread of the workload seeds.
    assert record.evidence.comparison.beyond_noise
    assert "repeated measurements" in record.evidence.comparison.noise
    assert record.provenance.seeds[0] == record.provenance.seed == 7
    assert len(set(record.provenance.seeds)) == 3


def test_index_html_verdict_first_with_embedded_figures(simulated):
    page = simulated.index_path.read_text()
    verdict = page.index('id="verdict"')
    first_img = page.index("<img")
    assert verdict < first_img
    assert page.index(load_record(simulated.record_path).status) < first_img
    # the verdict shows the curve it speaks of: the headline figure sits inside its section
    assert first_img < page.index("</section>", verdict)
    images = embedded_images(page)
    assert len(images) >= 8
    assert all(img.startswith(PNG_MAGIC) for img in images)
    # No code: inputs and stderr streams are left out.
    assert "import " not in re.sub(r"<[^>]+>", "", page)
    assert "ensure_collected" not in page and "Traceback" not in page
    from kvpressure.report.page_check import page_problems

    assert page_problems(page, simulated.run_dir) == []
    for name in NOTEBOOKS:
        assert f'id="{name}"' in page
        nb = nbformat.read(simulated.run_dir / "notebooks" / f"{name}.ipynb", as_version=4)
        assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def test_ingested_sweep_gives_the_same_status(simulated, tmp_path):
    settings = read_stage(simulated.run_dir, CollectInfo).settings
    engine = {k: settings[k] for k in ("max_num_seqs", "max_num_batched_tokens",
                                       "scheduling_policy", "max_model_len")}
    source = tmp_path / "scrapes"
    # Keep only the scrapes: what a real load test would leave behind.
    for f in (simulated.run_dir / "points").rglob("metrics.prom.jsonl"):
        dest = source / f.relative_to(simulated.run_dir / "points")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    res = make_report(tmp_path / "ingested", sources=[source],
                      params={"engine_args": engine, "model_name": "llama-3.1-8b",
                              "focus_concurrency": 32},
                      progress=lambda _m: None, stream=None)
    ingested, simulated_rec = load_record(res.record_path), load_record(simulated.record_path)
    assert ingested.provenance.mode == "ingested" and not ingested.counters.recompute_exact
    assert ingested.status == simulated_rec.status
    assert ingested.workload.concurrency == simulated_rec.workload.concurrency
    low, high = ingested.counters.recompute_ratio_range
    assert low <= simulated_rec.counters.recompute_ratio <= high


def _notebook(path, *codes):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('run_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *(nbformat.v4.new_code_cell(c) for c in codes)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def test_failing_notebook_names_notebook_and_cell_and_keeps_it(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(src / "01_collect.ipynb", "x = 1")
    _notebook(src / "02_recompute.ipynb", "y = 2", "raise ValueError('no preemptions counted')")
    _notebook(src / "06_record.ipynb", "z = 3")
    with pytest.raises(NotebookFailed) as err:
        run_notebooks(tmp_path / "run", notebooks=["01_collect", "02_recompute", "06_record"],
                      notebooks_dir=src, progress=None, stream=None)
    exc = err.value
    assert exc.notebook == "02_recompute" and exc.ename == "ValueError"
    # Cells: parameters, injected-parameters, y = 2, raise -> index 3.
    assert exc.cell_index == 3
    assert "02_recompute.ipynb" in str(exc) and "cell 3" in str(exc)
    kept = nbformat.read(exc.executed_path, as_version=4)
    errors = [c for c in kept.cells if c.cell_type == "code"
              and any(o.get("output_type") == "error" for o in c.outputs)]
    assert [c.source for c in errors] == ["raise ValueError('no preemptions counted')"]
    assert errors[0].execution_count == exc.execution_count == 4
    # Every notebook starts from a fresh namespace and counter, and no stray output.
    assert all(not c.outputs for c in kept.cells if c.cell_type == "code" and c not in errors)
    assert not (tmp_path / "run" / "notebooks" / "06_record.ipynb").exists()


def test_cli_exits_nonzero_naming_the_notebook(monkeypatch, capsys, tmp_path):
    from kvpressure import cli
    from kvpressure.investigation import report

    def boom(*_a, **_k):
        raise NotebookFailed("03_knee", 4, 3, "AssertionError", "", "assert k", tmp_path / "x")

    monkeypatch.setattr(report, "make_report", boom)
    code = cli.main(["report", "--experiment", str(EXPERIMENT), "--out", str(tmp_path / "o")])
    assert code == 1
    assert "03_knee.ipynb failed in cell 4" in capsys.readouterr().err


def test_bad_parameters_are_refused(tmp_path):
    assert parse_params(["focus_concurrency=32", "engine_args={max_num_seqs: 8}"]) == {
        "focus_concurrency": 32, "engine_args": {"max_num_seqs": 8}}
    with pytest.raises(InputError, match="--param run_dir"):
        parse_params(["run_dir=/tmp"])
    with pytest.raises(InputError, match="--param focus_concurency: no notebook"):
        make_report(tmp_path / "o", experiment=EXPERIMENT, params={"focus_concurency": 1})
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="holds files kvpressure did not write"):
        make_report(other, experiment=EXPERIMENT)
    assert (other / "notes.txt").read_text() == "keep me"
    assert sys.modules  # the refusals above ran no notebook


def test_report_reads_the_record_notebook_06_wrote(tmp_path):
    from kvpressure.investigation.report import notebook_record

    with pytest.raises(InputError, match=r"record\.yaml: not written; notebook 06_record"):
        notebook_record(tmp_path)
    (tmp_path / "record.yaml").write_text("status: probably KV\n")
    with pytest.raises(InputError, match=r"record\.yaml: field scheduler: Field required"):
        notebook_record(tmp_path)


# --------------------------------------------------------------------------- stage helpers
def _tables_with_steps(t0, t1):
    import pandas as pd

    from kvpressure.investigation.collect import Tables
    from kvpressure.stages.results import Focus

    # Steps of 0.1 s from t = 0: step k starts at 0.1 k, its outputs land at 0.1 (k + 1).
    n = 30
    steps = pd.DataFrame({
        "step": range(n), "time_s": [0.1 * k for k in range(n)], "step_duration_s": [0.1] * n,
        "num_prefill_tokens": [0] * n, "num_decode_tokens": [8] * n, "kv_usage": [0.5] * n,
        "preemptions": [0] * n, "recomputed_tokens": [0] * n, "num_scheduled_tokens": [8] * n,
    })
    # Only the focus window is read: a CollectInfo without the rest of stage 01.
    info = CollectInfo.model_construct(focus=Focus(variant="baseline", concurrency=8, run="p",
                                                   why="a test window", t0=t0, t1=t1))
    return Tables(info, pd.DataFrame(), pd.DataFrame(), steps, None)


@pytest.mark.parametrize(("t0", "t1", "first", "last"), [
    (0.0, 1.0, 0, 9),   # t0 = 0 is a bound like any other: outputs after 0, i.e. every step
    (1.05, 2.05, 10, 19),  # step 10 starts at 1.0 < t0 but its outputs (1.1) are in the window
])
def test_interference_view_shows_the_steps_the_analysis_judges(t0, t1, first, last):
    from kvpressure.investigation.stages import interference_stage

    view = interference_stage(_tables_with_steps(t0, t1)).frames["steps"]
    # Chosen by output time (time_s + step_duration_s) in (t0, t1], as the analysis chooses.
    assert view["t"].round(9).tolist() == [round(0.1 * k, 9) for k in range(first, last + 1)]


def test_comparison_words_say_what_moved():
    from kvpressure.analysis.compare import moved_right_words

    assert moved_right_words(["sustained range"]) == (
        "the end of the sustained range moves right beyond noise (the knee itself does not move "
        "beyond noise)")
    assert moved_right_words(["knee", "sustained range"]) == (
        "the knee moves right beyond noise (knee and sustained range)")
    assert moved_right_words(["knee"], past=True) == "the knee moved right beyond noise (knee)"


def test_comparison_summary_agrees_with_the_knees(simulated):
    from kvpressure.analysis.compare import moved_right_by

    compare = read_stage(simulated.run_dir, ComparisonResult)
    record = load_record(simulated.record_path)
    by = moved_right_by(compare.shifts)
    assert by and record.evidence.comparison.summary == compare.summary
    sustained_only = "the end of the sustained range moves right beyond noise (the knee itself"
    if "knee" in by:
        assert "The knee moves right beyond noise (knee" in compare.summary
    else:  # every knee is "within noise": the summary must not say the knee moves
        assert all(not s.knee_beyond_noise for s in compare.shifts)
        assert "The knee moves right" not in compare.summary
        assert sustained_only.capitalize() in compare.summary
        assert "the knee itself did not move beyond noise" in record.evidence.reasons[0]


def test_recompute_ratios_say_which_measurement_they_are(simulated):
    page = simulated.index_path.read_text()
    record = load_record(simulated.record_path)
    seed = record.provenance.seed
    assert f"<th>recompute ratio (in the focus window, seed {seed})</th>" in page
    n = len(record.provenance.seeds)
    assert all(f"(whole runs, mean of {n} seeds)" in r.effect
               for r in record.remedies if "recompute ratio" in r.effect)
    assert any("recompute ratio" in r.effect for r in record.remedies)


def test_experiment_is_a_file_or_a_built_in_name(tmp_path):
    from kvpressure.investigation.report import experiment_file

    # As `kvpressure sweep` takes it: a bare name is data/experiments/<name>.yaml.
    assert experiment_file("ci_small") == EXPERIMENT
    assert experiment_file(EXPERIMENT) == EXPERIMENT
    with pytest.raises(InputError, match=r"--experiment no_such_case: .*not found"):
        make_report(tmp_path / "o", experiment="no_such_case")
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_analyse_without_jupyter_writes_what_the_notebooks_wrote(simulated, tmp_path):
    """Stages 02-06 re-run in one process from the report's stage 01: every analysis JSON and
    the record equal the notebooks' byte for byte (the notebooks only show and explain)."""
    import shutil

    from kvpressure.investigation.analyse import analyse

    copy = tmp_path / "copy"
    shutil.copytree(simulated.run_dir, copy)
    analyse(copy, simulate_remedies=True)
    for name in ("recompute", "knee", "compare", "interference", "record"):
        a = (simulated.run_dir / "analysis" / f"{name}.json").read_bytes()
        b = (copy / "analysis" / f"{name}.json").read_bytes()
        assert a == b, name
    assert (copy / "record.yaml").read_bytes() == simulated.record_path.read_bytes()


def test_terminal_closes_with_the_verdict_and_the_recommendation(simulated):
    from kvpressure.investigation.verdict import closing_lines

    lines = closing_lines(simulated.run_dir)
    record = load_record(simulated.record_path)
    rec = read_stage(simulated.run_dir, VerdictResult).remedies.recommendation
    assert lines[0] == f"status: {record.status}"
    assert f"peaks at {record.perf.knee.peak_y:,.0f} tok/s" in lines[1]
    assert "The operating limit is concurrency" in lines[1]
    assert lines[2] == rec["text"]
    # The recommendation is the remedy with the largest gain among those within the limits.
    best = max(rec["ranked"], key=lambda r: r["gain_pct"])
    assert rec["text"].startswith(f"Do this: set {best['parameter']} to {best['value']}")
    assert all(not r["breaks"] for r in rec["ranked"])


@pytest.mark.browser
def test_top_screen_shows_the_recommendation_above_the_first_figure(simulated, tmp_path):
    from kvpressure.report.screenshot import (
        check_screenshot,
        find_chromedriver,
        find_chromium,
        page_layout,
    )

    if find_chromium() is None or find_chromedriver() is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise RuntimeError("CI is set but chromium/chromium-driver are not installed")
        pytest.skip("chromium or chromium-driver not installed (scripts/system-deps.sh)")
    png = tmp_path / "top.png"
    layout = page_layout(simulated.index_path, {
        "status": ".status", "do": "#recommendation p.do", "figure": "img"},
        width=1280, height=800, png_path=png)
    rec = read_stage(simulated.run_dir, VerdictResult).remedies.recommendation
    assert layout["do"]["text"] == rec["text"] and rec["text"].startswith("Do this: set ")
    # Status, then the recommendation, then the first figure; all of it on the first screen.
    assert layout["status"]["bottom"] <= layout["do"]["top"]
    assert layout["do"]["bottom"] <= layout["figure"]["top"]
    assert layout["do"]["bottom"] <= 800
    assert check_screenshot(png).problems() == []
    # Every figure says what it shows.
    page = simulated.index_path.read_text()
    assert 'alt="figure"' not in page and len(re.findall(r'<img alt="[^"]{20,}"', page)) >= 8
