"""``--config FILE``: a command's options from a YAML file, the command line's own winning;
a key that is no option of the command refused naming the file, the line and the nearest
option."""

from __future__ import annotations

import pandas as pd
import pytest

from kvpressure.cli import command_parser, main
from kvpressure.cli_config import config_argv


def test_a_sweep_from_a_config_file_and_the_command_line_wins(tmp_path, capsys):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"experiment: ci_small\nout: {tmp_path / 'a'}\nmax-concurrency: [4, 8]\n"
                   "no_compare: true\njobs: 1\n")
    assert main(["sweep", "--config", str(cfg)]) == 0
    assert sorted(pd.read_csv(tmp_path / "a" / "runs.csv")["concurrency"].unique()) == [4, 8]
    # a level given on the command line replaces the file's (one value an option)
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "b"),
                 "--max-concurrency", "8"]) == 0
    assert sorted(pd.read_csv(tmp_path / "b" / "runs.csv")["concurrency"].unique()) == [8]


def test_each_kind_of_option_becomes_its_tokens(tmp_path):
    cfg = tmp_path / "twin.yaml"
    cfg.write_text("run_dir: runs/a\n--out: twins/a\nset: [max_num_seqs=8, num_gpu_blocks=64]\n"
                   "no-remedies: true\nbootstrap: 50\nlimits: ttft_p95=2s\n")
    positional, options = config_argv(command_parser("twin"), cfg)
    assert positional == ["runs/a"]
    assert options == ["--out", "twins/a", "--set", "max_num_seqs=8", "--set",
                       "num_gpu_blocks=64", "--no-remedies", "--bootstrap", "50", "--limits",
                       "ttft_p95=2s"]
    cfg.write_text("run_dir: runs/a\nno_remedies: false\n")
    assert config_argv(command_parser("twin"), cfg) == (["runs/a"], [])


@pytest.mark.parametrize("text, words", [
    ("experiment: ci_small\nmax-concurency: 4\n", "line 2: max-concurency: not an option of "
                                                  "this command (did you mean max_concurrency?)"),
    ("experiment: ci_small\nno_compare: yes please\n", "a flag takes true or false"),
    ("experiment: ci_small\njobs: [1, 2]\n", "jobs: takes one value, got a list"),
    ("experiment: ci_small\njobs: 1\njobs: 2\n", "jobs"),
    ("- experiment\n", "expected a mapping of option: value"),
])
def test_a_bad_config_file_is_refused_naming_it(tmp_path, capsys, text, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(cfg) in err and words in err
    assert not (tmp_path / "o").exists()


def test_a_missing_config_file_and_one_given_twice(tmp_path, capsys):
    assert main(["sweep", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("experiment: ci_small\n")
    assert main(["sweep", "--config", str(cfg), f"--config={cfg}"]) == 2
    assert "--config: given twice" in capsys.readouterr().err
