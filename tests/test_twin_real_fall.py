"""The twin on a real server whose curve falls: fitted on the server's own steps (its log of
iteration details), it must reproduce the real preemptions and throughput and predict each
remedy's change as the same server setup measured it (``tests/data/twin_real_fall/README.md``).

Targets of the twin's validation: preemptions within 10% (or 2) a level, throughput within
15%, the knee within one level, a remedy's change within 10 points of the measured one, with
its sign."""

from __future__ import annotations

import os
import shutil

import pytest

from kvpressure.errors import InputError
from kvpressure.investigation.analyse import analyse
from kvpressure.paths import REPO_ROOT
from kvpressure.twin.api import build_twin

DATA = REPO_ROOT / "tests" / "data" / "twin_real_fall"
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 128,
          "scheduler_reserve_full_isl": False}
# Measured on real vLLM 0.32.0 (CPU): change in output throughput at c=8, mean of 4 paired
# rounds and its 95% interval (the data's README).
MEASURED_AT_8 = {
    "max_num_seqs_pool": ({"max_num_seqs": 5}, 47.0, (30.6, 63.3)),
    "pool_doubled": ({"num_gpu_blocks": 128}, 76.5, (67.6, 85.5)),
    "full_isl_admission": ({"scheduler_reserve_full_isl": True}, 38.8, (31.0, 46.6)),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fall") / "run"
    analyse(run, source=[str(DATA / "bench"), str(DATA / "metrics.prom.jsonl.gz")],
            engine_args=ENGINE, simulate_remedies=False)
    return run


@pytest.fixture(scope="module")
def twin(run):
    built = build_twin(run, server_log=DATA / "server.log.gz")
    built.fit(bootstrap=50)
    return built


def test_the_step_trace_is_matched_to_the_levels_whatever_the_file_time(run, tmp_path):
    # vLLM's log lines have no year; a log checked out years later has the checkout's time
    log = tmp_path / "server.log.gz"
    shutil.copy(DATA / "server.log.gz", log)
    later = 1956528000  # 2032-01-01
    os.utime(log, (later, later))
    built = build_twin(run, server_log=log)
    built.fit(bootstrap=0)
    assert built.fitted.describe()["t0"]["source"].startswith("step trace")
    assert built.return_lag is not None and "step trace" in built.return_lag.source


def test_the_settings_come_from_the_server(twin):
    # cache_config_info says the pool and that prefix caching was off: every preemption
    # recomputes, which is what makes this curve fall
    assert twin.settings["num_gpu_blocks"] == 64
    assert twin.settings["enable_prefix_caching"] is False
    assert twin.settings["scheduler_reserve_full_isl"] is False


def test_the_twin_fits_the_falling_curve(twin):
    report = twin.fit_report()
    table = report.table.set_index("concurrency")
    measured = table["output_throughput_measured"]
    assert measured.idxmax() == 4 and measured[8] < 0.8 * measured[4]  # the real curve falls
    for c, row in table.iterrows():
        assert abs(row["output_throughput_error_pct"]) <= 15, c
        m, t = row["preemptions_measured"], row["preemptions_twin"]
        assert abs(t - m) <= max(2, 0.10 * m), (c, m, t)
    assert table.loc[8, "preemptions_measured"] > 100
    # the knee, where growth stops: the first level within 5% of its curve's peak
    levels = list(table.index)

    def knee(col: str) -> int:
        return levels.index(next(c for c in levels if table.loc[c, col] >= 0.95 * table[col].max()))

    assert abs(knee("output_throughput_twin") - knee("output_throughput_measured")) <= 1


@pytest.mark.parametrize("remedy", sorted(MEASURED_AT_8))
def test_each_remedy_is_predicted_as_the_real_server_measured_it(twin, remedy):
    overrides, measured, (lo, hi) = MEASURED_AT_8[remedy]
    base = twin.predict_level(8, {})["output_throughput"]
    predicted = 100 * (twin.predict_level(8, overrides)["output_throughput"] / base - 1)
    assert predicted > 0 and lo > 0  # the sign, measured beyond doubt
    assert abs(predicted - measured) <= 10, (remedy, predicted, measured)
    # and where none of them acts, nothing changes
    assert twin.predict_level(4, overrides)["output_throughput"] == pytest.approx(
        twin.predict_level(4, {})["output_throughput"], rel=0.02)


def test_a_server_log_given_as_a_source_gives_the_step_trace(tmp_path):
    # what a user types: each file its own --source, the server log among them
    import json

    from kvpressure.cli import main

    run = tmp_path / "run"
    engine = json.dumps(ENGINE)
    assert main(["analyse", str(run), "--source", str(DATA / "bench"),
                 "--source", str(DATA / "metrics.prom.jsonl.gz"),
                 "--source", str(DATA / "server.log.gz"),
                 "--param", f"engine_args={engine}", "--remedies"]) == 0
    assert len(json.loads((run / "sources.json").read_text())["sources"]) == 3
    doc = json.loads((run / "twin" / "twin.json").read_text())
    assert [r["concurrency"] for r in doc["fit"]["levels"]] == [2, 4, 8, 16]
    assert doc["step_time"]["coefficients"]["t0"]["source"].startswith("step trace")


def test_an_open_loop_sweep_without_the_server_log_is_refused_with_the_reason(tmp_path):
    # the same requests sent at a request rate with no concurrency limit (an open loop): its
    # twin is keyed by rate, and cannot be fitted on the levels' aggregates alone
    import json

    bench = tmp_path / "bench"
    bench.mkdir()
    for c, rate in ((2, 2.0), (8, 8.0)):
        doc = json.loads((DATA / "bench" / f"c{c}.json").read_text())
        doc.update(max_concurrency=None, request_rate=rate)
        (bench / f"rate{rate:g}.json").write_text(json.dumps(doc))
    from kvpressure.cli import main

    run = tmp_path / "run"
    assert main(["ingest", str(bench), "--run", "load", "--out", str(run)]) == 0
    twin = build_twin(run, overrides={"num_gpu_blocks": 64})
    assert twin.open_loop and sorted(twin.workloads) == [2.0, 8.0]
    with pytest.raises(InputError, match="no step trace: start vLLM with "
                                         "--enable-logging-iteration-details"):
        twin.fit(bootstrap=0)
