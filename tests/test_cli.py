"""The command line: every subcommand is listed, importable and wired to a module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvpressure.cli import SUBCOMMANDS, main


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvpressure.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in SUBCOMMANDS:
        assert name in out, f"--help does not list {name}"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_describes_its_options(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvpressure {name}") and SUBCOMMANDS[name] in " ".join(out.split())


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
