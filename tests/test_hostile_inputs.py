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


# --------------------------------------------------------------------------- issue 31
L40S = data_dir() / "hardware" / "l40s.yaml"
LLAMA_8B = data_dir() / "models" / "llama-3.1-8b.yaml"
CAPACITY = ["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b"]


def test_force_never_removes_an_empty_folder_the_user_made(tmp_path, capsys):
    out, path = tmp_path / "out", scenario(tmp_path)
    assert main(["simulate", str(path), "--out", str(out), "--no-metrics"]) == 0
    (out / "keepme").mkdir()
    refused(capsys, ["simulate", path, "--out", out, "--no-metrics", "--force"], "'keepme/'",
            "did not write")
    assert (out / "keepme").is_dir()


def test_force_still_replaces_the_kits_own_folders(tmp_path):
    """A sweep's point folders are listed in its marker: a rerun with --force replaces them."""
    out = tmp_path / "out"
    argv = ["sweep", str(CI_SMALL), "--out", str(out), "--concurrency", "4", "--no-compare",
            "--jobs", "1"]
    assert main(argv) == 0
    marker = json.loads((out / ".kvpressure.json").read_text())
    assert "points" in marker["folders"]
    assert main([*argv, "--force"]) == 0


def test_a_single_dump_counts_its_counters_since_the_server_started(tmp_path):
    import pandas as pd

    dump = TESTS / "data" / "real" / "vllm_0.32_cpu_loaded.prom"
    text = dump.read_text()

    def total(metric: str) -> float:  # the dump's own numbers, summed over its label sets
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(metric + "{"))

    assert main(["ingest", str(dump), "--out", str(tmp_path / "o")]) == 0
    row = pd.read_csv(tmp_path / "o" / "runs.csv").iloc[0]
    assert total("vllm:num_preemptions_total") == 20
    assert row["preemptions"] == 20
    assert row["num_requests"] == total("vllm:request_success_total") == 7


@pytest.mark.parametrize("value", ["14.96", "16", "0.5"])
def test_a_bare_size_that_cannot_be_bytes_is_refused_naming_the_unit(capsys, value):
    refused(capsys, [*CAPACITY, "--weights", value], "--weights", f"{value}GiB")


def test_sizes_take_their_units(capsys):
    assert main([*CAPACITY, "--weights", "14.96GiB", "--json"]) == 0
    gib = json.loads(capsys.readouterr().out)["weights_bytes"]
    assert main([*CAPACITY, "--weights", "14.96GB", "--json"]) == 0
    gb = json.loads(capsys.readouterr().out)["weights_bytes"]
    assert main([*CAPACITY, "--weights", str(round(14.96 * 2**30)), "--json"]) == 0
    assert (gib, gb) == (round(14.96 * 2**30), round(14.96e9))
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == gib


@pytest.mark.parametrize("argv, words", [
    (["--block-size", "7"], ["--block-size", "7", "16"]),
    (["--total-memory", "1e30"], ["--total-memory", "TiB"]),
    (["--kv-cache-memory-bytes", "1e400"], ["--kv-cache-memory-bytes", "finite"]),
    (["--weights", "900GiB"], ["--weights", "more than the card"]),
])
def test_capacity_sizes_and_block_sizes_vllm_would_not_take(capsys, argv, words):
    refused(capsys, [*CAPACITY, *argv], *words)


@pytest.mark.parametrize("argv", [
    ["capacity", "--hardware", "l4", "--model", "llama-3.1-70b"],  # the weights do not load
    [*CAPACITY, "--max-model-len", "10000000"],  # no pool holds one request
])
def test_capacity_exits_3_where_vllm_would_not_start(capsys, argv):
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "vLLM would not start" in err and "Traceback" not in err


def _replace_line(text: str, key: str, line: str) -> str:
    new, n = re.subn(rf"(?m)^{key}: .*$", line, text)
    assert n == 1, key
    return new


@pytest.mark.parametrize("edit, words", [
    (lambda t: t + "workload:\n  num_requests: 8\n  input_len: 100\n  output_len: 10\n"
               "  concurrency: [2]\n", ["'workload'", "twice", "line 17"]),
    (lambda t: t.replace("engine:\n", "engine:\n  max_num_seqs: 8\n  max_num_seqs: 16\n"),
     ["'engine.max_num_seqs'", "twice", "line 14", "line 13"]),
    (lambda t: t.replace("engine:\n", "engine:\n  max_num_seqs: true\n"),
     ["engine.max_num_seqs", "True"]),
    (lambda t: t.replace("values: [true]", "values: [.nan]").replace(
        "scheduler_reserve_full_isl\n", "watermark\n"), ["remedies[0].values[0]", "watermark"]),
    (lambda t: t.replace("focus:\n", "focus:\n  variant: max_num_seqs=3\n"),
     ["focus.variant", "'max_num_seqs=3'", "max_num_seqs=20"]),
    (lambda t: t.replace("concurrency: 32", "concurrency: 5"), ["focus.concurrency", "5"]),
    (lambda t: t.replace("engine:\n", "engine:\n  block_size: 7\n"),
     ["engine.block_size", "multiple of 16"]),
    (lambda t: t.replace("seed: 7", "seed: true"), ["workload.seed", "True"]),
    (lambda t: t.replace("tensor_parallel_size: 1", "tensor_parallel_size: true"),
     ["tensor_parallel_size"]),
])
def test_experiment_duplicates_types_and_values(tmp_path, capsys, edit, words):
    path = experiment(tmp_path, text=edit(CI_SMALL.read_text()))
    refused(capsys, ["simulate", path, "--out", tmp_path / "o", "--no-metrics"], str(path),
            *words)


def test_a_key_twice_in_a_hardware_profile(tmp_path, capsys):
    hw = tmp_path / "hw.yaml"
    hw.write_text(L40S.read_text() + "eta_f: 0.1\n")
    refused(capsys, ["capacity", "--hardware", hw, "--model", "llama-3.1-8b"], str(hw),
            "'eta_f'", "twice")


@pytest.mark.parametrize("line, words", [
    ("memory: 48GiB", None),
    ("memory: 48", ["'memory'", "48GiB", "48GB"]),
    ("memory_gib: 1.0e+30", ["memory_gib"]),
])
def test_hardware_memory_with_units(tmp_path, capsys, line, words):
    hw = tmp_path / "hw.yaml"
    hw.write_text(_replace_line(L40S.read_text(), "memory_gib", line))
    argv = ["capacity", "--hardware", hw, "--model", "llama-3.1-8b", "--json"]
    if words is None:  # the same card as the built-in profile's memory_gib: 48
        assert "memory_gib: 48\n" in L40S.read_text()
        assert main([str(a) for a in argv]) == 0
        ours = json.loads(capsys.readouterr().out)
        assert main([str(a) for a in [*argv[:2], "l40s", *argv[3:]]]) == 0
        builtin = json.loads(capsys.readouterr().out)
        assert ours["num_gpu_blocks"] == builtin["num_gpu_blocks"] > 0
        assert ours["total_memory_bytes"] == builtin["total_memory_bytes"]
    else:
        refused(capsys, argv, str(hw), *words)


def test_a_hardware_block_size_no_backend_takes(tmp_path, capsys):
    hw = tmp_path / "hw.yaml"
    hw.write_text(_replace_line(L40S.read_text(), "default_block_size", "default_block_size: 7"))
    refused(capsys, ["capacity", "--hardware", hw, "--model", "llama-3.1-8b"], str(hw),
            "default_block_size")


@pytest.mark.parametrize("kv_heads", [7, 64])
def test_kv_heads_must_divide_attention_heads(tmp_path, capsys, kv_heads):
    model = tmp_path / "m.yaml"
    model.write_text(_replace_line(LLAMA_8B.read_text(), "num_key_value_heads",
                                   f"num_key_value_heads: {kv_heads}"))
    refused(capsys, ["capacity", "--hardware", "l40s", "--model", model], str(model),
            "num_key_value_heads", str(kv_heads), "32")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": kv_heads, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 8192}))
    refused(capsys, ["capacity", "--hardware", "l40s", "--model", config], str(config),
            "num_key_value_heads")


def test_latin1_in_a_trace_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "trace.csv").write_bytes("id,prompt_len,output_len\ncaf\xe9,100,10\n"
                                         .encode("latin-1"))
    data = yaml.safe_load(CI_SMALL.read_text())
    data["workload"] = {"trace": {"path": "trace.csv"}, "concurrency": [2]}
    data["focus"] = {}
    data.pop("comparison")
    data.pop("remedies")
    path = experiment(tmp_path, text=yaml.safe_dump(data))
    refused(capsys, ["simulate", path, "--out", tmp_path / "o", "--no-metrics"],
            "trace.csv", "line 2", "UTF-8")


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("kind", ["scenario", "experiment", "hardware", "model-json"])
def test_a_file_nested_200000_deep_exits_2(tmp_path, capsys, kind):
    path = tmp_path / {"scenario": "s.json", "experiment": "e.yaml", "hardware": "h.yaml",
                       "model-json": "m.json"}[kind]
    path.write_text(DEEP if kind == "scenario" else
                    '{"a": ' + DEEP + "}" if kind == "model-json" else "name: " + DEEP + "\n")
    argv = {"scenario": ["simulate", path, "--out", tmp_path / "o"],
            "experiment": ["simulate", path, "--out", tmp_path / "o"],
            "hardware": ["capacity", "--hardware", path, "--model", "llama-3.1-8b"],
            "model-json": ["capacity", "--hardware", "l40s", "--model", path]}[kind]
    refused(capsys, argv, str(path), "line 1", "nested")


def test_a_key_twice_in_a_scenario_names_the_key_and_line(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text('{"settings": {"num_gpu_blocks": 64,\n "max_num_seqs": 4,\n'
                    ' "max_num_seqs": 8},\n "requests": [{"id": "a", "prompt_len": 4, '
                    '"output_len": 1}]}')
    refused(capsys, ["simulate", path, "--out", tmp_path / "o"], str(path),
            "'settings.max_num_seqs'", "line 3", "line 2")


def test_overflow_and_recursion_nobody_caught_exit_2(monkeypatch, capsys, tmp_path):
    import kvpressure.commands.profiles as profiles

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    for exc in (OverflowError("int too large to convert to float"), RecursionError("deep")):
        def raising(args, exc=exc):
            raise exc

        monkeypatch.setattr(profiles, "run", raising)
        assert main(["profiles"]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, words", [
    (["simulate", CI_SMALL, "--set", "max_num_seqs=abc", "--no-metrics"], ["max_num_seqs=abc"]),
    (["sweep", CI_SMALL, "--jobs", "99999999999999999999"], ["--jobs"]),
    ([*CAPACITY, "--max-num-seqs", "-1"], ["--max-num-seqs", "-1"]),
    (["scrape", "http://127.0.0.1:9/metrics", "--timeout", "1e20", "--count", "1"],
     ["--timeout"]),
])
def test_refusals_name_the_option_given(tmp_path, capsys, argv, words):
    out = ["--out", tmp_path / ("log.jsonl" if argv[0] == "scrape" else "o")]
    err = refused(capsys, [*argv, *([] if argv[0] == "capacity" else out)], *words)
    if argv[0] == "simulate":  # the value came from --set, not from the file's field
        assert "ci_small.yaml" not in err


@pytest.mark.parametrize("option", ["--y", "--x", "--group"])
def test_knee_names_the_option_of_a_missing_column(tmp_path, capsys, option):
    runs = tmp_path / "runs.csv"
    runs.write_text("variant,concurrency,output_throughput\nbaseline,4,100\nbaseline,8,180\n"
                    "baseline,16,240\n")
    refused(capsys, ["knee", runs, option, "output_throughputt"], option, str(runs),
            "'output_throughput'")
