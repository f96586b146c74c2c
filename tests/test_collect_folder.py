"""A ``kvpressure collect`` run folder given as a source (collected with ``--no-report``, reported
later): read as the parts its own report reads, with the engine arguments it recorded.

The folder is a real one: ``collect`` against the real vLLM 0.32 CPU server of the e2e suite
(24 KV blocks of 32 tokens, levels 1, 2, 4, 8 of 128 + 128 tokens, no prefix cache), its scrape
log kept gzipped here and unpacked into the folder's layout.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import yaml

from kvpressure.errors import InputError
from kvpressure.ingestion.collect_folder import expand, is_collect_folder, read_collect_folder
from kvpressure.investigation.analyse import analyse

DATA = Path(__file__).parent / "data" / "collect_run_0.32"


def _folder(tmp: Path, name: str = "run") -> Path:
    out = tmp / name
    shutil.copytree(DATA, out, ignore=shutil.ignore_patterns("*.gz"))
    with gzip.open(DATA / "metrics.prom.jsonl.gz", "rb") as src, \
            open(out / "metrics.prom.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def _record(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "record.yaml").read_text())


def test_the_folder_stands_for_its_bench_results_scrape_log_and_engine_args(tmp_path):
    run = _folder(tmp_path)
    assert is_collect_folder(run) and not is_collect_folder(run / "bench")
    folder = read_collect_folder(run)
    assert folder.sources == [run / "bench", run / "metrics.prom.jsonl"]
    engine = json.loads((run / "engine.json").read_text())
    assert folder.engine_args == engine["engine_args"]
    assert folder.engine_args_from["max_num_seqs"].startswith("--engine-args (recorded in ")
    assert folder.model_name == "kvp-tiny"
    # a copy of the server's log in the folder is one more part
    (run / "server.log").write_text("INFO 12-03 16:57:00 [api_server.py:1] vLLM API server\n")
    assert read_collect_folder(run).sources[-1] == run / "server.log"
    # other sources pass through, in their place
    assert expand(["a.jsonl", str(run)])[0][0] == "a.jsonl"


def test_a_report_on_the_folder_equals_its_own_report_on_the_parts(tmp_path):
    run = _folder(tmp_path)
    by_folder = analyse(tmp_path / "by_folder", source=[str(run)])
    # what collect's own report is given: the parts and the recorded engine arguments
    folder = read_collect_folder(run)
    by_parts = analyse(tmp_path / "by_parts", source=[str(p) for p in folder.sources],
                       engine_args=folder.engine_args, model_name=folder.model_name)
    a, b = _record(by_folder.parent), _record(by_parts.parent)
    for key in ("status", "perf", "counters", "scheduler", "recommendation"):
        assert a.get(key) == b.get(key), key
    # the curve is the folder's four levels, each as its bench result measured it
    curve = {p["concurrency"]: p["output_throughput"]
             for p in a["perf"]["throughput_by_concurrency"]}
    for c in (1, 2, 4, 8):
        bench = json.loads((run / "bench" / f"c{c}.json").read_text())
        assert curve[c] == pytest.approx(bench["output_throughput"])
    assert a["perf"]["knee"]["knee_x"] is not None
    assert a["status"] == "bound by KV blocks"
    # where each setting came from names the folder's engine.json, not an assumption
    came_from = a["provenance"]["engine_args_from"]
    assert "recorded in" in came_from["max_num_seqs"] and "engine.json" in came_from[
        "max_num_seqs"]
    assert a["scheduler"]["max_num_seqs"] == 32


def test_a_value_given_wins_over_the_recorded_one_and_says_so(tmp_path):
    run = _folder(tmp_path)
    path = analyse(tmp_path / "given", source=[str(run)], engine_args={"max_num_seqs": 16})
    record = _record(path.parent)
    assert record["scheduler"]["max_num_seqs"] == 16
    assert record["provenance"]["engine_args_from"]["max_num_seqs"] == "given (engine_args)"


def test_two_folders_of_different_servers_are_refused_naming_the_setting(tmp_path):
    one, two = _folder(tmp_path, "one"), _folder(tmp_path, "two")
    engine = json.loads((two / "engine.json").read_text())
    engine["engine_args"]["num_gpu_blocks"] = 48
    (two / "engine.json").write_text(json.dumps(engine))
    with pytest.raises(InputError, match=r"two: recorded num_gpu_blocks=48.*24"):
        analyse(tmp_path / "both", source=[str(one), str(two)])
    # the value given settles it, as the message says
    path = analyse(tmp_path / "given", source=[str(one), str(two)],
                   engine_args={"num_gpu_blocks": 24})
    assert _record(path.parent)["scheduler"]["num_gpu_blocks"] == 24


def test_a_broken_engine_json_names_the_file(tmp_path):
    run = _folder(tmp_path)
    (run / "engine.json").write_text("{not json")
    with pytest.raises(InputError, match=r"engine\.json: not readable"):
        read_collect_folder(run)
