"""``kvpressure knee RUNS.csv [--x concurrency] [--y output_throughput] [--group variant]``.

Prints one JSON object per group (interfaces.md section 6). ``RUNS`` is a runs table (CSV) or a
folder of ``vllm bench serve --save-result`` JSON files.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from kvpressure.errors import InputError

# vllm bench serve names the concurrency limit ``max_concurrency``; runs.csv says ``concurrency``.
BENCH_ALIASES = {"concurrency": "max_concurrency"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUNS", help="runs.csv, or a folder of vllm bench JSONs")
    parser.add_argument("--x", default="concurrency", help="x column (default: concurrency)")
    parser.add_argument("--y", default="output_throughput", help="y column (default: output_throughput)")
    parser.add_argument("--group", default=None,
                        help="column that splits curves (default: variant, when the table has "
                             "one; 'none' for a single curve)")
    parser.add_argument("--plateau-tol", type=float, default=0.05,
                        help="plateau: levels within this fraction of the peak (default 0.05)")


def _read_bench_folder(folder: Path) -> pd.DataFrame:
    """Every ``*.json`` of the folder through ingestion's bench reader (one runs row each)."""
    from kvpressure.ingestion.bench import read_bench

    files = sorted(folder.glob("*.json"))
    if not files:
        raise InputError(f"{folder}: no vllm bench result JSON files (*.json) in the folder")
    rows: list[dict] = []
    notes: list[str] = []
    for f in files:
        rows.extend(read_bench(f, f.stem, notes))
    return pd.DataFrame(rows)


def load_curve_table(path: str | Path) -> pd.DataFrame:
    """A runs CSV or a folder of bench JSONs as a frame."""
    p = Path(path)
    if p.is_dir():
        return _read_bench_folder(p)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    try:
        return pd.read_csv(p)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a readable CSV ({exc})") from exc
    except pd.errors.EmptyDataError as exc:
        raise InputError(f"{p}: empty file") from exc


def knee_table(
    frame: pd.DataFrame, x: str, y: str, group: str | None, source: str, plateau_tol: float = 0.05
) -> list[dict]:
    """One knee summary per group of ``frame``."""
    from kvpressure.analysis.knee import find_knee

    for col in (x, y) + ((group,) if group else ()):
        if col not in frame.columns:
            alias = BENCH_ALIASES.get(col)
            if alias and alias in frame.columns:
                frame = frame.assign(**{col: frame[alias]})
                continue
            raise InputError(f"{source}: missing column '{col}'")
    out = []
    groups = frame.groupby(group, sort=True, dropna=False) if group else [(None, frame)]
    for key, part in groups:
        xs = pd.to_numeric(part[x], errors="coerce")
        ys = pd.to_numeric(part[y], errors="coerce")
        ok = xs.notna() & ys.notna()
        if not ok.any():
            raise InputError(f"{source}: no numeric ({x}, {y}) values"
                             + (f" in group {group}={key}" if group else ""))
        res = find_knee(xs[ok].to_numpy(), ys[ok].to_numpy(), plateau_tol=plateau_tol)
        g = key if not (isinstance(key, float) and math.isnan(key)) else None
        if hasattr(g, "item"):
            g = g.item()
        out.append(res.summary(g))
    return out


def run(args: argparse.Namespace) -> int:
    frame = load_curve_table(args.runs)
    # Curves of different variants (or servers) pooled into one would be no curve at all.
    group = args.group or ("variant" if "variant" in frame.columns else None)
    if group == "none":
        group = None
    for obj in knee_table(frame, args.x, args.y, group, str(args.runs), args.plateau_tol):
        print(json.dumps(obj, sort_keys=False))
    return 0
