"""The recommendation: remedies ranked by effect under latency limits, worked by hand."""

from __future__ import annotations

from kvpressure.analysis.recommendation import recommend, recommend_from_symptoms

BASELINE = {"ttft_p95_s": 40.0, "itl_p95_s": 0.100}
SETTINGS = {"max_num_seqs": 256, "max_model_len": 16384, "gpu_memory_utilization": 0.9,
            "max_num_batched_tokens": 2048}


def _outcome(remedy, overrides, gain, ttft, itl, applicable=True):
    return {"remedy": remedy, "overrides": overrides, "applicable": applicable,
            "gain": {"throughput_at_target_pct": gain},
            "cost": {"ttft_p95_change_pct": ttft, "itl_p95_change_pct": itl}}


REPORT = {"target_concurrency": 32.0, "baseline": BASELINE, "outcomes": [
    _outcome("lower_max_num_seqs", {"max_num_seqs": 17}, 21.0, -16.0, -10.0),
    _outcome("lower_max_model_len", {"max_model_len": 12842}, 0.4, 0.0, 0.0),
    _outcome("raise_gpu_memory_utilization", {"gpu_memory_utilization": 0.95}, 6.0, -7.0, 1.0),
    # The largest gain, but ITL p95 +25%: over the default limit (+10%).
    _outcome("lower_max_num_batched_tokens", {"max_num_batched_tokens": 1024}, 37.0, 5.0, 25.0),
    _outcome("watermark", {}, 0.0, 0.0, 0.0, applicable=False),
]}


def test_ranked_by_gain_within_the_limits():
    rec = recommend(REPORT, SETTINGS, {"lower_max_num_seqs": [18.0, 24.0, 21.0]})
    assert rec["remedy"] == "lower_max_num_seqs"
    assert [r["remedy"] for r in rec["ranked"]] == ["lower_max_num_seqs",
                                                    "raise_gpu_memory_utilization"]
    assert rec["runner_up"]["remedy"] == "raise_gpu_memory_utilization"
    assert [r["remedy"] for r in rec["no_effect"]] == ["lower_max_model_len"]
    assert [r["remedy"] for r in rec["over_limits"]] == ["lower_max_num_batched_tokens"]
    assert rec["over_limits"][0]["breaks"] == ["ITL p95 +25%"]
    assert rec["text"].startswith("Do this: set max_num_seqs to 17 (now 256): +21% output "
                                  "throughput at concurrency 32 (+18% to +24% over 3 seeds)")
    assert "TTFT p95 -16% / ITL p95 -10%" in rec["text"]


def test_absolute_limits_replace_the_tolerance():
    # ITL p95 limit 130 ms: batched tokens' 125 ms is within; TTFT limit 40 s: +5% (42 s) is not.
    rec = recommend(REPORT, SETTINGS, limits={"itl_p95_s": 0.130})
    assert rec["remedy"] == "lower_max_num_batched_tokens"
    assert "at a cost of TTFT p95 +5% / ITL p95 +25%" in rec["text"]
    rec = recommend(REPORT, SETTINGS, limits={"itl_p95_s": 0.130, "ttft_p95_s": 41.0})
    assert rec["remedy"] == "lower_max_num_seqs"
    assert rec["over_limits"][0]["breaks"] == ["TTFT p95 42 s > 41 s"]


def test_nothing_gains_nothing_recommended():
    report = {**REPORT, "outcomes": [REPORT["outcomes"][1]]}
    rec = recommend(report, SETTINGS)
    assert rec["remedy"] is None and rec["text"].startswith("No change recommended")


def _symptoms(status, **present):
    rows = [{"id": k, "verdict": "present", "evidence": ev} for k, ev in present.items()]
    return {"status": {"status": status, "prefill_interference": False},
            "symptoms": {"symptoms": rows}}


def test_ingested_without_twin_says_what_to_try_first_from_the_symptoms():
    result = _symptoms("bound by KV blocks", running_below_max_num_seqs={
        "mean_running": 46.4, "frac_silent": 1.0, "max_running": 53})
    rec = recommend_from_symptoms(result, SETTINGS, "ingested data cannot be re-run")
    assert rec["parameter"] == "max_num_seqs" and rec["value"] == 46
    assert "waited for KV space 100% of the time while 46 of 256 allowed sequences ran" \
        in rec["text"]
    rec = recommend_from_symptoms(_symptoms("bound by KV blocks"), SETTINGS, "x")
    assert rec["parameter"] == "gpu_memory_utilization"
    rec = recommend_from_symptoms(_symptoms("bound by single-sequence length"), SETTINGS, "x")
    assert rec["parameter"] == "max_model_len"
    rec = recommend_from_symptoms(_symptoms("not established"), SETTINGS, "x")
    assert rec["remedy"] is None


def test_ingested_data_with_a_twin_folder_uses_the_twins_what_if(tmp_path):
    import json

    from kvpressure.investigation.verdict import _twin_recommendation

    assert _twin_recommendation(tmp_path) is None
    (tmp_path / "twin").mkdir()
    doc = {"remedies": {"recommendation": {
        "setting": "max_num_seqs=48", "overrides": {"max_num_seqs": 48}, "trusted": True,
        "text": "max_num_seqs=48: output throughput at concurrency 64 +31.0%"}}}
    (tmp_path / "twin" / "twin.json").write_text(json.dumps(doc))
    rec = _twin_recommendation(tmp_path)
    assert rec["source"] == "twin" and rec["text"] == (
        "Do this (the fitted twin's what-if): max_num_seqs=48: output throughput at "
        "concurrency 64 +31.0%.")
    doc["remedies"]["recommendation"]["trusted"] = False
    (tmp_path / "twin" / "twin.json").write_text(json.dumps(doc))
    assert _twin_recommendation(tmp_path)["text"].startswith("Twin's what-if, not trusted: ")
