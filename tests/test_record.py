"""The record's schema: complete records round-trip, incomplete ones are refused by field."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from kvpressure.analysis.status import STATUSES
from kvpressure.errors import InputError
from kvpressure.record.io import load_record, validate_record, write_record
from kvpressure.record.schema import Record
from report_helpers import valid_record


def test_schema_status_values_are_the_analysis_statuses():
    allowed = set(Record.model_fields["status"].annotation.__args__)
    assert allowed == set(STATUSES)


def test_valid_record_round_trips_through_yaml(tmp_path):
    data = valid_record()
    path = write_record(data, tmp_path / "record.yaml")
    text = path.read_text()
    loaded = load_record(path)
    assert loaded.model_dump(mode="json") == validate_record(data).model_dump(mode="json")
    # Written twice, byte-identical: no timestamps or dict-order drift.
    assert write_record(loaded, tmp_path / "again.yaml").read_text() == text
    # The seed's section order is kept.
    top = [line.split(":")[0] for line in text.splitlines() if line[:1].isalpha()]
    assert top[:5] == ["scheduler", "counters", "workload", "perf", "status"]
    assert yaml.safe_load(text)["scheduler"]["preemption_mode"] == "recompute"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("scheduler", "policy"), None, "scheduler.policy"),
        (("scheduler", "policy"), "  ", "scheduler.policy"),
        (("counters", "recompute_ratio"), 1.4, "counters.recompute_ratio"),
        (("workload", "model_name"), "", "workload.model_name"),
        (("perf", "throughput_by_concurrency"), [], "perf.throughput_by_concurrency"),
        (("scheduler", "preemption_mode"), "swap", "scheduler.preemption_mode"),
        (("status",), "probably KV", "status"),
        (("provenance", "inputs", 0, "sha256"), "abc", "provenance.inputs[0].sha256"),
        (("counters", "kv_cache_usage_perc"), float("nan"), "counters.kv_cache_usage_perc"),
        (("evidence", "comparison", "noise"), "", "evidence.comparison.noise"),
        (("perf", "knee", "sustained_to"), None, "perf.knee.sustained_to"),
        (("provenance", "seeds"), [], "provenance.seeds"),
    ],
)
def test_empty_or_invalid_field_is_refused_naming_it(tmp_path, path, value, field):
    data = valid_record()
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    out = tmp_path / "record.yaml"
    out.write_text("previous\n")
    with pytest.raises(InputError, match=rf"field {re.escape(field)}:"):
        write_record(data, out)
    assert out.read_text() == "previous\n"  # nothing written over the earlier record


def test_unknown_field_is_refused():
    data = valid_record()
    data["scheduler"]["max_num_seq"] = 32
    with pytest.raises(InputError, match="field scheduler.max_num_seq"):
        validate_record(data)


def test_ratio_outside_its_range_is_refused():
    data = valid_record()
    data["counters"]["recompute_ratio_range"] = [0.1, 0.2]
    with pytest.raises(InputError, match="recompute_ratio 0.64 lies outside"):
        validate_record(data)


def test_simulation_needs_seed_and_comparison_ingested_does_not():
    data = valid_record()
    data["provenance"]["seed"] = None
    with pytest.raises(InputError, match="seed and seeds are required"):
        validate_record(data)
    data = valid_record()
    data["provenance"]["seeds"] = None
    with pytest.raises(InputError, match="seed and seeds are required"):
        validate_record(data)
    data = valid_record()
    data["provenance"]["seeds"] = [8, 7]
    with pytest.raises(InputError, match="seeds must start with seed 7"):
        validate_record(data)
    sim = valid_record()
    sim["evidence"]["comparison"] = None
    with pytest.raises(InputError, match="evidence.comparison is required"):
        validate_record(sim)
    ingested = copy.deepcopy(sim)
    ingested["provenance"].update(mode="ingested", seed=None, seeds=None)
    assert validate_record(ingested).evidence.comparison is None


def test_throughput_curve_must_be_ordered():
    data = valid_record()
    data["perf"]["throughput_by_concurrency"].reverse()
    with pytest.raises(InputError, match="increasing and unique"):
        validate_record(data)


def test_load_record_names_yaml_line(tmp_path):
    bad = tmp_path / "record.yaml"
    bad.write_text("scheduler:\n  policy: [unclosed\n")
    with pytest.raises(InputError, match=r"record.yaml line \d+"):
        load_record(bad)


def test_check_without_data_is_null_and_explained_by_its_own_path(tmp_path):
    data = valid_record()
    checks = data["evidence"]["checks"]
    checks.append({"name": "preemptions with recompute", "holds": None,
                   "observed": "no data", "metric": "vllm:num_preemptions_total"})
    # A null verdict without a reason is refused: a reader would take it for "absent".
    with pytest.raises(InputError, match=r"evidence\.checks\[1\]\.holds: null without a reason"):
        validate_record(data)
    data["missing"] = {"evidence.checks[1].holds": "no data (needs vllm:num_preemptions_total)"}
    loaded = load_record(write_record(data, tmp_path / "record.yaml"))
    assert [c.holds for c in loaded.evidence.checks] == [True, None]
    assert yaml.safe_load((tmp_path / "record.yaml").read_text())["evidence"]["checks"][1][
        "holds"] is None
    # A reason for a check that was judged is stale.
    data["evidence"]["checks"][1]["holds"] = False
    with pytest.raises(InputError, match=r"missing names evidence\.checks\[1\]\.holds"):
        validate_record(data)
