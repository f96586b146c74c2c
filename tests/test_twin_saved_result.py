"""The twin on what most users hold: bench results saved without --save-detailed and the
scrape log, no step log, no --run. The real sweep of ``tests/data/twin_real`` (a real vLLM
CPU server, prompts 256 +- 25%, outputs 128 +- 25%) with the fields ``vllm bench serve
--save-result`` leaves out without ``--save-detailed`` taken out, as a user's files are."""

from __future__ import annotations

import json
import shutil

import pytest

from kvpressure.ingestion.api import ingest
from kvpressure.paths import REPO_ROOT
from kvpressure.twin.api import build_twin
from kvpressure.twin.lengths import HISTOGRAMS, MEANS
from kvpressure.twin.output import up_front
from kvpressure.twin.workload import level_workloads

DATA = REPO_ROOT / "tests" / "data" / "twin_real"
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 1024,
          "scheduler_reserve_full_isl": True}
# What vllm bench serve 0.33 deletes from its result without --save-detailed.
DETAILED = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
            "errors", "server_queue_times", "server_ttfts")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    top = tmp_path_factory.mktemp("saved")
    (top / "bench").mkdir()
    for f in sorted((DATA / "bench").glob("c*.json")):
        res = {k: v for k, v in json.loads(f.read_text()).items() if k not in DETAILED}
        (top / "bench" / f.name).write_text(json.dumps(res))
    shutil.copy(DATA / "metrics.prom.jsonl.gz", top / "metrics.prom.jsonl.gz")
    run = top / "run"
    got = ingest([top / "bench", top / "metrics.prom.jsonl.gz"])
    got.write(run)
    return top, run, got


def test_ingest_matches_the_levels_to_the_scrape_log_without_run(saved):
    top, _, got = saved
    named = ingest([top / "bench", top / "metrics.prom.jsonl.gz"], run="load").runs
    runs = got.runs.sort_values("concurrency")
    assert runs["preemptions"].notna().all() and runs["preemptions"].sum() > 0
    assert runs["preemptions"].tolist() == named.sort_values("concurrency")[
        "preemptions"].tolist()
    assert any("matched to the scrape log" in w for w in got.report.warnings)


def test_the_twin_draws_lengths_from_the_histograms_and_fits_the_preemptions(saved):
    _, run, _ = saved
    twin = build_twin(run, overrides=ENGINE)
    assert set(twin.lengths_sources().values()) == {HISTOGRAMS}
    w = twin.workloads[8]
    # the measured spread, not one length: prompts 192-320 and outputs 96-160 were sent
    assert 180 <= min(w.prompt_lens) <= 210 and 300 <= max(w.prompt_lens) <= 340
    assert 85 <= min(w.output_lens) <= 110 and 145 <= max(w.output_lens) <= 170
    twin.fit(bootstrap=40)
    rep = twin.fit_report()
    assert rep.verdict.fits, rep.verdict.text
    table = rep.table.set_index("concurrency")
    for c in (8, 16):  # past the knee
        m, t = table.loc[c, "preemptions_measured"], table.loc[c, "preemptions_twin"]
        assert m > 0 and abs(t - m) <= max(0.1 * m, 2)
    assert any("from the scrape-log histograms" in a for a in twin.assumptions())
    # every request at the level's mean instead: the twin misses the preemptions at c=16
    means = build_twin(run, overrides=ENGINE)
    means.measured.drawn_lengths.clear()
    means.workloads = level_workloads(means.measured)
    assert set(means.lengths_sources().values()) == {MEANS}
    means.fit(bootstrap=40)
    miss = means.fit_report().verdict
    assert not miss.fits and 16 in [m["concurrency"] for m in miss.preemption_misses]
    assert any("spread is not in the data" in line for line in up_front(means))
