"""``--config FILE``: a command's long option list kept in a YAML file.

The file maps option names (as on the command line, with or without the dashes; ``-`` and ``_``
alike) to values: a scalar is one value, a list several (``--levels`` of ``nargs``, or an
option given again for one that repeats), ``true`` gives a flag and ``false`` leaves it out.
A positional argument goes under its own name (``run_dir``, ``experiment``). Options on the
command line come after the file's, so they win where an option takes one value.

    kvpressure twin --config twin.yaml          # run_dir: runs/a, out: twins/a, set: [...]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError, nearest

OPTION = "--config"


def split_config(argv: list[str]) -> tuple[list[str], Path | None]:
    """``argv`` without ``--config FILE`` (or ``--config=FILE``), and the file."""
    rest, path = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == OPTION or arg.startswith(OPTION + "="):
            if path is not None:
                raise InputError(f"{OPTION}: given twice")
            value = arg.partition("=")[2] if "=" in arg else (
                argv[i + 1] if i + 1 < len(argv) else "")
            if not value:
                raise InputError(f"{OPTION}: give the YAML file of options")
            if "=" not in arg:
                next(it, None)
            path = Path(value)
            continue
        rest.append(arg)
    return rest, path


def _token(value: Any, where: str) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        raise InputError(f"{where}: expected a number or a string, got {value!r}")
    return str(value)


def config_argv(parser: argparse.ArgumentParser, path: Path) -> tuple[list[str], list[str]]:
    """(positional tokens, option tokens) the file ``path`` gives for ``parser``'s command."""
    from kvpressure.user_files import parse_user_yaml_with_lines, read_user_text

    data, lines = parse_user_yaml_with_lines(read_user_text(path, "config file"), path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of option: value")
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}
    for a in parser._actions:
        for s in a.option_strings:
            actions.setdefault(s.lstrip("-").replace("-", "_"), a)
    positional: list[str] = []
    options: list[str] = []
    for key, value in data.items():
        where = f"{path}, line {lines.get(key, '?')}: {key}"
        name = str(key).lstrip("-").replace("-", "_")
        action = actions.get(name)
        if action is None or name == "config":
            hint = nearest(name, [k for k in actions if k != "config"])
            raise InputError(f"{where}: not an option of this command"
                             + (f" (did you mean {hint}?)" if hint else ""))
        values = value if isinstance(value, list) else [value]
        if not action.option_strings:
            positional.extend(_token(v, where) for v in values)
            continue
        flag = next((s for s in action.option_strings if s.startswith("--")),
                    action.option_strings[0])
        if action.nargs == 0:  # a flag: store_true and its kind
            if not isinstance(value, bool):
                raise InputError(f"{where}: a flag takes true or false, got {value!r}")
            if value:
                options.append(flag)
        elif action.nargs in ("+", "*") or isinstance(action.nargs, int):
            options.extend([flag, *(_token(v, where) for v in values)])
        elif isinstance(action, argparse._AppendAction):
            for v in values:
                options.extend([flag, _token(v, where)])
        else:
            if isinstance(value, list):
                raise InputError(f"{where}: takes one value, got a list")
            options.extend([flag, _token(value, where)])
    return positional, options
