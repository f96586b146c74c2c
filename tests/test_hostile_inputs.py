"""Every bad input of issue 11, as a user would give it: exit 2 with one line naming the file,
field or option; never a traceback, never a run on a typo or a wrong number."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from kvpressure.cli import main
from kvpressure.paths import REPO_ROOT, data_dir

TESTS = Path(__file__).parent
LIGHT = TESTS / "data" / "vllm-0.33-scheduler" / "light_open_prefix_groups.scenario.json"
CI_SMALL = data_dir() / "experiments" / "ci_small.yaml"


def refused(capsys: pytest.CaptureFixture, argv: list, *words: str) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    # one line says what is wrong (progress lines printed before it are not errors)
    lines = [x for x in err.strip().splitlines() if "error" in x]
    assert len(lines) == 1 and err.strip().endswith(lines[0]), err
    for word in words:
        assert word in err, (word, err)
    return err


def scenario(tmp_path: Path, **changes) -> Path:
    data = {
        "name": "tiny",
        "settings": {"num_gpu_blocks": 64, "block_size": 16, "max_num_seqs": 4},
        "prefix_groups": {"sys": {"length": 32}},
        "requests": [{"id": "a", "prompt_len": 40, "output_len": 4},
                     {"id": "b", "prompt_len": 50, "output_len": 4, "arrival_step": 1}],
    }
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / "tiny.scenario.json"
    path.write_text(json.dumps(data))
    return path


def experiment(tmp_path: Path, text: str | None = None, **sections) -> Path:
    """ci_small with some fields replaced (``engine={"x": 1}`` merges into the section)."""
    data = yaml.safe_load(CI_SMALL.read_text())
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "exp.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- typos
def test_a_misspelt_mode_is_refused_not_run_as_an_open_loop(tmp_path, capsys):
    path = scenario(tmp_path, mdoe={"type": "closed", "concurrency": 2})
    refused(capsys, ["simulate", path, "--out", tmp_path / "o"], "'mdoe'", "'mode'")
    assert not (tmp_path / "o").exists()


def test_other_top_level_keys_stay_notes(tmp_path, capsys):
    path = scenario(tmp_path, owner="team a")
    assert main(["simulate", str(path), "--out", str(tmp_path / "o"), "--no-metrics"]) == 0


@pytest.mark.parametrize("changes, words", [
    ({"settings": {"num_gpu_blocks": 64, "max_num_seq": 4}}, ["max_num_seq", "'max_num_seqs'"]),
    ({"requests": [{"id": "a", "promt_len": 4, "output_len": 1}]}, ["'a'", "'prompt_len'"]),
    ({"mode": {"type": "closed", "concurency": 2}}, ["mode", "'concurrency'"]),
])
def test_misspelt_scenario_keys_name_the_nearest_field(tmp_path, capsys, changes, words):
    refused(capsys, ["simulate", scenario(tmp_path, **changes), "--out", tmp_path / "o"], *words)


def test_misspelt_engine_argument_is_refused_with_the_nearest_name(tmp_path, capsys):
    path = experiment(tmp_path, engine={"max_num_seq": 20})
    refused(capsys, ["sweep", path, "--out", tmp_path / "o"], "engine.max_num_seq",
            "'max_num_seqs'")


def test_misspelt_metrics_filter_is_refused(tmp_path, capsys):
    src = TESTS / "data" / "bench" / "vllm033_c32.json"
    refused(capsys, ["ingest", src, "--out", tmp_path / "o", "--metrics",
                     "core,vllm:num_preemtions"], "--metrics", "'vllm:num_preemptions'")


# --------------------------------------------------------------------------- numbers
def test_concurrency_zero_is_refused_not_replaced_by_the_focus(tmp_path, capsys):
    refused(capsys, ["simulate", CI_SMALL, "--out", tmp_path / "o", "--concurrency", "0"],
            "concurrency")


@pytest.mark.parametrize("level", ["nan", "inf", "0", "2.5"])
def test_sweep_levels_must_be_whole_positive_numbers(tmp_path, capsys, level):
    refused(capsys, ["sweep", CI_SMALL, "--out", tmp_path / "o", "--concurrency", "8", level],
            "--concurrency")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_cost_coefficients_must_be_finite(tmp_path, capsys, value):
    text = CI_SMALL.read_text() + f"cost_model: {{t0: {value}}}\n"
    refused(capsys, ["sweep", experiment(tmp_path, text=text), "--out", tmp_path / "o"],
            "cost_model")


@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_hardware_numbers_must_be_finite(tmp_path, capsys, value):
    hw = tmp_path / "hw.yaml"
    hw.write_text(re.sub(r"(?m)^memory_gib: .*$", f"memory_gib: {value}",
                         (data_dir() / "hardware" / "l40s.yaml").read_text()))
    refused(capsys, ["capacity", "--hardware", hw, "--model", "llama-3.1-8b"], "memory_gib",
            str(hw))


@pytest.mark.parametrize("section, words", [
    ({"workload": {"seed": -1}}, ["seed"]),
    ({"workload": {"num_requests": 10**12}}, ["num_requests", "GiB"]),
    ({"scrape_interval_s": 1e-4}, ["scrape_interval_s"]),
    ({"engine": {"num_gpu_blocks": 10**12}}, ["num_gpu_blocks", "GiB"]),
])
def test_numbers_that_would_crash_or_exhaust_memory_are_refused(tmp_path, capsys, section,
                                                                 words):
    key, value = next(iter(section.items()))
    refused(capsys, ["sweep", experiment(tmp_path, **{key: value}), "--out", tmp_path / "o"],
            *words)


def test_a_rate_that_spreads_requests_over_ages_is_refused(tmp_path, capsys):
    data = yaml.safe_load(CI_SMALL.read_text())
    data["workload"].pop("concurrency")
    data["workload"]["request_rates"] = [1e-300]
    data["focus"] = {}
    path = experiment(tmp_path, text=yaml.safe_dump(data))
    refused(capsys, ["simulate", path, "--out", tmp_path / "o"], "scrape_interval_s")


def test_scenario_numbers_out_of_range(tmp_path, capsys):
    refused(capsys, ["simulate", scenario(tmp_path, seed=-1), "--out", tmp_path / "o"], "seed")
    big = [{"id": "a", "prompt_len": 4, "output_len": 1, "arrival_step": 2**64}]
    refused(capsys, ["simulate", scenario(tmp_path, requests=big), "--out", tmp_path / "o"],
            "'a'", "arrival_step")
    settings = {"num_gpu_blocks": 10**12}
    refused(capsys, ["simulate", scenario(tmp_path, settings=settings), "--out", tmp_path / "o"],
            "num_gpu_blocks", "GiB")


# --------------------------------------------------------------------------- vLLM's refusals
def test_long_prefill_threshold_above_max_model_len_is_refused_as_vllm_does(tmp_path, capsys):
    settings = {"num_gpu_blocks": 64, "max_model_len": 1024, "long_prefill_token_threshold": 2048}
    refused(capsys, ["simulate", scenario(tmp_path, settings=settings), "--out", tmp_path / "o"],
            "long_prefill_token_threshold", "max_model_len")


def test_prefix_len_beyond_its_group_names_request_and_group(tmp_path, capsys):
    reqs = [{"id": "r7", "prompt_len": 60, "output_len": 2, "prefix_group": "sys",
             "prefix_len": 48}]
    refused(capsys, ["simulate", scenario(tmp_path, requests=reqs), "--out", tmp_path / "o"],
            "'r7'", "'sys'", "32")


# --------------------------------------------------------------------------- files
BINARY = bytes(range(256)) * 8
LATIN1 = "name: caf\xe9\n".encode("latin-1")


@pytest.mark.parametrize("content, word", [(BINARY, "binary"), (LATIN1, "UTF-8")])
def test_unreadable_files_are_refused_naming_them(tmp_path, capsys, content, word):
    for name, argv in [
        ("s.json", lambda p: ["simulate", p, "--out", tmp_path / "o"]),
        ("e.yaml", lambda p: ["simulate", p, "--out", tmp_path / "o"]),
        ("w.yaml", lambda p: ["sweep", p, "--out", tmp_path / "o"]),
        ("r.yaml", lambda p: ["report", "--experiment", p, "--out", tmp_path / "o"]),
        ("h.yaml", lambda p: ["capacity", "--hardware", p, "--model", "llama-3.1-8b"]),
    ]:
        path = tmp_path / name
        path.write_bytes(content)
        refused(capsys, argv(path), str(path), word)


@pytest.mark.parametrize("argv", [
    ["simulate", LIGHT, "--no-metrics"],
    ["sweep", CI_SMALL],
    ["ingest", TESTS / "data" / "bench" / "vllm033_c32.json"],
    ["report", "--experiment", CI_SMALL],
])
def test_out_naming_a_file_is_refused_also_with_force(tmp_path, capsys, argv):
    target = tmp_path / "file.txt"
    target.write_text("mine")
    refused(capsys, [*argv, "--out", target, "--force"], "not a folder")
    assert target.read_text() == "mine"


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1/metrics"])
def test_malformed_url_is_refused(tmp_path, capsys, url):
    refused(capsys, ["ingest", url, "--start", "0", "--end", "10", "--out", tmp_path / "o"],
            url)


def test_unreachable_prometheus_is_an_error_not_an_empty_ingest(tmp_path, capsys):
    refused(capsys, ["ingest", "http://127.0.0.1:9", "--start", "0", "--end", "100",
                     "--timeout", "0.5", "--out", tmp_path / "o"], "no answer")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- folders
def test_report_force_never_touches_a_folder_the_kit_did_not_make(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "notebooks").mkdir(parents=True)
    (out / "notebooks" / "analysis.ipynb").write_text("{}")
    (out / "runs.csv").write_text("my,own\n1,2\n")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    refused(capsys, ["report", "--experiment", CI_SMALL, "--out", out, "--force"],
            "did not write")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "runs.csv").read_text() == "my,own\n1,2\n"


@pytest.mark.parametrize("target", [REPO_ROOT, REPO_ROOT / "notebooks", REPO_ROOT.parent])
def test_the_checkout_and_its_notebooks_are_never_an_output(capsys, target):
    refused(capsys, ["report", "--experiment", CI_SMALL, "--out", target, "--force"], "kit")


# --------------------------------------------------------------------------- one error path
def test_interrupt_exits_130_with_one_line(monkeypatch, capsys):
    import kvpressure.commands.profiles as profiles

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(profiles, "run", interrupted)
    assert main(["profiles"]) == 130
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err


def test_a_bug_exits_1_with_the_traceback_in_a_log_not_on_screen(monkeypatch, capsys, tmp_path):
    import kvpressure.commands.profiles as profiles

    def broken(args):
        return {}["missing"]

    monkeypatch.setattr(profiles, "run", broken)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert main(["profiles"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "please report" in err
    logs = list((tmp_path / "kvpressure").glob("kvpressure-crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err
    text = logs[0].read_text()
    assert "Traceback" in text and "KeyError: 'missing'" in text


def test_out_of_memory_is_a_refusal(monkeypatch, capsys):
    import kvpressure.commands.profiles as profiles

    def hungry(args):
        raise MemoryError

    monkeypatch.setattr(profiles, "run", hungry)
    assert main(["profiles"]) == 2
    assert "memory" in capsys.readouterr().err


def test_no_nan_reaches_a_run(tmp_path):
    """A hand-checked guard: the tiny scenario runs, and its numbers are finite."""
    out = tmp_path / "o"
    assert main(["simulate", str(scenario(tmp_path)), "--out", str(out), "--no-metrics"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 2
    assert all(math.isfinite(v) for v in summary.values() if isinstance(v, float))
    assert os.path.exists(out / ".kvpressure.json")
