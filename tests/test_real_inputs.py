"""Every real-world input shape gives a record or a clear refusal, and the right diagnosis.

Fast checks go through :func:`kvpressure.investigation.analyse.analyse` (the notebooks' library calls
without Jupyter); a few go through ``kvpressure report`` end to end, notebooks included.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpressure.analysis.status import KV_BOUND, NOT_ESTABLISHED
from kvpressure.errors import InputError
from kvpressure.ingestion.load_window import STEADY_FRACTION, in_engine, steady_part
from kvpressure.investigation.analyse import analyse
from kvpressure.paths import REPO_ROOT
from kvpressure.record.io import load_record
from kvpressure.sweeps.replay import replay_sweep
from kvpressure.sweeps.sweep import run_sweep

REAL = REPO_ROOT / "tests" / "data" / "real"
SMALL_POOL = REPO_ROOT / "tests" / "data" / "experiments" / "small_pool_b32.yaml"
HEAVY = REPO_ROOT / "tests" / "data" / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvpressure.cli", *args], capture_output=True,
                          text=True, timeout=600)


# --------------------------------------------------------------------------- single dumps
def test_idle_v0_dump_is_a_snapshot_with_no_load(tmp_path):
    rec = load_record(analyse(tmp_path / "r", source=str(REAL / "v0_idle.prom")))
    assert rec.status == NOT_ESTABLISHED
    assert "no load in the data" in rec.evidence.reasons[0]
    w = rec.counters.window
    assert w.snapshot and w.start_s == w.end_s
    # Counters of a lone dump count from the server's start: the dump's own value, not 0.
    assert rec.counters.num_preemptions_total == 41
    # The pool from V0's cache_config_info.
    assert rec.scheduler.num_gpu_blocks == 27000 and rec.scheduler.block_size == 16
    assert rec.counters.kv_cache_usage_perc == 0.0  # measured: idle, not missing


def test_loaded_early_v1_dump_without_reasons_or_preemptions(tmp_path):
    rec = load_record(analyse(tmp_path / "r", source=str(REAL / "early_v1_loaded.prom"),
                              engine_args={"max_num_seqs": 256}))
    c = rec.counters
    assert c.window.snapshot
    assert (c.num_requests_running, c.num_requests_waiting) == (18, 46)
    assert c.kv_cache_usage_perc == pytest.approx(0.97198599, abs=1e-6)  # gpu_cache_usage_perc
    # What the server does not export is missing, with the metric named; never zero.
    assert c.num_preemptions_total is None and c.waiting_capacity is None
    assert "counters.num_preemptions_total" in rec.missing
    assert "num_preemptions_total" in rec.missing["counters.num_preemptions_total"]
    # 46 wait while 18 of 256 run and the pool is full: KV-bound from the snapshot's gauges.
    assert rec.status == KV_BOUND and not rec.evidence.reasons[0].startswith("3")


def test_same_dump_without_max_num_seqs_says_what_is_missing(tmp_path):
    rec = load_record(analyse(tmp_path / "r", source=str(REAL / "early_v1_loaded.prom")))
    # Judged under vLLM's smallest default max_num_seqs (fewer sequences ever ran), the
    # assumption named with how to give the real value; the setting itself stays unmeasured.
    assert rec.status == KV_BOUND
    assert rec.scheduler.max_num_seqs is None and "scheduler.max_num_seqs" in rec.missing
    assert any(r.startswith("assumed: max_num_seqs is not in the data") and "256" in r
               for r in rec.evidence.reasons)
    assert "num_preemptions_total" in " ".join(rec.evidence.reasons + list(rec.missing.values()))


def test_real_vllm_dumps_idle_and_loaded(tmp_path):
    """``/metrics`` exactly as a real vLLM 0.32.0 server served it (tests/data/real/README.md)."""
    idle = load_record(analyse(tmp_path / "i", source=str(REAL / "vllm_0.32_cpu_idle.prom"),
                               engine_args={"max_num_seqs": 32}))
    assert idle.status == NOT_ESTABLISHED and "no load in the data" in idle.evidence.reasons[0]
    assert idle.counters.num_preemptions_total == 0
    rec = load_record(analyse(tmp_path / "l", source=str(REAL / "vllm_0.32_cpu_loaded.prom"),
                              engine_args={"max_num_seqs": 32}))
    c = rec.counters
    assert c.window.snapshot
    # The values on the wire, and the pool from vllm:cache_config_info.
    assert (c.num_requests_running, c.waiting_capacity, c.kv_cache_usage_perc) == (6, 19, 1.0)
    assert c.num_preemptions_total == 20  # since the server started
    assert (rec.scheduler.num_gpu_blocks, rec.scheduler.block_size) == (24, 32)
    assert rec.status == KV_BOUND


def test_dump_of_declared_families_only_is_refused_naming_it(tmp_path):
    with pytest.raises(InputError, match=r"declared_only\.prom.*declared.*without a single "):
        analyse(tmp_path / "r", source=str(REAL / "declared_only.prom"))


def test_idle_scrape_log_says_no_load(tmp_path):
    text = (REAL / "v0_idle.prom").read_text()
    log = tmp_path / "idle.jsonl"
    log.write_text("".join(json.dumps({"t": 1.7e9 + 5 * i, "text": text}) + "\n"
                           for i in range(12)))
    rec = load_record(analyse(tmp_path / "r", source=str(log)))
    assert rec.status == NOT_ESTABLISHED and "no load in the data" in rec.evidence.reasons[0]
    assert not rec.counters.window.snapshot
    assert rec.counters.num_preemptions_total == 0  # nothing happened over the log


# --------------------------------------------------------------------------- windows
@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    """A KV-bound sweep of a small pool in 32-token blocks, replayed as a real load test: one
    continuous 1 s scrape log with idle seconds between levels, bench dates to the second."""
    out = tmp_path_factory.mktemp("small_pool")
    runs = run_sweep(SMALL_POOL, out / "sweep", compare=False, seeds=1, jobs=1)
    replay = replay_sweep(out / "sweep" / "points" / "baseline", out / "lt",
                          bench_timezone="UTC", scrape_interval_s=1.0, idle_scrapes=3)
    run_dir = out / "run"
    rec = load_record(analyse(run_dir, source=[str(replay.log.parent / "bench"),
                                               str(replay.log)],
                              bench_timezone="UTC", engine_args={"max_num_seqs": 256}))
    return runs.sort_values("concurrency").reset_index(drop=True), replay, run_dir, rec


@pytest.mark.slow
def test_gauges_are_read_over_the_steady_load_only(small_pool):
    sim, replay, run_dir, _ = small_pool
    got = pd.read_csv(run_dir / "runs.csv").sort_values("concurrency").reset_index(drop=True)
    log = [json.loads(x) for x in replay.log.read_text().splitlines()]
    for (_, row), (_, s) in zip(got.iterrows(), sim.iterrows(), strict=True):
        c = int(row["concurrency"])
        start, end = replay.spans[c]
        # The steady part lies inside the level's true span: no idle scrape in it.
        assert start <= row["t_steady_start"] < row["t_steady_end"] <= end + 1.0
        # Counters over the whole level window: exactly the simulation's own count.
        assert row["preemptions"] == s["preemptions"]
        # The steady part starts and ends on scrapes at the level's load (the module's rule);
        # inside it the engine is idle only at the instant between a finish and the client's
        # next request, never for an idle gap.
        n = [sum(float(line.rsplit(" ", 1)[1]) for line in sc["text"].splitlines()
                 if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")))
             for sc in log if row["t_steady_start"] <= sc["t"] <= row["t_steady_end"]]
        assert min(n[0], n[-1]) >= STEADY_FRACTION * c
        assert np.mean(np.array(n) == 0) < 0.05
    # The whole bench window holds idle scrapes: its KV mean is lower than the steady one.
    top = got.iloc[-1]
    scrapes = [sc for sc in log if top["t_start"] <= sc["t"] <= top["t_end"]]
    usage = [float(next(line.rsplit(" ", 1)[1] for line in sc["text"].splitlines()
                        if line.startswith("vllm:kv_cache_usage_perc{"))) for sc in scrapes]
    assert min(usage) == 0.0 and top["mean_kv_usage"] > np.mean(usage)


@pytest.mark.slow
def test_small_pool_with_swinging_usage_is_kv_bound(small_pool):
    _, _, _, rec = small_pool
    checks = {c.name: c.holds for c in rec.evidence.checks}
    # The gauge is not near full for most of the window (preemptions free whole 32-token
    # blocks), yet the direct evidence is there: the status follows it.
    assert checks["vllm:kv_cache_usage_perc stays near 1"] is False
    assert rec.counters.kv_cache_usage_perc < 0.95
    assert checks["vllm:num_requests_running stays below --max-num-seqs while requests wait"]
    assert checks["preemptions rise and so does the recompute ratio"]
    assert rec.status == KV_BOUND
    w = rec.counters.window
    assert w.start_s < w.gauges_start_s < w.gauges_end_s <= w.end_s


@pytest.mark.slow
def test_one_level_scrape_log_alone_is_kv_bound(small_pool, tmp_path):
    """The simulation's own scrape log of the level past the knee, given alone: gauges over the
    steady part of the log, the same verdict as with the bench results."""
    sim, replay, _, _ = small_pool
    log = replay.log.parent.parent / "sweep" / "points" / "baseline" / "c8" / "metrics.prom.jsonl"
    rec = load_record(analyse(tmp_path / "r", source=str(log), focus_concurrency=8,
                              engine_args={"max_num_seqs": 256}))
    assert rec.status == KV_BOUND and rec.counters.window.concurrency == 8
    level = sim[sim["concurrency"] == 8].iloc[0]
    # Counters over the whole log: the simulation's count for that level.
    assert rec.counters.num_preemptions_total == level["preemptions"]


@pytest.mark.slow
def test_light_load_is_not_called_kv_bound(small_pool, tmp_path):
    _, replay, _, _ = small_pool
    rec = load_record(analyse(tmp_path / "r", source=[str(replay.log.parent / "bench"),
                                                      str(replay.log)],
                              bench_timezone="UTC", engine_args={"max_num_seqs": 256},
                              focus_concurrency=1))
    assert rec.counters.window.concurrency == 1 and rec.status == NOT_ESTABLISHED


def test_steady_part_rule_on_a_hand_made_ramp():
    # Closed loop at 8: ramp 0, 3, 6, then 8, 7, 8, 8, drain 5, 2, idle 0.
    n = [0, 3, 6, 8, 7, 8, 8, 5, 2, 0]
    t = np.arange(len(n), dtype=float)
    series = pd.DataFrame({"run": "r", "t": np.concatenate([t, t]),
                           "metric": ["vllm:num_requests_running"] * len(n)
                           + ["vllm:num_requests_waiting"] * len(n),
                           "labels": "", "value": [min(x, 4) for x in n] + [max(x - 4, 0)
                                                                           for x in n]})
    assert in_engine(series).tolist() == n
    part = steady_part(series, concurrency=8)
    # >= 0.75 x 8 = 6: from the scrape at 2 s to the one at 6 s.
    assert STEADY_FRACTION == 0.75 and (part.t0, part.t1) == (2.0, 6.0)
    assert part.steady_scrapes == 5 and part.loaded_scrapes == 8


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_report_on_early_v1_dump_exits_0(tmp_path):
    out = tmp_path / "r"
    res = _cli("report", "--source", str(REAL / "early_v1_loaded.prom"), "--out", str(out),
               "--param", "engine_args={max_num_seqs: 256}")
    assert res.returncode == 0, res.stderr
    assert load_record(out / "record.yaml").status == KV_BOUND
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_report_on_declared_only_dump_exits_2_naming_the_file(tmp_path):
    res = _cli("report", "--source", str(REAL / "declared_only.prom"), "--out",
               str(tmp_path / "r"))
    assert res.returncode == 2
    assert "declared_only.prom" in res.stderr and "Traceback" not in res.stderr


# --------------------------------------------------------------------------- property
def _families(text: str) -> dict[str, list[str]]:
    """Lines of each family of an exposition (its # lines and samples)."""
    fams: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            current = line.split()[2]
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if current is None or not name.startswith(current):
                current = name
        if current is not None:
            fams.setdefault(current, []).append(line)
    return fams


def _heavy_scrapes() -> list[dict]:
    import gzip

    with gzip.open(HEAVY, "rt") as fh:
        return [json.loads(x) for x in fh if x.strip()]


SCRAPES = _heavy_scrapes()
FAMILIES = sorted(_families(SCRAPES[len(SCRAPES) // 2]["text"]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(keep=st.sets(st.sampled_from(FAMILIES)), n=st.integers(1, 6),
       first=st.integers(0, len(SCRAPES) - 7), idle=st.booleans(),
       declared_only=st.booleans())
def test_any_subset_of_families_gives_a_record_or_a_refusal(tmp_path_factory, keep, n, first,
                                                            idle, declared_only):
    out = tmp_path_factory.mktemp("prop")
    lines = []
    for sc in SCRAPES[first:first + n]:
        fams = _families(sc["text"])
        body = []
        for name in sorted(keep):
            for line in fams.get(name, []):
                if declared_only and not line.startswith("#"):
                    continue
                if idle and line.startswith(("vllm:num_requests_running",
                                             "vllm:num_requests_waiting",
                                             "vllm:kv_cache_usage_perc")):
                    line = line.rsplit(" ", 1)[0] + " 0.0"
                body.append(line)
        lines.append(json.dumps({"t": 1.75e9 + sc["t"], "text": "\n".join(body) + "\n"}))
    log = out / "log.jsonl"
    log.write_text("\n".join(lines) + "\n")
    try:
        rec = load_record(analyse(out / "r", source=str(log),
                                  engine_args={"max_num_seqs": 256}))
    except InputError as exc:
        assert str(log) in str(exc) or "log.jsonl" in str(exc) or "series" in str(exc)
        return
    # Whatever is null is explained; what was not given is never read as zero.
    if not any(f.startswith("vllm:num_preemptions") for f in keep) or declared_only:
        assert rec.counters.num_preemptions_total is None
    if rec.counters.num_preemptions_total is not None:
        assert math.isfinite(rec.counters.num_preemptions_total)
    assert rec.counters.window.snapshot == (n == 1)
