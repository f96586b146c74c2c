"""A reader's check of ``index.html``: what a careful engineer quoting one number from the page
would catch. :func:`page_problems` lists each defect (empty when the page is right):

- a number on the first screen (the verdict box, the key numbers, the symptom checklist) that
  neither the record nor a stage's file holds, as a value or inside a sentence it wrote: a
  number only the page has was made up on the way;
- NaN, inf or None printed as a value anywhere;
- a count or a level printed as a float ("2316.0", concurrency "16.0");
- a column of counted quantities (preemptions, recomputed tokens, the recompute ratio) in the
  investigation's tables without the window it was counted over: the same quantity appears
  from several windows (the focus window of one seed, whole runs, means over seeds).
"""

from __future__ import annotations

import json
import math
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

# A number as the page prints it: a sign, thousands separators, decimals, and its unit.
_NUMBER = re.compile(r"(?<![\w.])([+\-−]?\d[\d,]*(?:\.\d+)?)\s?(%|ms\b|s\b|tok/s\b)?")
# Not quantities: versions, clock times, file and rule names, percentiles in a metric's name.
_NOT_A_QUANTITY = re.compile(
    r"\d+\.\d+\.\d+|\b\d\d:\d\d:\d\d\b|\b[pP]\d\d\b|\bc\d+\b|\b0\d_\w+|\bv\d+\b|\bTP ?\d+\b")
_COUNTED = ("preemptions", "recomputed tokens", "recompute ratio")
_COUNT_HEADS = ("preemptions", "recomputed tokens", "requests", "steps", "runs averaged",
                "concurrency")


class _Text(HTMLParser):
    """The page's visible text by section, with table header and cell texts; code, links'
    targets, styles and images left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.section = ""
        self.texts: list[tuple[str, str]] = []
        self.headers: list[tuple[str, str]] = []
        self.cells: list[tuple[str, str]] = []
        self._skip = 0
        self._cell: list[str] | None = None
        self._cell_kind = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("code", "style", "script", "footer", "pre", "title"):
            self._skip += 1
        if tag == "section":
            self.section = dict(attrs).get("id") or self.section
        if tag in ("th", "td"):
            self._cell, self._cell_kind = [], tag

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.section = ""
        if tag in ("code", "style", "script", "footer", "pre", "title"):
            self._skip = max(0, self._skip - 1)
        if tag in ("th", "td") and self._cell is not None:
            text = " ".join("".join(self._cell).split())
            (self.headers if self._cell_kind == "th" else self.cells).append((self.section, text))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.texts.append((self.section, data))
        if self._cell is not None:
            self._cell.append(data)


def _source_numbers(run_dir: Path) -> list[float]:
    """Every number the record and the stages' files hold, as values or inside their text."""
    import yaml

    out: list[float] = []

    def walk(node: Any) -> None:
        if isinstance(node, bool):
            return
        if isinstance(node, int | float):
            if math.isfinite(node):
                out.append(float(node))
        elif isinstance(node, str):
            out.extend(_numbers_in(node))
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(k)
                walk(v)
        elif isinstance(node, list | tuple):
            out.append(float(len(node)))
            for v in node:
                walk(v)

    from kvpressure.folders.run_folder import RunFolder

    record = RunFolder(run_dir).record_path
    if record.is_file():
        doc = yaml.safe_load(record.read_text(encoding="utf-8"))
        walk(doc)
        # The page gives a window's length beside its ends.
        window = ((doc or {}).get("counters") or {}).get("window") or {}
        for a, b in (("start_s", "end_s"), ("gauges_start_s", "gauges_end_s")):
            if isinstance(window.get(a), int | float) and isinstance(window.get(b), int | float):
                out.append(float(window[b] - window[a]))
    for path in sorted((run_dir / "analysis").glob("*.json")):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return out


def _numbers_in(text: str) -> list[float]:
    text = _NOT_A_QUANTITY.sub(" ", text)
    return [float(m.group(1).replace(",", "").replace("−", "-")) for m in _NUMBER.finditer(text)]


def _traced(value: float, decimals: int, unit: str, sources: list[float]) -> bool:
    tol = 0.5 * 10 ** -decimals + 1e-9
    scales = {"%": (1.0, 100.0), "ms": (1.0, 1000.0), "s": (1.0, 0.001)}.get(unit, (1.0,))
    return any(abs(abs(v) * k - abs(value)) <= tol for v in sources for k in scales)


def page_problems(page: str, run_dir: str | os.PathLike[str]) -> list[str]:
    """What is wrong with ``page`` (``index.html`` of ``run_dir``) as a reader checks it."""
    parser = _Text()
    parser.feed(page)
    problems: list[str] = []
    sources = _source_numbers(Path(run_dir))
    first_screen = [t for s, t in parser.texts if s == "verdict"]
    first_screen += [t for s, t in parser.cells if s == "verdict"]
    first_screen += _key_numbers(page)
    seen: set[str] = set()
    for text in first_screen:
        for m in _NUMBER.finditer(_NOT_A_QUANTITY.sub(" ", text)):
            raw, unit = m.group(1), m.group(2) or ""
            digits = raw.split(".")[1] if "." in raw else ""
            value = float(raw.replace(",", "").replace("−", "-"))
            if raw in seen:
                continue
            seen.add(raw)
            if not _traced(value, len(digits), unit, sources):
                problems.append(f"first screen: {raw}{unit} is in no record or stage file "
                                f"(in: {' '.join(text.split())[:80]!r})")
    for section, text in parser.texts + parser.cells:
        # "--request-rate inf" is vllm bench serve's own word for no rate limit.
        for m in re.finditer(r"(?<![\w.])(?<!rate )(nan|NaN|inf|-inf|None)(?![\w.])", text):
            problems.append(f"{section or 'page'}: {m.group(1)} printed as a value "
                            f"(in: {' '.join(text.split())[:80]!r})")
    problems += _float_counts(page)
    for section, head in parser.headers:
        low = head.lower()
        if (section in ("verdict", "01_collect", "02_recompute", "03_knee")
                and low.startswith(_COUNTED) and "(" not in low):
            problems.append(f"{section}: column {head!r} does not say which window it counts")
    return problems


def _key_numbers(page: str) -> list[str]:
    """The key numbers table (just after the verdict box)."""
    m = re.search(r"<h3>Key numbers</h3>(.*?)</table>", page, re.S)
    if not m:
        return []
    return [re.sub(r"<[^>]+>", " ", m.group(1))]


def _float_counts(page: str) -> list[str]:
    """Counts and levels printed as floats, by the columns their tables head them with."""
    out = []
    for table in re.findall(r"<table.*?</table>", page, re.S):
        heads = [re.sub(r"<[^>]+>|\s+", " ", h).strip().lower()
                 for h in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S):
            cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                          row, re.S)]
            for head, cell in zip(heads[-len(cells):] if cells else [], cells, strict=False):
                # A head with a per-unit ("requests/s") is a rate, and 1.00 of one is right.
                if (head.startswith(_COUNT_HEADS) and "/" not in head
                        and re.fullmatch(r"-?\d[\d,]*\.0+", cell)):
                    out.append(f"column {head!r}: the count {cell} printed as a float")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m kvpressure.report.page_check RUN_DIR...``: exit 1 naming each defect."""
    import sys

    from kvpressure.folders.run_folder import RunFolder

    bad = 0
    for run_dir in argv if argv is not None else sys.argv[1:]:
        problems = page_problems(RunFolder(run_dir).index_path.read_text(encoding="utf-8"),
                                 run_dir)
        for p in problems:
            print(f"{run_dir}/index.html: {p}", file=sys.stderr)
        bad += len(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
