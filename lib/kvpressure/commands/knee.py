"""``kvpressure knee RUNS [--x concurrency] [--y output_throughput] [--group variant]``.

Prints one JSON object per group on stdout (docs/interfaces.md#knee-json) and, on stderr, what the
curve left out, the notes and the noise the plateau band used. ``RUNS`` is a runs table (CSV,
its columns mapped with ``--columns`` when they have other names), a folder of ``vllm bench
serve`` results, or another tool's sweep: ``vllm bench sweep`` results, a GuideLLM report or
AIPerf exports.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.errors import InputError, nearest
from kvpressure.ingestion.source_kind import SourceKind

# vllm bench serve names the concurrency limit ``max_concurrency``; runs.csv says ``concurrency``.
BENCH_ALIASES = {"concurrency": "max_concurrency"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Prints one JSON object per curve on stdout; on stderr, the rows left out of the curve "
        "and why (a level such as 'off', an inf request rate, no throughput), the noise the "
        "plateau band used and the notes. Fewer than 3 levels give no knee (knee_x null). A y "
        "named like a latency or a per-user rate is refused. The report's knee stage calls the "
        "same function.")
    parser.add_argument(
        "runs", metavar="RUNS",
        help="runs.csv (or any CSV of runs, with --columns), a folder of vllm bench serve "
        "results, a vllm bench sweep summary.csv/summary.json, a GuideLLM "
        "benchmarks.json/.yaml/.csv, AIPerf profile_export_aiperf.json/.csv (or their folder)")
    parser.add_argument("--x", default="concurrency", help="x column (default: concurrency)")
    parser.add_argument("--y", default="output_throughput",
                        help="y column, a throughput (default: output_throughput)")
    parser.add_argument("--group", default=None,
                        help="column that splits curves (default: variant, when the table has "
                             "one; 'none' for a single curve)")
    parser.add_argument("--plateau-tol", type=float, default=0.05,
                        help="plateau: levels within this fraction of the peak (default 0.05)")
    parser.add_argument(
        "--columns", metavar="RUNS_COLUMN=COLUMN,...",
        help="a CSV whose columns have other names: map them onto the runs columns, e.g. "
        "concurrency=conc,output_throughput=tok_s (ttft_p95_s=ttft95:ms gives a unit)")


def _say(message: str) -> None:
    print(f"kvpressure knee: {message}", file=sys.stderr)


def load_curve_table(path: str | Path, columns: str | None = None,
                     notes: list[str] | None = None) -> pd.DataFrame:
    """A runs table from a CSV, a folder of bench results or another tool's sweep."""
    from kvpressure.ingestion.bench_tables import parse_columns, read_bench_source, table_format
    from kvpressure.ingestion.sources import detect

    notes = [] if notes is None else notes
    mapping = parse_columns(columns)
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    fmt = table_format(p) if p.is_file() else None
    if p.is_file() and fmt == "runs_csv" and not mapping:
        # A runs table keeps every column: --x/--y/--group may name any of them.
        try:
            return pd.read_csv(p)
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise InputError(f"{p}: not a readable CSV ({exc})") from exc
    if p.is_dir():
        from kvpressure.ingestion.sources import sniff_file

        # A result that does not parse is a broken sweep, not a file to skip.
        for f in sorted(p.glob("*.json")):
            if sniff_file(f) == SourceKind.JSON_BROKEN:
                raise InputError(f"{f}: JSON that does not parse")
    rows: list[dict] = []
    for src in detect(p):
        notes.extend(src.notes)
        if src.kind == SourceKind.AIPERF_METRICS:
            continue  # the server metrics AIPerf recorded beside its exports: not the curve
        if src.kind != SourceKind.BENCH:
            raise InputError(f"{src.location}: a {src.kind} source, not a table of runs; "
                             "kvpressure ingest turns scrapes into runs.csv")
        rows.extend(read_bench_source(Path(src.location), Path(src.location).stem, notes,
                                      columns=mapping))
    if not rows:
        raise InputError(f"{p}: no runs in it")
    return pd.DataFrame(rows)


def knee_table(
    frame: pd.DataFrame, x: str, y: str, group: str | None, source: str,
    plateau_tol: float = 0.05, say: Callable[[str], None] | None = None,
) -> list[dict]:
    """One knee summary per group of ``frame``; notes and noise handed to ``say``."""
    from kvpressure.analysis.knee import knee_of_runs, knee_summary

    for col in (x, y) + ((group,) if group else ()):
        if col not in frame.columns:
            alias = BENCH_ALIASES.get(col)
            if alias and alias in frame.columns:
                frame = frame.assign(**{col: frame[alias]})
                continue
            raise InputError(f"{source}: missing column '{col}'")
    ys = pd.to_numeric(frame[y], errors="coerce")
    if (ys < 0).any():  # a throughput is never negative: a sign lost or a column mixed up
        row = int((ys < 0).to_numpy().argmax())
        raise InputError(f"{source}: row {row + 1}: {y} is {frame[y].iloc[row]}; a throughput "
                         "is never negative")
    out = []
    groups = frame.groupby(group, sort=True, dropna=False) if group else [(None, frame)]
    for key, part in groups:
        where = source + (f" ({group}={key})" if group else "")
        res = knee_of_runs(part, x, y, plateau_tol=plateau_tol, where=where)
        g: Any = key if not (isinstance(key, float) and math.isnan(key)) else None
        if hasattr(g, "item"):
            g = g.item()
        if say is not None:
            label = f"{group}={g}: " if group else ""
            noise = ("none" if res.noise_sd is None else f"{res.noise_sd:.4g} {y} per level")
            say(f"{label}noise {noise} ({res.noise_source}); plateau band "
                f"{res.plateau_band:.4g}; knee {res.method or 'found'}")
            for note in res.notes:
                say(f"{label}note: {note}")
        out.append(knee_summary(res, g))
    return out


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    frame = load_curve_table(args.runs, args.columns, notes)
    for note in notes:
        _say(f"note: {note}")
    # Curves of different variants (or servers) pooled into one would be no curve at all.
    group = args.group or ("variant" if "variant" in frame.columns else None)
    if group == "none":
        group = None
    if not 0 <= args.plateau_tol < 1:  # nan fails this too
        raise InputError(f"--plateau-tol: must be a fraction in [0, 1), got {args.plateau_tol}")
    for option, column in (("--x", args.x), ("--y", args.y), ("--group", group)):
        if column is not None and column not in frame.columns:
            guess = nearest(column, frame.columns)
            raise InputError(f"{option} {column}: no such column in {args.runs}" + (
                f"; did you mean {guess!r}?" if guess else
                f"; columns: {', '.join(map(str, frame.columns))}"))
    for obj in knee_table(frame, args.x, args.y, group, str(args.runs), args.plateau_tol,
                          say=_say):
        print(json.dumps(obj, sort_keys=False))
    return 0
