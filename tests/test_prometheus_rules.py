"""prometheus-rules.yml beside every record: the recompute ratio's range and the past-the-knee
alert, checked by Prometheus's own promtool on series worked by hand."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from kvpressure.record.io import validate_record, write_record
from kvpressure.record.prometheus_rules import RULES_FILE, rules
from prometheus_server import in_ci
from report_helpers import valid_record


def _record(**perf):
    data = valid_record()
    data["scheduler"].update(num_gpu_blocks=12001, block_size=16)
    data["perf"]["knee"].update(perf)
    return validate_record(data)


def test_the_rules_follow_the_record():
    got = {r.get("record") or r.get("alert"): r for r in rules(_record(knee_x=16))["groups"][0]
           ["rules"]}
    assert "1.92e+05" not in str(got) and "192000" in got["kvpressure:victim_context_tokens"]["expr"]
    assert got["VLLMPastTheKnee"]["expr"].startswith(
        "(vllm:num_requests_running + vllm:num_requests_waiting) >= 16 and ")
    # no knee in the range: the alert is on queueing while preempting
    alert = {r.get("alert"): r for r in rules(_record(knee_x=None))["groups"][0]["rules"]}
    assert alert["VLLMPastTheKnee"]["expr"].startswith("vllm:num_requests_waiting > 0 and ")


def test_write_record_puts_the_rules_beside_it(tmp_path):
    path = write_record(_record(knee_x=16), tmp_path / "record.yaml")
    assert yaml.safe_load((path.parent / RULES_FILE).read_text()) == rules(_record(knee_x=16))


# One server, sampled each minute: 6 preemptions, 5,400 prompt and 600 generated tokens a minute
# (0.1 preemptions and 100 tokens a second), KV usage 0.9, 8 running and 10 waiting.
# Low end: 0.1 * 7.5 / (100 + 0.75); the context: 0.9 * 12000 * 16 / 8 - 8 = 21592 tokens;
# high end: 0.1 * 21592 / (100 + 2159.2).
PROMTOOL_TEST = """
rule_files: [prometheus-rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'vllm:num_preemptions_total{model_name="m"}', values: '0+6x20'}
      - {series: 'vllm:prompt_tokens_total{model_name="m"}', values: '0+5400x20'}
      - {series: 'vllm:generation_tokens_total{model_name="m"}', values: '0+600x20'}
      - {series: 'vllm:kv_cache_usage_perc{model_name="m"}', values: '0.9x20'}
      - {series: 'vllm:num_requests_running{model_name="m"}', values: '8x20'}
      - {series: 'vllm:num_requests_waiting{model_name="m"}', values: '10x20'}
    promql_expr_test:
      - expr: 'kvpressure:recompute_ratio_low:5m'
        eval_time: 10m
        exp_samples: [{labels: '{__name__="kvpressure:recompute_ratio_low:5m", model_name="m"}',
                       value: 0.007444168734491315}]
      - expr: 'kvpressure:recompute_ratio_high:5m'
        eval_time: 10m
        exp_samples: [{labels: '{__name__="kvpressure:recompute_ratio_high:5m", model_name="m"}',
                       value: 0.9557365439093485}]
    alert_rule_test:
      - eval_time: 3m
        alertname: VLLMPastTheKnee
        exp_alerts: []
      - eval_time: 10m
        alertname: VLLMPastTheKnee
        exp_alerts:
          - exp_labels: {severity: warning, model_name: m}
            exp_annotations:
              summary: vLLM preempts with 18 clients at or past the knee (16 clients, where
                throughput stopped growing in the investigation)
              description: 'Status of the investigation: bound by KV blocks. Each preemption
                recomputes its context: see kvpressure:recompute_ratio_low/high and the record
                (llama-3.1-70b).'
"""


def test_promtool_checks_the_rules_and_their_values(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool not found (Debian's prometheus package); CI must have it")
        pytest.skip("promtool not found (apt-get install -y prometheus)")
    data = valid_record()
    data["scheduler"].update(num_gpu_blocks=12001, block_size=16)
    data["perf"]["knee"]["knee_x"] = 16
    write_record(validate_record(data), tmp_path / "record.yaml")
    check = subprocess.run([promtool, "check", "rules", RULES_FILE], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    (tmp_path / "test.yml").write_text(PROMTOOL_TEST)
    test = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr
