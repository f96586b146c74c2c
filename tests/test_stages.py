"""The stages' result types and their files (``kvpressure.stages``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvpressure.errors import InputError
from kvpressure.stages.files import as_result, read_stage, stage_text, write_stage
from kvpressure.stages.results import CollectInfo, InterferenceResult, RecomputeResult


def _collect(**extra) -> dict:
    """Stage 01 of a simulation as its producer builds it (no ingestion-only keys)."""
    length = {"description": "uniform", "mean": 2.5, "p50": 2.0, "p95": 4.0, "max": 4.0,
              "source": "requests.csv (exact)"}
    return {
        "mode": "simulation", "name": "case", "description": "d",
        "inputs": [{"path": "data/experiments/case.yaml", "sha256": "ab"}],
        "seed": 7, "seeds": [7, 8], "model_name": "m", "baseline_variant": "baseline",
        "variants": ["baseline"], "variant_settings": {"baseline": {"max_num_seqs": 8}},
        "comparison_parameter": None, "comparison_variants": [], "concurrency_levels": [4, 8],
        "settings": {"max_num_seqs": 8}, "num_requests": 10,
        "input_len_distribution": length, "output_len_distribution": dict(length),
        "focus": {"variant": "baseline", "concurrency": 8, "run": "baseline/c8",
                  "why": "given as a parameter", "t0": 5.0, "t1": 125, "point_dir": "p"},
        **extra,
    }


def test_file_holds_the_producers_keys_and_reads_back_byte_for_byte(tmp_path):
    info = as_result(CollectInfo, _collect())
    path = write_stage(tmp_path, info)
    data = json.loads(path.read_text())
    # Nothing the simulation did not set reaches its file ...
    assert set(data) == set(_collect())
    assert "gauge_t0" not in data["focus"]
    # ... yet the type answers for it: a simulation has engine metrics and no load notes.
    back = read_stage(tmp_path, CollectInfo)
    assert back.engine_metrics and back.load.notes == [] and back.load.idle is None
    assert back.focus.gauge_window == (5.0, 125) and back.simulated
    assert stage_text(back) == path.read_text()
    # Sorted keys, two-space indent, one trailing newline: the bytes are fixed by the values.
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_ingested_collection_is_the_same_type_with_its_own_answers(tmp_path):
    focus = {**_collect()["focus"], "gauge_t0": None, "gauge_t1": None, "point_dir": None,
             "counter_origin": "zero"}
    info = as_result(CollectInfo, _collect(
        mode="ingested", seed=None, seeds=None, focus=focus, engine_metrics=False,
        bench_results=True, scrapes=False, matched="bench results only",
        bench_timezone="local", incomplete_levels=[], load={"idle": None, "snapshot": False,
                                                              "notes": ["n"]}))
    write_stage(tmp_path, info)
    back = read_stage(tmp_path, CollectInfo)
    assert not back.engine_metrics and back.load.notes == ["n"] and not back.simulated
    # Gauge bounds given as null stay null: they are not the counters' window.
    assert back.focus.gauge_window == (None, None) and back.focus.counter_origin == "zero"


def test_counts_stay_integers_and_non_finite_values_become_null(tmp_path):
    window = {"run": "r", "concurrency": 8, "t0": 0, "t1": 1.5}
    keys = ("running_mean", "running_max", "waiting_mean", "waiting_capacity_mean",
            "waiting_deferred_mean", "frac_waiting", "frac_silent", "kv_usage_mean",
            "recomputed_tokens", "recomputed_tokens_low", "recomputed_tokens_high",
            "recompute_ratio", "recompute_ratio_low", "recompute_ratio_high",
            "recompute_time_share")
    values = {"window": window, "max_num_seqs": np.int64(256), "available": True,
              "exact": True, "preemptions": 3, "waiting": {"samples": np.int64(25)},
              "recompute": {"ratio": float("nan")}, **dict.fromkeys(keys, 0.5)}
    values["kv_usage_mean"] = float("inf")
    path = write_stage(tmp_path, as_result(RecomputeResult, values))
    text = path.read_text()
    assert '"preemptions": 3,' in text and '"t0": 0,' in text and '"samples": 25' in text
    assert '"max_num_seqs": 256,' in text
    data = json.loads(text)
    assert data["kv_usage_mean"] is None and data["recompute"]["ratio"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in data.values())


def test_missing_file_names_the_notebook_that_writes_it(tmp_path):
    with pytest.raises(InputError, match=r"interference\.json: missing; run "
                                         r"notebooks/05_interference\.ipynb"):
        read_stage(tmp_path, InterferenceResult)


@pytest.mark.parametrize(("change", "field"), [
    ({"focus": {"variant": "b", "concurrency": 8, "run": "r", "why": "w", "t0": "soon",
                "t1": 1}}, "focus.t0"),
    ({"engine_metric": True}, "engine_metric"),  # a misspelt key is refused, not ignored
    ({"mode": "replayed"}, "mode"),
])
def test_a_bad_file_is_refused_naming_file_and_field(tmp_path, change, field):
    (tmp_path / "analysis").mkdir()
    path = tmp_path / "analysis" / "collect.json"
    path.write_text(json.dumps({**_collect(), **change}))
    with pytest.raises(InputError, match=rf"collect\.json: not a collect result \(field "
                                         rf"'{field}'"):
        read_stage(tmp_path, CollectInfo)
    path.write_text("{\n  \"mode\": ")
    with pytest.raises(InputError, match=r"collect\.json, line 2: not valid JSON"):
        read_stage(tmp_path, CollectInfo)
