"""What a run folder measured, one row per concurrency level of the baseline curve.

A run folder is what ``kvpressure ingest``, ``kvpressure report --source`` or a sweep wrote:
``runs.csv`` (one row per measured point), optionally ``series.csv`` (the scraped metrics)
and ``ingest.json``. Besides the ``runs`` columns, a level gets, where the data has them:

* from its ``vllm bench serve`` result file (the row's ``source``): the medians
  (``median_ttft_ms``, ``median_itl_ms``) and, with ``--save-detailed``, the exact prompt and
  output lengths of every request;
* from the scraped series inside the level's window (``t_start``..``t_end``): the means of
  ``vllm:request_prefill_time_seconds`` and ``vllm:request_decode_time_seconds``, the number of
  engine steps and tokens per step from ``vllm:iteration_tokens_total``, and TTFT/ITL medians
  from their histograms when no bench file gives them;
* from a simulated sweep's point folder (``points/<variant>/c<C>/requests.csv``): the lengths;
* the client turnaround (``turnaround.py``): ``client_gap_mean_s`` from the bench result's
  start times and latencies, ``engine_gap_mean_s`` from the running and waiting gauges.

A value the data cannot give stays NaN; nothing is guessed here.

The levels are keyed by ``Measured.key``: ``concurrency`` for closed loops (``vllm bench serve
--max-concurrency C``), or ``request_rate`` for an open loop (``--request-rate R`` without a
client limit), whose requests' send times (``start_times``) are kept as arrivals. A folder with
both keeps the closed loops and says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvpressure.errors import InputError
from kvpressure.folders.layout import RUNS_CSV, SCRAPE_FILES
from kvpressure.folders.run_folder import RunFolder, as_run_folder
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.source_kind import SourceKind
from kvpressure.twin.lengths import LevelLengths, from_dataset_args, from_histograms
from kvpressure.twin.turnaround import client_gaps, engine_gap_s

# Columns of the levels table (seconds, tokens per second, counts).
LEVEL_COLUMNS = (
    "concurrency", "num_requests", "duration_s", "output_throughput", "total_token_throughput",
    "ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "itl_mean_s", "itl_p50_s", "itl_p95_s",
    "tpot_mean_s", "e2e_mean_s", "preemptions", "recomputed_tokens_low",
    "recomputed_tokens_high", "recompute_ratio_low", "recompute_ratio_high", "mean_running",
    "max_running", "mean_kv_usage", "prefill_time_mean_s", "decode_time_mean_s",
    "engine_steps", "tokens_per_step", "input_len_mean", "output_len_mean", "t_start", "t_end",
    "t_steady_start", "t_steady_end", "request_throughput", "mean_in_engine",
    "client_gap_mean_s", "engine_gap_mean_s", "request_rate",
)
OPEN_KEY = "request_rate"


@dataclass
class Measured:
    """The measured curve of one run folder."""

    run_dir: Path
    """The folder given (a collect folder's tables are in its ``report/``)."""
    levels: pd.DataFrame
    """One row per level, ``LEVEL_COLUMNS``, sorted by ``key``."""
    lengths: dict[Any, tuple[list[int], list[int]]]
    """Per level, the exact (prompt lengths, output lengths) of its requests, where known."""
    runs: pd.DataFrame
    """The baseline rows of ``runs.csv`` as read."""
    series: pd.DataFrame | None
    ingest: dict[str, Any]
    variant: str
    notes: list[str] = field(default_factory=list)
    key: str = "concurrency"
    """What tells the levels apart: ``concurrency`` (closed loops) or ``request_rate``."""
    arrivals: dict[Any, list[float]] = field(default_factory=dict)
    """Open loop: per level, each request's send time from the level's first (seconds), in
    the order of ``lengths``; burstiness per level in ``burstiness``."""
    burstiness: dict[Any, float] = field(default_factory=dict)
    bench_settings: dict[str, Any] = field(default_factory=dict)
    """Engine arguments a bench result records (``vllm bench serve --metadata
    max_num_seqs=64 ...``), from the first level's result that has any."""
    drawn_lengths: dict[Any, LevelLengths] = field(default_factory=dict)
    """Per level without per-request lengths, the lengths made from what the data has
    (``lengths.py``: dataset arguments, length histograms); a level in neither dict gets its
    mean lengths."""
    folder: RunFolder | None = field(default=None, repr=False)
    """The folder the tables were read from (``run_dir`` or its ``report/``), with what it
    read."""

    @property
    def open_loop(self) -> bool:
        return self.key == OPEN_KEY

    @property
    def keys(self) -> list[Any]:
        return [level_value(v, self.key) for v in self.levels[self.key]]

    def level(self, value: Any) -> pd.Series:
        rows = self.levels[self.levels[self.key] == value]
        if rows.empty:
            raise InputError(f"{level_name(value, self.key)}: not a measured level "
                             f"({', '.join(map(str, self.keys))})")
        return rows.iloc[0]


def level_value(value: Any, key: str) -> Any:
    """A level's identifier as the twin keys it: an int concurrency, a float request rate."""
    return float(value) if key == OPEN_KEY else int(value)


def level_name(value: Any, key: str) -> str:
    """``concurrency 8`` or ``request rate 3 req/s`` (for messages and reports)."""
    return (f"request rate {float(value):g} req/s" if key == OPEN_KEY
            else f"concurrency {int(value)}")


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def read_runs(run_dir: RunFolder | Path) -> pd.DataFrame:
    folder = as_run_folder(run_dir)
    path = folder.runs_path
    if not path.is_file():
        raise InputError(f"{folder.path}: no {RUNS_CSV} (a folder written by 'kvpressure "
                         "ingest', 'kvpressure report --source', 'kvpressure sweep' or "
                         "'kvpressure collect')")
    try:
        runs = folder.runs()
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV: {exc}") from None
    for col in ("concurrency", "output_throughput"):
        if col not in runs.columns:
            raise InputError(f"{path}: no column '{col}'")
    return runs


def read_series(run_dir: RunFolder | Path) -> pd.DataFrame | None:
    folder = as_run_folder(run_dir)
    path = folder.series_path
    if not path.is_file():
        return None
    try:
        series = folder.series_as(dtype={"labels": "string"}, keep_default_na=False,
                                  na_values={"value": ["NaN", "nan"], "t": ["NaN", "nan"]})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV: {exc}") from None
    missing = [c for c in ("t", "metric", "labels", "value") if c not in series.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    series["t"] = pd.to_numeric(series["t"], errors="coerce")
    series["value"] = pd.to_numeric(series["value"], errors="coerce")
    return series


def _bench_result(source: Any, run_dir: Path) -> dict[str, Any] | None:
    """The bench result object a runs row came from (``path#k + log`` in ``source``)."""
    from kvpressure.ingestion.bench import load_results

    if not isinstance(source, str) or not source:
        return None
    first = source.split(" + ")[0].strip()
    path_text, sep, k = first.rpartition("#")
    index = int(k) - 1 if sep and k.isdigit() else 0
    path = Path(path_text if sep and k.isdigit() else first)
    candidates = [path] if path.is_absolute() else [path, run_dir / path, run_dir / path.name]
    # A collect folder: bench/ and report/ side by side, the runs table in report/.
    candidates += [run_dir / "bench" / path.name, run_dir.parent / "bench" / path.name]
    for p in candidates:
        if p.is_file() and p.suffix in (".json", ".jsonl", ".gz"):
            try:
                results = load_results(p)
            except (InputError, OSError, UnicodeDecodeError):
                return None
            if index < len(results) and isinstance(results[index][1], dict):
                return results[index][1]
            return None
    return None


def _lens(res: dict[str, Any]) -> tuple[list[int], list[int], list[float] | None] | None:
    """The (prompt lengths, output lengths) of a result's successful requests in the order they
    were sent, and their send times from the first one's when the result lists them."""
    ins, outs = res.get("input_lens"), res.get("output_lens")
    if not (isinstance(ins, list) and isinstance(outs, list) and ins and len(ins) == len(outs)):
        return None
    errors = res.get("errors")
    ok = [not e for e in errors] if isinstance(errors, list) and len(errors) == len(ins) else (
        [True] * len(ins))
    # The twin hands requests to its clients in list order, so the list must be in the order
    # they were sent: kvpressure collect lists them as they finished, vllm bench serve as sent.
    starts = res.get("start_times")
    order = list(range(len(ins)))
    timed = (isinstance(starts, list) and len(starts) == len(ins)
             and all(isinstance(s, int | float) and math.isfinite(s) for s in starts))
    if timed:
        assert isinstance(starts, list)  # the check above, for the type checker
        order.sort(key=lambda k: starts[k])
    kept = [k for k in order
            if ok[k] and isinstance(ins[k], int | float) and isinstance(outs[k], int | float)
            and outs[k] >= 1]
    if not kept:
        return None
    sent = ([float(starts[k]) - float(starts[kept[0]]) for k in kept]
            if timed and isinstance(starts, list) else None)
    return [int(ins[k]) for k in kept], [int(outs[k]) for k in kept], sent


def _point_lengths(folder: RunFolder, variant: str, c: int
                   ) -> tuple[list[int], list[int]] | None:
    path = folder.point_dir(f"{variant}/c{c}") / "requests.csv"
    if not path.is_file():
        return None
    req = pd.read_csv(path, usecols=["prompt_len", "output_len"])
    return req["prompt_len"].astype(int).tolist(), req["output_len"].astype(int).tolist()


def data_folder(run_dir: Path) -> Path:
    """Where the tables are: ``run_dir`` itself, or its ``report/`` (a ``kvpressure collect``
    folder keeps engine.json, the scrape log and bench/ on top, the report below)."""
    if not RunFolder(run_dir).has_runs() and RunFolder(run_dir / "report").has_runs():
        return run_dir / "report"
    return run_dir


# The families a level's window statistics read from a whole scrape log.
_WINDOW_FAMILIES = ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                    "vllm:iteration_tokens_total", "vllm:cache_config_info",
                    "vllm:num_requests_running", "vllm:num_requests_waiting",
                    "vllm:request_prompt_tokens", "vllm:request_generation_tokens")


def scrape_log_series(run_dir: Path) -> pd.DataFrame | None:
    """The whole scrape log of a collect folder (``metrics.prom.jsonl``), when present: its
    report keeps only the focus level's window, the twin compares every level."""
    from kvpressure.ingestion.api import ingest

    for name in SCRAPE_FILES:
        path = run_dir / name
        if path.is_file():
            return ingest([path], run="log",
                          options=IngestOptions(metrics=list(_WINDOW_FAMILIES))).series
    return None


def _covers(series: pd.DataFrame | None, runs: pd.DataFrame) -> bool:
    """Whether ``series`` spans every level's window (a report folder keeps only the focus
    level's)."""
    if series is None or not len(series) or "t_start" not in runs or "t_end" not in runs:
        return series is not None and len(series) > 0
    t = series["t"].to_numpy(float)
    lo, hi = pd.to_numeric(runs["t_start"], errors="coerce"), pd.to_numeric(
        runs["t_end"], errors="coerce")
    return bool(np.nanmin(t) <= lo.min() + 1e-9 and np.nanmax(t) >= hi.max() - 1e-9)


def _report_sources(folder: RunFolder) -> list[Path]:
    """The files a report folder was collected from (``sources.json``), as they resolve
    from here or from the repository (the report names them relative to it)."""
    from kvpressure.paths import stored_path

    out = []
    for item in folder.sources():
        p = Path(item)
        found = next((c for c in (p, stored_path(p)) if c.is_file()), None)
        if found is not None:
            out.append(found)
    return out


def ingested_sources(run_dir: RunFolder | Path, ingest: dict[str, Any], kind: SourceKind
                     ) -> list[Path]:
    """The files of one ``kind`` (``prom_jsonl``, ``server_log``, ...) the run folder was made
    from: the sources ``ingest.json`` names, else a report's ``sources.json`` read by content."""
    from kvpressure.ingestion.sources import sniff_file

    found = [Path(s["location"]) for s in ingest.get("sources") or []
             if isinstance(s, dict) and s.get("kind") == kind
             and isinstance(s.get("location"), str)]
    if found:
        return found

    def kinds() -> list[tuple[Path, Any]]:
        out: list[tuple[Path, Any]] = []
        for p in _report_sources(folder):
            try:
                out.append((p, sniff_file(p)))
            except InputError:
                continue
        return out

    # Each source is sniffed once, whichever kinds are asked for (a scrape log, a server log).
    folder = as_run_folder(run_dir)
    return [p for p, got in folder.derived("sources by kind", kinds) if got == kind]


def ingested_scrape_log(run_dir: RunFolder | Path, ingest: dict[str, Any]
                        ) -> pd.DataFrame | None:
    """The scrape log the run folder was made from, read again whole for the levels'
    windows; None when there is not exactly one or it is gone."""
    from kvpressure.ingestion.api import ingest as read

    logs = ingested_sources(run_dir, ingest, SourceKind.PROM_JSONL)
    if len(logs) != 1 or not logs[0].is_file():
        return None
    return read([logs[0]], run="log",
                options=IngestOptions(metrics=list(_WINDOW_FAMILIES))).series


def _covering(frames: tuple[pd.DataFrame | None, ...], t0: float, t1: float
              ) -> pd.DataFrame | None:
    """The first frame of one run whose scrapes span ``[t0, t1]``."""
    for frame in frames:
        if frame is None or not len(frame) or math.isnan(t0) or math.isnan(t1) or t1 <= t0:
            continue
        if "run" in frame.columns and frame["run"].nunique() > 1:
            continue
        t = frame["t"].to_numpy(float)
        if np.nanmin(t) <= t0 + 1e-9 and np.nanmax(t) >= t1 - 1e-9:
            return frame
    return None


def drawn_level_lengths(res: dict[str, Any] | None, frames: tuple[pd.DataFrame | None, ...],
                        t0: float, t1: float, n: int, totals: tuple[float, float],
                        seed: int = 0) -> LevelLengths | None:
    """A level's lengths without per-request arrays, best first (``lengths.py``): dataset
    arguments whose draws add up to the measured totals, the window's length histograms, the
    dataset arguments as they are; None: only the means are known."""
    args = from_dataset_args(res, n, totals) if res is not None else None
    if args is not None and args[1]:
        return args[0]
    frame = _covering(frames, t0, t1)
    hist = from_histograms(frame, t0, t1, n, seed=seed) if frame is not None else None
    if hist is not None:
        return hist
    return args[0] if args is not None else None


def _window_stats(series: pd.DataFrame, t0: float, t1: float,
                  steady: tuple[float, float]) -> dict[str, float]:
    """Histogram means and step counts inside one level's window, when the series covers it;
    the requests in the engine (running + waiting) over its ``steady`` part."""
    from kvpressure.ingestion.counters import (
        gauge_mean,
        histogram_mean,
        histogram_quantile,
        window_increase,
    )

    t = series["t"].to_numpy(float)
    if not len(t) or np.nanmin(t) > t0 + 1e-9 or np.nanmax(t) < t1 - 1e-9:
        return {}  # a series cropped to another level's window says nothing about this one
    run = None
    if "run" in series.columns and series["run"].nunique() > 1:
        return {}  # several runs: which one holds this level is not known
    out = {
        "prefill_time_mean_s": histogram_mean(series, "vllm:request_prefill_time_seconds",
                                              t0, t1, run=run),
        "decode_time_mean_s": histogram_mean(series, "vllm:request_decode_time_seconds",
                                             t0, t1, run=run),
        "ttft_p50_s": histogram_quantile(series, "vllm:time_to_first_token_seconds", 0.5, t0, t1,
                                         run=run),
        "itl_p50_s": histogram_quantile(series, "vllm:inter_token_latency_seconds", 0.5, t0, t1,
                                        run=run),
    }
    steps = window_increase(series, "vllm:iteration_tokens_total_count", t0, t1, run=run)
    tokens = window_increase(series, "vllm:iteration_tokens_total_sum", t0, t1, run=run)
    out["engine_steps"] = steps
    out["tokens_per_step"] = tokens / steps if steps and steps > 0 else math.nan
    g0, g1 = steady
    out["mean_in_engine"] = (gauge_mean(series, "vllm:num_requests_running", g0, g1, run=run)
                             + gauge_mean(series, "vllm:num_requests_waiting", g0, g1, run=run))
    return out


def load_measured(run_dir: RunFolder | str | os.PathLike[str], variant: str | None = None
                  ) -> Measured:
    """The baseline curve of ``run_dir`` (or of ``variant``), one row per concurrency level;
    several rows of one level (repeats) are averaged. A :class:`RunFolder` given is read
    through, so what it already read is not read again."""
    from kvpressure.analysis.levels import base_repeat

    given = as_run_folder(run_dir)
    top = given.path
    if not top.is_dir():
        raise InputError(f"{top}: not a folder")
    run_dir = data_folder(top)
    folder = given if run_dir == top else RunFolder(run_dir)
    runs = read_runs(folder)
    notes: list[str] = []
    if "variant" in runs.columns:
        variants = [str(v) for v in pd.unique(runs["variant"].fillna("baseline"))]
        chosen = variant or ("baseline" if "baseline" in variants else variants[0])
        if chosen not in variants:
            raise InputError(f"{folder.runs_path}: no variant {chosen!r} "
                             f"(present: {', '.join(variants)})")
        runs = runs[runs["variant"].fillna("baseline").astype(str) == chosen]
        if len(variants) > 1:
            notes.append(f"runs.csv holds variants {', '.join(variants)}; the twin is built on "
                         f"{chosen!r}")
    else:
        chosen = variant or "baseline"
    runs = runs.copy()
    runs["concurrency"] = pd.to_numeric(runs["concurrency"], errors="coerce")
    rate = pd.to_numeric(runs[OPEN_KEY], errors="coerce") if OPEN_KEY in runs else (
        pd.Series(math.nan, index=runs.index))
    runs[OPEN_KEY] = rate
    key = "concurrency"
    if runs["concurrency"].isna().all() and rate.notna().any():
        key = OPEN_KEY
    without = int(runs[key].isna().sum())
    if without:
        notes.append(
            f"{without} run(s) without a concurrency level left out (the twin replays the "
            "closed loops; a folder of open loops alone is replayed at their request rates)"
            if key == "concurrency" else
            f"{without} run(s) without a request rate left out (the twin replays an open "
            "loop at the measured rates)")
    runs = runs.dropna(subset=[key]).reset_index(drop=True)
    capped = runs[np.isfinite(runs[OPEN_KEY].to_numpy(float))] if key == "concurrency" else (
        runs.iloc[0:0])
    if len(capped):
        first = capped.iloc[0]
        raise InputError(
            f"{folder.runs_path}: {len(capped)} run(s) both capped at a concurrency and sent "
            f"at a finite request rate (e.g. concurrency {first['concurrency']:g} at "
            f"{first[OPEN_KEY]:g} req/s, {first.get('source', first.get('run'))}): the twin "
            "replays closed loops (vllm bench serve --max-concurrency C --request-rate inf) or "
            "open loops (--request-rate R without --max-concurrency), not a mix, whose sends "
            "wait on the real server's finishes; measure one of those")
    series = read_series(folder)
    ingest = folder.ingest()
    full_log = scrape_log_series(top) if top != run_dir else None
    if full_log is None and not _covers(series, runs):
        full_log = ingested_scrape_log(folder, ingest)
    rows: list[dict[str, Any]] = []
    lengths: dict[Any, tuple[list[int], list[int]]] = {}
    arrivals: dict[Any, list[float]] = {}
    burstiness: dict[Any, float] = {}
    drawn: dict[Any, LevelLengths] = {}
    recorded: dict[str, Any] = {}
    base = base_repeat(runs)
    for c, group in runs.groupby(key, sort=True):
        c_int = level_value(c, key)
        row: dict[str, Any] = {}
        for col in LEVEL_COLUMNS:
            vals = pd.to_numeric(group[col], errors="coerce") if col in group.columns else None
            row[col] = float(vals.mean()) if vals is not None and vals.notna().any() else math.nan
        row[key] = c_int
        first = base[base[key] == c]
        first = first.iloc[0] if len(first) else group.iloc[0]
        res = _bench_result(first.get("source"), run_dir)
        if res is not None:
            if not recorded:
                from kvpressure.twin.settings import ALIASES, SETTING_NAMES

                recorded.update({k: v for k, v in res.items()
                                 if ALIASES.get(k, k) in SETTING_NAMES and v not in (None, "")})
            for col, field_name in (("ttft_p50_s", "median_ttft_ms"),
                                    ("itl_p50_s", "median_itl_ms")):
                v = _num(res.get(field_name))
                if not math.isnan(v):
                    row[col] = v / 1000.0
            got = _lens(res)
            if got is not None:
                lengths[c_int] = got[:2]
                if got[2] is not None:
                    arrivals[c_int] = got[2]
            if key == OPEN_KEY:
                b = _num(res.get("burstiness"))
                burstiness[c_int] = b if b > 0 else 1.0
            starts, lats = res.get("start_times"), res.get("latencies")
            gaps: Any = (client_gaps(starts, lats, c_int)
                    if key == "concurrency" and isinstance(starts, list)
                    and isinstance(lats, list) else [])
            if len(gaps):
                row["client_gap_mean_s"] = float(np.mean(gaps))
        if c_int not in lengths and key == "concurrency":
            point = _point_lengths(folder, chosen, c_int)
            if point is not None:
                lengths[c_int] = point
        t0, t1 = _num(row.get("t_start")), _num(row.get("t_end"))
        steady = (_num(row.get("t_steady_start")), _num(row.get("t_steady_end")))
        if not (steady[1] > steady[0]):
            steady = (t0, t1)
        for frame in (series, full_log):
            if frame is None or math.isnan(t0) or math.isnan(t1) or t1 <= t0:
                continue
            for stat, value in _window_stats(frame, t0, t1, steady).items():
                if math.isnan(_num(row.get(stat))) and not math.isnan(value):
                    row[stat] = value
        row["engine_gap_mean_s"] = (engine_gap_s(row["mean_in_engine"], c_int,
                                                 row["request_throughput"])
                                    if key == "concurrency" else math.nan)
        duration, n = row["duration_s"], row["num_requests"]
        if c_int in lengths:
            ins, outs = lengths[c_int]
            row["input_len_mean"], row["output_len_mean"] = float(np.mean(ins)), float(
                np.mean(outs))
        elif duration > 0 and n > 0:
            out_tok = row["output_throughput"] * duration
            row["output_len_mean"] = out_tok / n
            row["input_len_mean"] = (row["total_token_throughput"] * duration - out_tok) / n
            totals = (_num((res or {}).get("total_input_tokens")),
                      _num((res or {}).get("total_output_tokens")))
            if math.isnan(totals[0]) or math.isnan(totals[1]):
                totals = (row["input_len_mean"] * n, row["output_len_mean"] * n)
            got_drawn = drawn_level_lengths(res, (series, full_log), t0, t1, int(round(n)),
                                            totals)
            if got_drawn is not None:
                drawn[c_int] = got_drawn
        rows.append(row)
    levels = pd.DataFrame(rows, columns=list(LEVEL_COLUMNS))
    return Measured(top, levels, lengths, runs, series, ingest, chosen, notes, key, arrivals,
                    burstiness, recorded, drawn, folder)
