"""The objects at ``ingest()``'s border: source kinds, options, engine facts, the report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.ingest_report import IngestReport
from kvpressure.ingestion.source_kind import IN_FOLDER, READABLE, SCRAPED, SourceKind
from kvpressure.ingestion.sources import detect
from kvpressure.jsonable import to_jsonable

DATA = Path(__file__).parent / "data"
HEAVY = DATA / "prom" / "heavy_closed_c64_fcfs.metrics.prom.jsonl.gz"
COLLECTED = DATA / "collect_run_0.32"


def test_the_kinds_a_folder_gives_are_members_written_as_their_words(tmp_path: Path) -> None:
    found = detect(COLLECTED / "bench") + detect(COLLECTED / "metrics.prom.jsonl.gz")
    assert {s.kind for s in found} == {SourceKind.BENCH, SourceKind.PROM_JSONL}
    assert all(isinstance(s.kind, SourceKind) and s.kind in READABLE for s in found)
    assert SourceKind.PROM_DIR not in IN_FOLDER and SourceKind.BENCH not in SCRAPED
    res = ingest([COLLECTED / "bench", COLLECTED / "metrics.prom.jsonl.gz"], run="load")
    res.write(tmp_path)
    on_disk = json.loads((tmp_path / "ingest.json").read_text(encoding="utf-8"))
    assert [s["kind"] for s in on_disk["sources"]][-1] == "prom_jsonl"
    assert on_disk == res.report.to_dict()
    # The kinds stay words in YAML too (yaml.safe_dump refuses an enum).
    assert yaml.safe_load(yaml.safe_dump(to_jsonable(res.report))) == on_disk


def test_the_report_keeps_the_keys_of_ingest_json_in_their_order(tmp_path: Path) -> None:
    assert main(["ingest", str(HEAVY), "--out", str(tmp_path / "out"), "--metrics", "core",
                 "--policy", "fcfs"]) == 0
    written = json.loads((tmp_path / "out" / "ingest.json").read_text(encoding="utf-8"))
    assert list(written) == [f.name for f in dataclasses.fields(IngestReport)]
    assert written["options"]["metrics"] == "core" and written["options"]["policy"] == "fcfs"
    assert written["tables"]["series_rows"] > 0


def test_engine_facts_read_an_engine_args_mapping_under_vllms_names() -> None:
    facts = EngineFacts.from_settings({"num_gpu_blocks": 900, "block_size": 32,
                                       "enable_prefix_caching": False, "policy": "priority",
                                       "max_num_seqs": 64})
    assert facts == EngineFacts(num_gpu_blocks=900, block_size=32, enable_prefix_caching=False,
                                scheduling_policy="priority")
    # vLLM's own name wins over the simulation's short one.
    both = EngineFacts.from_settings({"scheduling_policy": "fcfs", "policy": "priority"})
    assert both.scheduling_policy == "fcfs"
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.block_size = 16  # type: ignore[misc]


def test_engine_facts_reach_the_recompute_estimate_and_options_the_report() -> None:
    told = ingest([HEAVY], run="h", options=IngestOptions(counter_origin="first"),
                  engine=EngineFacts(num_gpu_blocks=123, block_size=32))
    params = told.report.runs["h"]["recompute_estimate"]["params"]
    assert (params["num_gpu_blocks"], params["num_gpu_blocks_from"]) == (123, "given")
    assert (params["block_size"], params["block_size_from"]) == (32, "given")
    assert told.report.runs["h"]["counter_origin"] == {"origin": "first", "why": "given"}
    assert told.report.options["counter_origin"] == "first"
