"""Reading a text file the user gave: anything unreadable is refused naming the file.

A binary file, a file in another encoding or a folder where a file was expected is the user's
mistake, reported as an ``InputError`` (exit 2), never as a decoding traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError


def read_user_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The UTF-8 text of ``path``; InputError naming the file when it is missing, a folder,
    binary or not UTF-8 (with the line of the first bad byte)."""
    p = Path(path)
    try:
        data = p.read_bytes()
        if data[:2] == b"\x1f\x8b":  # a gzipped export (bench.json.gz): its text is the input
            import gzip

            data = gzip.decompress(data)
    except FileNotFoundError:
        raise InputError(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a folder, expected a {what}") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{p}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if b"\x00" in data[:1 << 16]:
        raise InputError(f"{p}: binary data, not a text {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{p}, line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start}); save the {what} as UTF-8") from None
    return text.removeprefix("\ufeff")


# A hand-written experiment, profile or scenario nests a few levels; far deeper is a generated
# or hostile file that would exhaust the parsers' and validators' recursion.
MAX_NESTING = 64


def parse_user_yaml(text: str, where: str | os.PathLike[str]) -> Any:
    """``text`` parsed as YAML (safe tags only); InputError naming ``where``, the line and the
    key for invalid YAML, a key given twice in one mapping, or nesting deeper than
    ``MAX_NESTING``."""
    return parse_user_yaml_with_lines(text, where)[0]


def parse_user_yaml_with_lines(text: str, where: str | os.PathLike[str]
                               ) -> tuple[Any, dict[str, int]]:
    """As :func:`parse_user_yaml`, with the 1-based line of each top-level key."""
    import yaml

    where = os.fspath(where)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines = _check_yaml_tree(node, where)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{where}{line}: not valid YAML: {exc}") from None
    except RecursionError:
        raise InputError(f"{where} line {loader.line + 1}: nested more than {MAX_NESTING} "
                         "levels deep; not an input the kit reads") from None
    finally:
        loader.dispose()
    return data, lines


def _check_yaml_tree(node: Any, where: str) -> dict[str, int]:
    """Duplicate keys and nesting depth of a composed YAML document (iteratively: a deep
    document must not exhaust the stack here); the top-level keys' lines."""
    import yaml

    lines: dict[str, int] = {}
    if node is None:
        return lines
    if isinstance(node, yaml.MappingNode):
        lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value
                 if isinstance(k, yaml.ScalarNode)}
    stack: list[tuple[Any, int, str]] = [(node, 1, "")]
    seen_nodes: set[int] = set()  # an alias shares its anchor's node: check it once
    while stack:
        current, depth, path = stack.pop()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.ScalarNode):
            continue
        if depth > MAX_NESTING:
            raise InputError(f"{where} line {current.start_mark.line + 1}: nested more than "
                             f"{MAX_NESTING} levels deep; not an input the kit reads")
        if isinstance(current, yaml.SequenceNode):
            for i, item in enumerate(current.value):
                stack.append((item, depth + 1, f"{path}[{i}]"))
            continue
        keys: dict[tuple[str, str], int] = {}
        for key_node, value_node in current.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if key_node.value == "<<" and key_node.tag.endswith(":merge"):
                    pass  # merge keys may repeat
                elif key in keys:
                    name = f"{path}.{key_node.value}" if path else key_node.value
                    raise InputError(f"{where} line {line}: key {name!r} is given twice (first "
                                     f"on line {keys[key]}); keep one")
                else:
                    keys[key] = line
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
            else:
                child = path
            stack.append((key_node, depth + 1, child))
            stack.append((value_node, depth + 1, child))
    return lines


def parse_user_json(text: str, where: str | os.PathLike[str]) -> Any:
    """``text`` parsed as JSON; InputError naming ``where``, the line and the key for invalid
    JSON, a key given twice in one object, or nesting deeper than ``MAX_NESTING``."""
    import json

    where = os.fspath(where)
    problem = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal problem
        out = dict(items)
        problem = problem or len(out) != len(items)
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        data, problem = None, True
    if problem or _depth_exceeds(data):
        _locate_json_problem(text, where)
    return data


def _depth_exceeds(data: Any) -> bool:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        if depth > MAX_NESTING:
            return True
        stack.extend((v, depth + 1) for v in value)
    return False


def _locate_json_problem(text: str, where: str) -> None:
    """Raise the InputError for the first duplicate key or too-deep nesting in ``text`` (valid
    JSON), naming its line: a token walk, run only once a problem is known."""
    import json
    import re

    token = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')
    colon = re.compile(r"\s*:")
    stack: list[tuple[str, dict[str, int] | None, str]] = []  # kind, keys seen, path
    pending_key: str | None = None  # the key whose value comes next
    line, pos = 1, 0
    for m in token.finditer(text):
        tok = m.group()
        line += text.count("\n", pos, m.start())
        pos = m.start()
        if tok in "{[":
            path = stack[-1][2] if stack else ""
            if pending_key is not None:
                path = f"{path}.{pending_key}" if path else pending_key
            stack.append((tok, {} if tok == "{" else None, path))
            pending_key = None
            if len(stack) > MAX_NESTING:
                raise InputError(f"{where}: line {line}: nested more than {MAX_NESTING} "
                                 "levels deep; not an input the kit reads")
        elif tok in "}]":
            stack.pop()
            pending_key = None
        elif tok == ":":
            pass
        elif stack and stack[-1][0] == "{" and colon.match(text, m.end()):
            key = json.loads(tok)
            keys = stack[-1][1]
            assert keys is not None
            if key in keys:
                path = stack[-1][2]
                name = f"{path}.{key}" if path else key
                raise InputError(f"{where}: line {line}: key {name!r} is given twice (first "
                                 f"on line {keys[key]}); keep one")
            keys[key] = line
            pending_key = key
    raise InputError(f"{where}: nested more than {MAX_NESTING} levels deep")

