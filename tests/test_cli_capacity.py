"""``kvpressure capacity`` and ``kvpressure profiles``: output, JSON and exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvpressure.cli import main
from kvpressure.paths import data_dir

HF = Path(__file__).parent / "data" / "hf_config"
TINY = [
    "capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b", "--block-size", "16",
    "--kv-cache-memory-bytes", str(21 * 2**20),
]


def test_capacity_json_matches_hand_numbers(capsys):
    # 21 MiB of KV at 2 MiB per block: 10 blocks, 9 usable; cdiv(32, 16) = 2 blocks a sequence
    rc = main([*TINY, "--max-model-len", "144", "--avg-seq-len", "32", "40", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_gpu_blocks"] == 10
    assert out["block_bytes"] == 2 * 2**20
    assert out["kv_cache_size_tokens"] == 160
    assert out["safe_concurrency"] == [
        {"avg_seq_len": 32, "safe_concurrency": 4, "safe_concurrency_half_filled_tail": 3},
        {"avg_seq_len": 40, "safe_concurrency": 3, "safe_concurrency_half_filled_tail": 3},
    ]


def test_capacity_table_shows_breakdown_and_pool(capsys):
    rc = main(["capacity", "--hardware", "ascend-910b-64g", "--model", "llama-3.1-70b",
               "--tp", "8", "--max-model-len", "8192", "--avg-seq-len", "4096"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "weights" in text and "KV pool" in text
    assert "block_size 128" in text
    assert "40,960" in text  # KV bytes per token per rank
    assert "max_num_batched_tokens 2048, max_num_seqs 256" in text


def test_capacity_with_hf_config(capsys):
    rc = main(["capacity", "--hardware", "h100-80g", "--model", str(HF / "llama-3.1-8b.json"),
               "--max-model-len", "8192", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 131072


def test_unknown_hardware_lists_known_names(capsys):
    rc = main(["capacity", "--hardware", "x", "--model", "llama-3.1-8b"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown profile 'x'" in err
    for name in ("ascend-910b-64g", "h100-80g", "mi300x"):
        assert name in err


def test_max_model_len_too_long_exits_3_with_the_fitting_length(capsys):
    # vLLM stops at startup ("To serve at least one request ..."): the README's exit 3
    rc = main([*TINY, "--max-model-len", "145"])
    assert rc == 3
    assert "largest max_model_len that fits is 144" in capsys.readouterr().err


def test_bad_tp_exits_2_and_weights_that_do_not_fit_exit_3(capsys):
    assert main(["capacity", "--hardware", "ascend-910b-64g", "--model", "qwen2.5-7b",
                 "--tp", "8"]) == 2
    assert "num_attention_heads" in capsys.readouterr().err
    # the weights do not load: vLLM does not start, the README's exit 3
    assert main(["capacity", "--hardware", "ascend-910b-64g", "--model", "deepseek-v3",
                 "--tp", "8"]) == 3
    assert "weights need" in capsys.readouterr().err


def test_non_integer_argument_exits_2():
    with pytest.raises(SystemExit) as exc:
        main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b", "--tp", "two"])
    assert exc.value.code == 2


def test_profiles_lists_builtins(capsys):
    assert main(["profiles", "--kind", "hardware", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [e["name"] for e in out["hardware"]]
    assert names == sorted(p.stem for p in (data_dir() / "hardware").glob("*.yaml"))
    assert all(e["description"] for e in out["hardware"])
    assert main(["profiles", "--kind", "model"]) == 0
    text = capsys.readouterr().out
    assert "deepseek-v3" in text and "MLA" in text


def test_reader_closing_the_pipe_early_is_not_an_error():
    """``kvpressure capacity --json | head -1``: the reader goes away before the output is
    written; the command exits 0 without a traceback."""
    import subprocess
    import sys

    code = "import sys; from kvpressure.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *TINY, "--max-model-len", "144", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child can write: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and err == ""


LOGS = Path(__file__).parent / "data" / "startup_logs"


@pytest.mark.parametrize(
    ("log", "blocks", "interval"),
    [("vllm033_llama31_8b_h100.log", 28_317, [28_316, 28_321]),
     ("vllm_v0_llama3_8b_h100.log", 27_279, [27_276, 27_281])],
)
def test_from_log_reproduces_the_logs_blocks(capsys, log, blocks, interval):
    """Hand-worked in tests/data/startup_logs/README.md: the log's available KV memory, to
    0.01 GiB, over 2 MiB blocks allows ``interval``; the log names ``blocks`` (V1 through its
    token count 28,317 x 16, V0 directly) and the kit lands on it."""
    rc = main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b", "--from-log",
               str(LOGS / log), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    c = out["from_log"]
    assert c["blocks_interval"] == interval
    assert c["reproduces_blocks"] is True
    rows = {r["field"]: r for r in c["rows"]}
    assert rows["num_gpu_blocks"]["log"] == rows["num_gpu_blocks"]["from_log"] == blocks
    assert out["num_gpu_blocks"] == blocks
    assert out["max_model_len"] == 8192 and out["tensor_parallel_size"] == 1
    assert rows["max concurrency"]["from_log"] == rows["max concurrency"]["log"]
    # the full estimate (profiles only) is reported against the log, not forced onto it
    assert c["estimate_error"] == round(rows["num_gpu_blocks"]["estimate"] / blocks - 1, 4)


def test_from_log_with_the_wrong_kv_layout_does_not_reproduce(capsys):
    # an fp8 KV cache halves the block: the log's 55.31 GiB would be ~56,600 blocks
    rc = main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b", "--from-log",
               str(LOGS / "vllm033_llama31_8b_h100.log"), "--kv-cache-dtype", "fp8", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["from_log"]["reproduces_blocks"] is False


def test_from_log_text_shows_the_fields_side_by_side(capsys):
    assert main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b", "--from-log",
                 str(LOGS / "vllm033_llama31_8b_h100.log")]) == 0
    text = capsys.readouterr().out
    assert "v1 format" in text and "blocks reproduced from the log's figures: yes" in text
    assert "453,072" in text and "28,317" in text


def test_log_without_kv_lines_is_an_input_error(tmp_path, capsys):
    p = tmp_path / "x.log"
    p.write_text("INFO nothing here\n")
    assert main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b",
                 "--from-log", str(p)]) == 2
    assert "no KV-pool line" in capsys.readouterr().err


def test_measured_flags_replace_the_estimates(capsys):
    """The V0 log's figures as flags: 79.22 GiB = 85,061,827,297 B, x 0.9 rounded up =
    76,555,644,568 B, minus 14.96, 1.79 and 1.26 GiB (16,063,177,687 + 1,921,997,865 +
    1,352,914,698 B) = 57,217,554,318 B -> 27,283 blocks of 2 MiB (the log's own 0.01 GiB
    rounding of each term puts vLLM's count, 27,279, four blocks lower)."""
    rc = main(["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b",
               "--max-model-len", "8192", "--block-size", "16", "--gpu-memory-utilization", "0.9",
               "--total-memory", "79.22GiB", "--weights", "14.96GiB", "--non-torch", "1.79GiB",
               "--activation-peak", "1.26GiB", "--cudagraph", "0", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimated"] == []
    assert out["available_kv_bytes"] == 57_217_554_318
    assert out["num_gpu_blocks"] == 27_283


def test_zero_budget_prints_vllms_refusal_and_exits_3(capsys):
    rc = main(["capacity", "--hardware", "l40s", "--model", "llama-3.1-8b",
               "--gpu-memory-utilization", "0.36", "--max-model-len", "4096"])
    assert rc == 3  # neither the user's error (2) nor a bug (1)
    captured = capsys.readouterr()
    assert "No available memory for the cache blocks" in captured.err
    assert "num_gpu_blocks                0" in captured.out


def test_kv_budget_larger_than_the_card_is_warned(capsys):
    rc = main(["capacity", "--hardware", "l4", "--model", "llama-3.1-8b", "--max-model-len",
               "4096", "--kv-cache-memory-bytes", "40GiB"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "more than the card" in captured.err
    assert re.search(r"left unused in the request +0\.00 ", captured.out)


def test_bad_size_names_the_option(capsys):
    assert main(["capacity", "--hardware", "l4", "--model", "llama-3.1-8b",
                 "--weights", "lots"]) == 2
    assert "--weights" in capsys.readouterr().err
