"""The command line: every subcommand is listed, importable and wired to a module."""

from __future__ import annotations

import importlib
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
def test_subcommand_module_has_arguments_and_run(name: str) -> None:
    module = importlib.import_module(f"kvpressure.commands.{name}")
    assert callable(module.add_arguments)
    assert callable(module.run)


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
