"""``kvpressure capacity`` and ``kvpressure profiles``: output, JSON and exit codes."""

from __future__ import annotations

import json
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


def test_max_model_len_too_long_exits_2_with_the_fitting_length(capsys):
    rc = main([*TINY, "--max-model-len", "145"])
    assert rc == 2
    assert "largest max_model_len that fits is 144" in capsys.readouterr().err


def test_bad_tp_and_weights_exit_2(capsys):
    assert main(["capacity", "--hardware", "ascend-910b-64g", "--model", "qwen2.5-7b",
                 "--tp", "8"]) == 2
    assert "num_attention_heads" in capsys.readouterr().err
    assert main(["capacity", "--hardware", "ascend-910b-64g", "--model", "deepseek-v3",
                 "--tp", "8"]) == 2
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
