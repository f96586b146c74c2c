"""Sweep tables from benchmark tools other than one ``vllm bench serve`` JSON -> ``runs`` rows.

Formats, recognised by content:

* ``runs_csv``: any CSV with one row per run. Its columns are the ``runs`` columns
  (``concurrency``, ``output_throughput``, ...) or are mapped onto them with
  ``columns={"concurrency": "conc", "output_throughput": "tok_s"}`` (the CLI's
  ``--columns concurrency=conc,output_throughput=tok_s``). A latency column mapped onto a
  ``_s`` column is read as seconds unless its name says ms (``_ms``, ``(ms)``) or the mapping
  says so (``ttft_p95_s=ttft95:ms``).
* ``vllm_sweep``: ``vllm bench sweep serve`` results (:mod:`kvpressure.ingestion.bench_sweep`).
* ``guidellm``: GuideLLM's ``benchmarks.json``/``.yaml``/``.csv`` (:mod:`.guidellm`).
* ``aiperf``: AIPerf's ``profile_export_aiperf.json``/``.csv`` (:mod:`.aiperf`).

A row the knee cannot place is kept in the table and reported with the reason
(:func:`unusable_reason`); nothing is dropped silently.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.scrape_runs import RUNS_COLUMNS
from kvpressure.ingestion.text_files import open_text

# Columns a mapping may fill: the runs columns a measurement gives (the scrape columns come
# from a scrape log, the bookkeeping ones from the reader).
MAPPABLE = tuple(c for c in RUNS_COLUMNS if c not in (
    "run", "source", "t_start", "t_end", "recomputed_tokens_low", "recomputed_tokens_high"))
THROUGHPUT_COLUMNS = ("output_throughput", "request_throughput", "total_token_throughput")
_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


# ---------------------------------------------------------------------- column names
_LATENCY_WORDS = re.compile(
    r"ttft|itl|tpot|e2el|e2e|latency|lat\b|_lat_|delay|time_to|inter_token|time per|"
    r"(^|[_\s(])ms\b|_ms$|\(ms\)|seconds|duration", re.IGNORECASE)
_THROUGHPUT_WORDS = re.compile(
    r"throughput|tput|tok(en)?s?[_/ ]?(per[_ ])?s(ec(ond)?)?\b|tok_s|tps\b|per_second|/s\b|"
    r"rps\b|qps\b|req(uest)?s?[_/ ]?(per[_ ])?s(ec)?\b|goodput", re.IGNORECASE)
_PER_USER = re.compile(r"per[_ ]user|/user\b", re.IGNORECASE)


def throughput_problem(name: str) -> str | None:
    """Why column ``name`` cannot be the throughput of a knee curve, or None when it can.

    A latency rises with concurrency and a per-user rate falls by design: either would put a
    "knee" where the server has none.
    """
    if _PER_USER.search(name):
        return (f"'{name}' is a per-user rate: it falls as concurrency rises by design; the knee "
                "needs the server's throughput (e.g. output tokens/s over all requests)")
    if _LATENCY_WORDS.search(name) and not _THROUGHPUT_WORDS.search(name):
        return (f"'{name}' is named like a latency or a time, not a throughput; the knee needs "
                "a throughput (tokens/s or requests/s)")
    return None


def parse_columns(spec: str | dict[str, str] | None, option: str = "--columns"
                  ) -> dict[str, str]:
    """``"concurrency=conc,output_throughput=tok_s"`` -> ``{"concurrency": "conc", ...}``;
    InputError naming the bad item. Keys are runs columns."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, dict):
        items = [(str(k), str(v)) for k, v in spec.items()]
    else:
        items = []
        for part in str(spec).split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise InputError(f"{option} {part.strip()!r}: expected RUNS_COLUMN=SOURCE_COLUMN "
                                 "(e.g. concurrency=conc,output_throughput=tok_s)")
            items.append((key.strip(), value.strip()))
    out: dict[str, str] = {}
    for key, value in items:
        if key not in MAPPABLE:
            raise InputError(f"{option} {key}={value}: '{key}' is not a runs column; mappable: "
                             f"{', '.join(MAPPABLE)}")
        if key in out:
            raise InputError(f"{option}: '{key}' mapped twice")
        source, _, unit = value.partition(":")
        if unit and unit not in _UNITS:
            raise InputError(f"{option} {key}={value}: unit '{unit}' unknown; one of "
                             f"{', '.join(_UNITS)}")
        if key in THROUGHPUT_COLUMNS:
            why = throughput_problem(source)
            if why:
                raise InputError(f"{option} {key}={value}: {why}")
        out[key] = value
    return out


# ---------------------------------------------------------------------- detection
def _csv_rows(text: str, limit: int = 6) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()][:limit]
    try:
        return list(csv.reader(lines))
    except csv.Error:
        return []


_HEADER_CELL = re.compile(r"^[\w .()/%#\[\]+\-]*$")


def looks_like_csv(head: str) -> bool:
    """A header of comma-separated names followed by rows of the same width: not a Prometheus
    exposition (``# HELP``, ``name{labels} value``) and not a log (``INFO 12-01 ...: x, y``)."""
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    if first.lstrip().startswith("#") or "{" in first or "," not in first:
        return False
    rows = _csv_rows(head)
    if len(rows) < 2 or len(rows[0]) < 2:
        return False
    return all(_HEADER_CELL.match(c.strip()) for c in rows[0])


def sniff_table(path: Path, head: str, obj: Any = None) -> str | None:
    """The format of a sweep table from its first bytes (or its parsed JSON/YAML ``obj``)."""
    from kvpressure.ingestion import aiperf, bench_sweep, guidellm

    if obj is not None:
        for module in (guidellm, aiperf, bench_sweep):
            if module.is_export(obj):
                return module.FORMAT
        return None
    if looks_like_csv(head):
        rows = _csv_rows(head)
        for module in (guidellm, aiperf, bench_sweep):
            if module.is_csv(rows):
                return module.FORMAT
        return "runs_csv"
    if guidellm.is_yaml_head(head):
        return guidellm.FORMAT
    return None


def table_format(path: Path) -> str | None:
    """The sweep-table format of a file, or None (a vllm bench serve result, a scrape...)."""
    try:
        with open_text(path) as fh:
            head = fh.read(65536)
    except (OSError, EOFError):
        return None  # unreadable or cut: the scrape readers say what is wrong with it
    stripped = head.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            with open_text(path) as fh:
                obj = json.load(fh)
        except (json.JSONDecodeError, OSError, EOFError, RecursionError):
            return None  # the readers name what is wrong with it
        return sniff_table(path, head, obj)
    return sniff_table(path, head)


# ---------------------------------------------------------------------- reading
def read_table(path: Path, run: str, notes: list[str], *, columns: dict[str, str] | None = None,
               fmt: str | None = None) -> list[dict[str, Any]]:
    """The runs rows of one sweep table; each unusable row reported in ``notes``."""
    from kvpressure.ingestion import aiperf, bench_sweep, guidellm

    fmt = fmt or table_format(path)
    if fmt is None:
        raise InputError(f"{path}: not a sweep table this kit reads (runs CSV, vllm bench sweep, "
                         "GuideLLM or AIPerf export)")
    if fmt == "runs_csv":
        rows = read_runs_csv(path, run, notes, columns=columns or {})
    else:
        if columns:
            notes.append(f"{path}: a {fmt} export: --columns applies to plain CSV tables only "
                         "and was not used")
        reader = {"vllm_sweep": bench_sweep, "guidellm": guidellm, "aiperf": aiperf}[fmt]
        rows = reader.read(path, run, notes)
    report_unusable(rows, notes)
    return rows


def _read_csv_text(path: Path) -> tuple[list[str], list[list[str]]]:
    with open_text(path) as fh:
        text = fh.read()
    rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    if not rows:
        raise InputError(f"{path}: empty CSV")
    return [c.strip() for c in rows[0]], rows[1:]


def to_number(text: Any) -> float:
    """A cell as a float: NaN for empty or non-numeric, inf for ``inf``."""
    if isinstance(text, bool) or text is None:
        return math.nan
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    if s.lower() in ("inf", "+inf", "infinity"):
        return math.inf
    try:
        return float(s)
    except ValueError:
        return math.nan


def _scale(target: str, source: str, unit: str) -> float:
    """Factor from the source column's unit to the runs column's."""
    if not target.endswith("_s"):
        return 1.0
    if unit:
        return _UNITS[unit]
    if re.search(r"_ms$|\(ms\)|\bms\b", source, re.IGNORECASE):
        return 1e-3
    return 1.0


def read_runs_csv(path: Path, run: str, notes: list[str], *, columns: dict[str, str]
                  ) -> list[dict[str, Any]]:
    """A plain CSV of runs, its columns mapped onto the runs columns (identity by default)."""
    header, body = _read_csv_text(path)
    mapping = {c: c for c in MAPPABLE if c in header}
    for target, value in columns.items():
        source, _, _ = value.partition(":")
        if source not in header:
            raise InputError(f"{path}: --columns {target}={value}: no column '{source}' "
                             f"(columns: {', '.join(header)})")
        mapping[target] = value
    for need in ("concurrency", "output_throughput"):
        if need not in mapping:
            raise InputError(
                f"{path}: no '{need}' column; map one with --columns "
                f"{need}=YOUR_COLUMN (columns: {', '.join(header)})")
    for target in THROUGHPUT_COLUMNS:
        if target in mapping:
            why = throughput_problem(mapping[target].partition(":")[0])
            if why:
                raise InputError(f"{path}: column {target}: {why}")
    index = {name: i for i, name in enumerate(header)}
    scales = {}
    for target, value in mapping.items():
        source, _, unit = value.partition(":")
        scales[target] = _scale(target, source, unit)
        if scales[target] != 1.0 and not unit:
            notes.append(f"{path}: column '{source}' read as milliseconds (its name says ms) "
                         f"into {target}")
    rows = []
    for lineno, cells in enumerate(body, start=2):
        row: dict[str, Any] = {c: math.nan for c in RUNS_COLUMNS}
        row.update(run=run, variant="default", source=f"{path}#{lineno - 1}", model=None,
                   date=None)
        raw: dict[str, str] = {}
        for target, value in mapping.items():
            source = value.partition(":")[0]
            i = index[source]
            cell = cells[i].strip() if i < len(cells) else ""
            raw[target] = cell
            if target in ("variant", "model", "date"):
                row[target] = cell or row[target]
            else:
                row[target] = to_number(cell) * scales[target]
        if "variant" not in mapping and "variant" in index:
            row["variant"] = cells[index["variant"]].strip() or "default"
        row["_raw"] = raw
        row["_where"] = f"{path}: line {lineno}"
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: a header and no rows")
    return rows


# ---------------------------------------------------------------------- rows the knee cannot use
def unusable_reason(row: dict[str, Any]) -> str | None:
    """Why the knee cannot place ``row`` on the concurrency axis, or None."""
    raw = row.get("_raw") or {}
    c = to_number(row.get("concurrency"))
    rate = to_number(row.get("request_rate"))
    y = to_number(row.get("output_throughput"))
    if math.isnan(c):
        text = str(raw.get("concurrency", "")).strip()
        if text and math.isnan(to_number(text)):
            return f"concurrency {text!r} is not a number"
        if math.isinf(rate):
            return ("no concurrency limit and an infinite request rate (inf): every request at "
                    "once is not a load level the knee can place")
        if math.isfinite(rate):
            return (f"a request-rate level ({rate:g} req/s) without a concurrency limit: not on "
                    "the concurrency axis (kvpressure knee --x request_rate places it)")
        return "no concurrency level"
    if math.isinf(c):
        return "concurrency is infinite"
    if c <= 0:
        return f"concurrency {c:g} is not a positive level"
    if math.isnan(y):
        text = str(raw.get("output_throughput", "")).strip()
        return (f"output throughput {text!r} is not a number" if text
                else "no output throughput")
    if not math.isfinite(y):
        return f"output throughput is {y}"
    return None


def report_unusable(rows: list[dict[str, Any]], notes: list[str]) -> None:
    """One note per row the knee cannot use, naming the row and the reason; helper keys
    (``_raw``, ``_where``) removed."""
    for row in rows:
        why = unusable_reason(row)
        if why:
            where = row.get("_where") or row.get("source") or "row"
            notes.append(f"{where}: kept in runs, left out of the knee: {why}")
        row.pop("_raw", None)
        row.pop("_where", None)


# ---------------------------------------------------------------------- folders and sources
def folder_tables(folder: Path, files: list[Path]) -> list[Path]:
    """A folder's files as a sweep: AIPerf's artifact folders at or below it are added (one
    per level, each its export and the server metrics recorded beside it; the rest of what
    AIPerf writes there is not a source), and a sweep's ``summary.json`` beside the
    ``run=N.json`` files it repeats is left out, as are GuideLLM's YAML and CSV copies of the
    JSON report beside them (their runs would count twice)."""
    from kvpressure.ingestion import aiperf

    if any(f.name.startswith("run=") and f.suffix == ".json" for f in files):
        files = [f for f in files if f.name != "summary.json"]
    files = _one_guidellm_report(files)
    found = aiperf.artifact_dirs(folder)
    if found and found[0] == folder:
        files = [f for f in files if f.name not in aiperf.ARTIFACT_FILES]
    for sub in found:
        files.extend(aiperf.artifact_files(sub))
    return files


def _one_guidellm_report(files: list[Path]) -> list[Path]:
    """GuideLLM writes one report in several formats (``--output`` json, yaml, csv): the JSON,
    when it is GuideLLM's, stands for the others of the same name."""
    from kvpressure.ingestion import guidellm

    reports = [f for f in files if f.suffix == ".json" and table_format(f) == guidellm.FORMAT]
    stems = {f.stem for f in reports}
    return [f for f in files if not (f.stem in stems and f.suffix in (".yaml", ".yml", ".csv")
                                     and table_format(f) == guidellm.FORMAT)]


def read_bench_source(path: Path, run: str, notes: list[str], *,
                      columns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The runs rows of a ``bench`` source: a vllm bench serve result or a sweep table."""
    from kvpressure.ingestion.bench import read_bench

    fmt = table_format(path)
    if fmt is not None:
        return read_table(path, run, notes, columns=columns, fmt=fmt)
    if columns:
        notes.append(f"{path}: a vllm bench serve result: --columns applies to plain CSV "
                     "tables only and was not used")
    rows = read_bench(path, run, notes)
    report_unusable(rows, notes)
    return rows
