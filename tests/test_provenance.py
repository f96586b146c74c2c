"""Where a record's data came from: the vLLM that served it and on which device, the load tool,
and where each engine setting came from, read from what the data holds (never guessed)."""

from __future__ import annotations

import json
import shutil

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.provenance import load_tool, served_platform
from kvpressure.investigation.analyse import analyse
from kvpressure.paths import REPO_ROOT
from kvpressure.record.io import load_record

DATA = REPO_ROOT / "tests" / "data"
TABLES = DATA / "bench_tables"


def test_the_device_from_a_server_logs_engine_configuration():
    got = ingest([DATA / "logs" / "v1_kv_bound.log"])
    assert served_platform({"log": got.report.to_dict()}) == (
        "cuda", "the server log's engine configuration (device_config)")
    assert served_platform({}) is None
    # without a log: the local label of the version a collect folder read from /version
    assert served_platform({"r": {"runs": {"a": {"server_log": {"version": "0.32.0+cpu"}}}}}
                           )[0] == "cpu"
    assert served_platform({"r": {"runs": {"a": {"server_log": {"version": "0.33.0"}}}}}) is None


def _tool(path):
    """load_tool as ingestion calls it: the source and the bench files it holds."""
    from kvpressure.ingestion.sources import detect

    return load_tool([str(path)], [s.location for s in detect(str(path)) if s.kind == "bench"])


def test_the_load_tool_from_each_kind_of_source(tmp_path):
    assert _tool(TABLES / "guidellm" / "benchmarks.json") == "GuideLLM 0.5.0"
    assert _tool(TABLES / "guidellm" / "benchmarks.csv") == "GuideLLM"
    assert _tool(TABLES / "aiperf") == "AIPerf"
    assert _tool(TABLES / "vllm_sweep") == "vllm bench sweep"
    saved = DATA / "twin_saved" / "quiet" / "pool64_fullisl"
    assert _tool(saved / "bench") == "vllm bench serve"
    # scrapes alone do not say what loaded the server
    assert _tool(saved / "metrics.prom.jsonl.gz") is None
    # a kvpressure collect folder names its client
    folder = tmp_path / "collect"
    shutil.copytree(saved / "bench", folder / "bench")
    (folder / "engine.json").write_text(json.dumps({"client": {"name": "builtin client",
                                                               "kvpressure": "0.1.0"}}))
    assert _tool(folder / "bench") == (
        "kvpressure collect 0.1.0 (builtin client)")


def test_an_ingested_record_names_its_platform_tool_and_settings_sources(tmp_path):
    run = tmp_path / "run"
    analyse(run, source=[str(DATA / "logs" / "v1_kv_bound.log")],
            engine_args={"max_num_batched_tokens": 2048})
    prov = load_record(run / "record.yaml").provenance
    assert prov.platform == "cuda" and prov.load_tool is None
    assert prov.engine_args_from["max_num_batched_tokens"] == "given (engine_args)"
    assert prov.engine_args_from["max_num_seqs"] == "the server log's start-up arguments"


def test_a_simulated_record_names_the_profile_and_each_settings_source(ci_small_report):
    prov = load_record(ci_small_report.record_path).provenance
    assert prov.platform == "simulated NVIDIA L40S"
    assert prov.load_tool == "the simulation's closed-loop clients"
    assert prov.engine_args_from["max_model_len"] == "the experiment (ci_small)"
    assert prov.engine_args_from["num_gpu_blocks"].startswith("sized from the hardware profile")
    assert prov.engine_args_from["max_num_seqs"] == "vLLM 0.33.0 default"
    page = (ci_small_report.run_dir / "index.html").read_text()
    assert "simulated NVIDIA L40S · load: the simulation&#39;s closed-loop clients" in page


def test_a_collect_folders_server_log_gives_the_device(tmp_path):
    from kvpressure.ingestion.server_log import startup_facts

    log = DATA / "logs" / "v1_kv_bound.log"
    facts = startup_facts(log)
    assert facts["device"] == "cuda" and facts["from_log"] == str(log)
    folder = tmp_path / "collect"
    (folder / "bench").mkdir(parents=True)
    (folder / "engine.json").write_text(json.dumps({"server": {"version": "0.32.0", **facts}}))
    device, where = served_platform({}, [str(folder / "bench")])
    assert device == "cuda" and "collect --server-log" in where


def test_a_real_vllm_log_names_its_version_and_device():
    """The log vLLM 0.32.0's CPU build wrote (tests/data/logs/vllm_cpu_0.32.0.log.gz)."""
    from kvpressure.ingestion.server_log import startup_facts

    facts = startup_facts(DATA / "logs" / "vllm_cpu_0.32.0.log.gz")
    assert (facts["version"], facts["device"]) == ("0.32.0", "cpu")
    got = ingest([DATA / "logs" / "vllm_cpu_0.32.0.log.gz"])
    assert served_platform({"log": got.report.to_dict()})[0] == "cpu"
