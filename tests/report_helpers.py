"""Shared helpers of the report tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def empty_fields(node: Any, path: str = "") -> Iterator[str]:
    """Dotted paths of every empty value (None, "", [], {}) in a nested record."""
    if node is None or node == "" or node == [] or node == {}:
        yield path
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from empty_fields(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from empty_fields(v, f"{path}[{i}]")
