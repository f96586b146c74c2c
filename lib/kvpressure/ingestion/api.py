"""``ingest()``: real metrics into the canonical ``series`` and ``runs`` tables.

```python
from kvpressure.ingestion.api import ingest
result = ingest(["metrics.prom.jsonl", "bench.json"], run="c64")
result.series   # run, t, metric, labels, value
result.runs     # one row per measured point
result.report   # what was read and recognised (an IngestReport: ingest.json)
result.write("out/")
```
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from kvpressure.errors import InputError, nearest
from kvpressure.ingestion import names
from kvpressure.ingestion.bench_tables import parse_columns, read_bench_source
from kvpressure.ingestion.engine_facts import EngineFacts
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.ingest_report import IngestReport
from kvpressure.ingestion.load_window import steady_part
from kvpressure.ingestion.prom_api import fetch_live, read_query_range_file, scrape_exporter
from kvpressure.ingestion.prom_text import RunSamples, add_scrape
from kvpressure.ingestion.recompute_estimate import check_scheduler_args
from kvpressure.ingestion.scrape_runs import RUNS_COLUMNS, SCRAPE_COLUMNS, scrape_row
from kvpressure.ingestion.series_presence import as_warnings, presence_notes
from kvpressure.ingestion.server_log import read_server_log
from kvpressure.ingestion.source_kind import NEED_SAMPLES, SCRAPED, SourceKind
from kvpressure.ingestion.sources import (
    Source,
    detect,
    iter_dir_dumps,
    iter_jsonl,
    parse_time,
    read_text,
    time_from_name,
)
from kvpressure.jsonable import finite_or_none

SERIES_COLUMNS = ["run", "t", "metric", "labels", "value"]
_SUFFIXES = (".gz", ".jsonl", ".json", ".prom", ".txt", ".metrics", ".log")


@dataclass
class IngestResult:
    series: pd.DataFrame
    runs: pd.DataFrame
    report: IngestReport = field(default_factory=IngestReport)

    def write(self, out_dir: str | Path) -> list[Path]:
        """``series.csv`` (when any series), ``runs.csv`` (when any run), ``ingest.json``;
        the same tables as Parquet when pyarrow is importable."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        from kvpressure.table_files import write_table

        written = []
        for name, frame in (("series", self.series), ("runs", self.runs)):
            if not frame.empty:
                written.extend(write_table(frame, out / f"{name}.csv"))
        path = out / "ingest.json"
        path.write_text(json.dumps(self.report.to_dict(), indent=2) + "\n", encoding="utf-8")
        written.append(path)
        return written


def default_run_name(location: str) -> str:
    """``.../heavy.metrics.prom.jsonl.gz`` -> ``heavy``; a URL -> its host."""
    if "://" in location:
        return location.split("://", 1)[1].split("/", 1)[0].replace(":", "_")
    name = Path(location.rstrip("/")).name
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    for tail in (".metrics", ".prom"):
        if name.endswith(tail):
            name = name[: -len(tail)]
    return name or "run"


def _families_filter(metrics: str | Sequence[str] | None) -> frozenset[str] | None:
    """``None``/"all" -> everything; "core" -> the families the analysis reads; else names."""
    if metrics is None or metrics == "all":
        return None
    if isinstance(metrics, str):
        if metrics == "core":
            wanted: Iterable[str] = names.ANALYSIS_FAMILIES
        else:
            wanted = [m.strip() for m in metrics.split(",") if m.strip()]
    else:
        wanted = metrics
    known = {names.canonical_name(f).family for f in (
        *names.V1_COUNTERS, *names.V1_GAUGES, *names.V1_HISTOGRAMS, *names.V0_ONLY,
        *names.RENAMED)}
    out = set()
    for m in wanted:
        info = names.canonical_name(m)
        if info.family not in known and info.family.startswith(names.PREFIX):
            # A misspelt name would keep nothing of that family, silently.
            guess = nearest(info.family, known)
            raise InputError(f"--metrics {m!r}: not a vLLM metric"
                             + (f"; did you mean {guess!r}?" if guess else ""))
        out.add(info.family)
    return frozenset(out)


def _expected_missing(acc: RunSamples) -> list[str]:
    present = {s.family for s in acc.series}
    wanted: tuple[str, ...] = names.CORE_FAMILIES + ("vllm:cache_config_info",)
    if acc.families is not None:
        wanted = tuple(f for f in wanted if f in acc.families)
    out = []
    for fam in wanted:
        if fam in present:
            continue
        if fam in names.V1_COUNTERS:
            out.append(fam + "_total")
        else:
            out.append(fam)
    return out


def _distinct_times(frame: pd.DataFrame) -> np.ndarray:
    """The sorted distinct timestamps (the frame is sorted by time)."""
    t = frame["t"].to_numpy()
    if len(t) == 0:
        return t
    keep = np.empty(len(t), dtype=bool)
    keep[0] = True
    np.not_equal(t[1:], t[:-1], out=keep[1:])
    return t[keep]


def _decide_origin(acc: RunSamples, times: np.ndarray, requested: str) -> dict[str, Any]:
    """Whether counters started at 0 with the log (``zero``) or earlier (``first``)."""
    if requested in ("zero", "first"):
        return {"origin": requested, "why": "given"}
    if requested != "auto":
        raise InputError(f"counter_origin: expected auto, zero or first, got {requested!r}")
    if len(times) == 0:
        return {"origin": "first", "why": "no samples"}
    if len(times) == 1:
        # Counted from the only scrape every total would be 0: a dump says what the server
        # did since it started (the stage windows read one dump the same way).
        return {"origin": "zero", "why": "a single scrape: its counters are the totals since "
                "the server started"}
    created = [v for v in acc.created.values() if not math.isnan(v)]
    interval = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    if created:
        c = min(created)
        tolerance = max(2 * interval, 5.0)
        if abs(times[0] - c) <= tolerance:
            return {
                "origin": "zero",
                "why": f"the counters were created at {c} and the first scrape is at "
                f"{times[0]} (within {tolerance:g} s): the log starts with the process, "
                "counts before the first scrape are included",
            }
        return {
            "origin": "first",
            "why": f"the counters were created at {c}, long before the first scrape at "
            f"{times[0]}: increases are counted from the first scrape",
        }
    return {
        "origin": "first",
        "why": "no _created samples to tell when counting began: increases are counted from "
        "the first scrape (pass counter_origin='zero' if the log starts with the server)",
    }


def bench_tzinfo(zone: str | None) -> _dt.tzinfo | None:
    """The time zone ``vllm bench serve`` wrote its ``date`` in: None/"local" (this machine's),
    "UTC", an offset such as "+08:00" / "-0500", or an IANA name such as "Asia/Shanghai"."""
    if zone is None or str(zone).strip().lower() in ("", "local"):
        return None
    text = str(zone).strip()
    if text.upper() in ("UTC", "Z", "GMT"):
        return _dt.UTC
    m = re.fullmatch(r"(?:UTC)?([+-])(\d{1,2}):?(\d{2})?", text, re.IGNORECASE)
    if m:
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 14 or minutes >= 60:
            raise InputError(f"bench_timezone {zone!r}: offset out of range")
        sign = 1 if m.group(1) == "+" else -1
        return _dt.timezone(sign * _dt.timedelta(hours=hours, minutes=minutes))
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(text)
    except Exception:  # unknown name, or no time-zone database on this machine
        raise InputError(
            f"bench_timezone {zone!r}: not a time zone; give 'local', 'UTC', an offset such as "
            "'+08:00', or an IANA name such as 'Asia/Shanghai'"
        ) from None


def bench_window(row: dict[str, Any], tz: _dt.tzinfo | None = None) -> tuple[float, float] | None:
    """Unix-time window of a bench run: vLLM stamps ``date`` (local time, whole seconds) when it
    ends, so the run spans ``[date - duration, date + 1)`` at most. A result of ``kvpressure
    collect`` carries its exact span (``window_start``/``window_end``, unix seconds)."""
    start, stop = row.get("window_start"), row.get("window_end")
    if isinstance(start, float) and isinstance(stop, float):
        return start, stop
    date, duration = row.get("date"), row.get("duration_s")
    if not isinstance(date, str) or not isinstance(duration, float) or math.isnan(duration):
        return None
    try:
        naive = _dt.datetime.strptime(date, "%Y%m%d-%H%M%S")
    except ValueError:
        return None
    end = naive.timestamp() if tz is None else naive.replace(tzinfo=tz).timestamp()
    return end - duration, end + 1.0


def _concat_series(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame(
            {
                "run": pd.Series(dtype="category"),
                "t": pd.Series(dtype=float),
                "metric": pd.Series(dtype="category"),
                "labels": pd.Series(dtype="category"),
                "value": pd.Series(dtype=float),
            }
        )
    if len(frames) == 1:
        return frames[0]
    cols = {}
    for col in ("run", "metric", "labels"):
        cols[col] = union_categoricals([f[col] for f in frames], sort_categories=True)
    for col in ("t", "value"):
        cols[col] = np.concatenate([f[col].to_numpy() for f in frames])
    return pd.DataFrame(cols)[SERIES_COLUMNS]


def ingest(
    sources: Sequence[str | Path] | str | Path,
    run: str | None = None,
    *,
    options: IngestOptions | None = None,
    engine: EngineFacts | None = None,
) -> IngestResult:
    """Read every SOURCE into the canonical tables.

    ``run`` names the run all sources belong to (default: one run per source, named after
    it). ``options`` say how the sources are read (:class:`IngestOptions`: a live server's time
    range, the metrics kept, the counters' origin, time zones, a CSV's columns, a log's year).
    ``engine`` holds what the server ran with (:class:`EngineFacts`): ``num_gpu_blocks``/
    ``block_size``/``enable_prefix_caching`` stand in for ``vllm:cache_config_info`` in the
    recompute estimate; ``scheduling_policy`` ("fcfs", "priority") and
    ``scheduler_reserve_full_isl`` (not exported; None = unknown) narrow it.
    """
    opts = options if options is not None else IngestOptions()
    facts = engine if engine is not None else EngineFacts()
    if isinstance(sources, str | Path):
        sources = [sources]
    if not sources:
        raise InputError("ingest: no SOURCE given")
    step = opts.step
    if step is not None and (not isinstance(step, int | float) or not step > 0):
        raise InputError(f"--step must be a positive number of seconds, got {step!r}")
    check_scheduler_args(facts.scheduling_policy, facts.scheduler_reserve_full_isl)
    reading = _Reading(_families_filter(opts.metrics), opts.keep_created)
    tz = bench_tzinfo(opts.bench_timezone)
    mapping = parse_columns(opts.columns)
    try:
        # A server and the client that loaded it usually share a zone: without its own, a
        # log is read in the bench results' zone.
        log_tz = bench_tzinfo(opts.log_timezone) if opts.log_timezone is not None else tz
    except InputError as exc:
        raise InputError(str(exc).replace("bench_timezone", "log timezone", 1)) from None
    report = IngestReport(options=_options_echo(run, opts, facts, mapping))
    for location in sources:
        for src in detect(location):
            _read_source(src, run or default_run_name(src.location), reading, report, opts,
                         mapping, log_tz)
    frames, scrape_rows = _close_runs(reading, report, opts, facts)
    if run is None:
        _match_scrape_log(reading.bench_rows, scrape_rows, tz, report.warnings)
    runs_rows = _merge_runs(reading.bench_rows, scrape_rows, frames, reading.accs,
                            report.warnings, tz, facts)
    series = _concat_series(frames)
    runs = pd.DataFrame(runs_rows, columns=RUNS_COLUMNS) if runs_rows else pd.DataFrame(
        columns=RUNS_COLUMNS
    )
    report.tables = {"series_rows": int(len(series)), "runs_rows": int(len(runs))}
    return IngestResult(series=series, runs=runs, report=report)


def _options_echo(run: str | None, opts: IngestOptions, facts: EngineFacts,
                  mapping: dict[str, Any]) -> dict[str, Any]:
    """What ``ingest.json`` says the sources were read with (its keys predate the objects)."""
    metrics = opts.metrics
    return {
        "run": run,
        "metrics": metrics if isinstance(metrics, str | None) else list(metrics),
        "counter_origin": opts.counter_origin,
        "keep_created": opts.keep_created,
        "start": opts.start,
        "end": opts.end,
        "step": opts.step,
        "bench_timezone": opts.bench_timezone,
        "columns": mapping or None,
        "log_year": opts.log_year,
        "log_timezone": opts.log_timezone,
        "policy": facts.scheduling_policy,
        "scheduler_reserve_full_isl": facts.scheduler_reserve_full_isl,
    }


@dataclass
class _Reading:
    """What the sources gave, run by run, before the runs are closed."""

    families: frozenset[str] | None
    keep_created: bool
    accs: dict[str, RunSamples] = field(default_factory=dict)
    acc_sources: dict[str, list[str]] = field(default_factory=dict)
    scraped: set[str] = field(default_factory=set)  # runs read from /metrics text
    bench_rows: list[dict[str, Any]] = field(default_factory=list)
    server_logs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def acc_for(self, name: str, location: str) -> RunSamples:
        if name not in self.accs:
            self.accs[name] = RunSamples(name, families=self.families,
                                         keep_created=self.keep_created)
        self.acc_sources.setdefault(name, []).append(location)
        return self.accs[name]


def _read_source(src: Source, name: str, reading: _Reading, report: IngestReport,
                 opts: IngestOptions, mapping: dict[str, Any], log_tz: _dt.tzinfo | None) -> None:
    """One source into its run's samples (or bench rows), and its entry in the report."""
    warnings = report.warnings
    entry: dict[str, Any] = {"location": src.location, "kind": src.kind, "run": name}
    warnings.extend(src.notes)
    if src.kind == SourceKind.BENCH:
        notes: list[str] = []
        rows = read_bench_source(Path(src.location), name, notes, columns=mapping)
        reading.bench_rows.extend(rows)
        warnings.extend(notes)
        entry["bench_runs"] = len(rows)
    elif src.kind == SourceKind.SERVER_LOG:
        acc = reading.acc_for(name, src.location)
        log = read_server_log(Path(src.location), acc, warnings, year=opts.log_year, tz=log_tz)
        reading.server_logs[name] = log
        entry["stats_lines"] = log["stats_lines"]
    else:
        acc = reading.acc_for(name, src.location)
        if src.kind in SCRAPED:
            reading.scraped.add(name)
        _read_prom(src, acc, entry, report, opts)
    report.sources.append(entry)


def _close_runs(reading: _Reading, report: IngestReport, opts: IngestOptions,
                facts: EngineFacts) -> tuple[list[pd.DataFrame], dict[str, dict[str, Any]]]:
    """Each run's series frame and scrape row, its entry in the report written."""
    warnings = report.warnings
    frames: list[pd.DataFrame] = []
    scrape_rows: dict[str, dict[str, Any]] = {}
    for name, acc in reading.accs.items():
        frame, label_info = acc.frame(drop_single_target_labels=opts.drop_target_labels)
        times = _distinct_times(frame)
        origin = _decide_origin(acc, times, opts.counter_origin)
        info = _run_report(acc, frame, times, label_info, origin)
        if name in reading.scraped and name not in reading.server_logs and not any(
                str(f).startswith((names.PREFIX, names.ESCAPED_PREFIX)) for f in acc.seen_families):
            # Python's or the process's own metrics alone: not a vLLM server's /metrics, and
            # a run of nothing but missing values would read as an idle server.
            declared = acc.missing_families()
            raise InputError(
                f"{', '.join(reading.acc_sources.get(name, [name]))}: no sample of a vLLM metric "
                "in it"
                + (f": {len(declared)} metric families are declared (# TYPE) without a single "
                   "sample, so nothing was measured; scrape the server while it serves"
                   if declared else " (vllm:...); is it a vLLM server's /metrics?"))
        presence = presence_notes(frame, times, name)
        if presence:
            info["series_presence"] = presence
            warnings.extend(as_warnings(presence, name))
        if name in reading.server_logs:
            info["server_log"] = reading.server_logs[name]
        if acc.stats.duplicate_samples:
            warnings.append(
                f"run {name}: {acc.stats.duplicate_samples} sample(s) repeated a series at a "
                "timestamp already read; the last one read is kept"
            )
        if acc.stats.explicit_timestamps:
            info["explicit_timestamps"] = acc.stats.explicit_timestamps
        if len(frame):
            row, estimate = scrape_row(
                frame,
                name,
                origin=origin["origin"],
                source=" + ".join(reading.acc_sources.get(name, [])),
                engine=facts,
            )
            scrape_rows[name] = row
            info["recompute_estimate"] = estimate
        report.runs[name] = info
        frames.append(frame)
    return frames, scrape_rows


def _read_prom(
    src: Source,
    acc: RunSamples,
    entry: dict[str, Any],
    report: IngestReport,
    opts: IngestOptions,
) -> None:
    warnings = report.warnings
    start, end, step, timeout = opts.start, opts.end, opts.step, opts.timeout
    before_samples = acc.n_samples
    before_scrapes = acc.stats.scrapes
    before_lines = acc.stats.sample_lines
    declared_before = len(acc.declared)
    if src.kind == SourceKind.PROM_JSONL:
        for scrape in iter_jsonl(Path(src.location), warnings):
            if math.isnan(scrape.t):
                continue
            add_scrape(acc, scrape.t, scrape.text, scrape.where, warnings)
    elif src.kind == SourceKind.PROM_DIR:
        for scrape in iter_dir_dumps(src, warnings):
            add_scrape(acc, scrape.t, scrape.text, scrape.where, warnings)
    elif src.kind == SourceKind.PROM_TEXT:
        path = Path(src.location)
        t = time_from_name(path.name)
        if t is None:
            t = path.stat().st_mtime
            entry["time_from"] = "file modification time"
        add_scrape(acc, t, read_text(path), str(path), warnings)
    elif src.kind == SourceKind.AIPERF_METRICS:
        from kvpressure.ingestion.aiperf_metrics import read_server_metrics

        read_server_metrics(Path(src.location), acc, warnings)
    elif src.kind == SourceKind.QUERY_RANGE:
        got = read_query_range_file(Path(src.location), acc)
        entry.update(got)
        if got["empty"]:
            warnings.append(
                f"{src.location}: the answer holds no series (an unknown metric gives an "
                "empty result): reported as missing"
            )
    elif src.kind == SourceKind.PROMETHEUS_URL:
        if start is None or end is None:
            raise InputError(f"{src.location}: a Prometheus server needs --start and --end")
        t0 = parse_time(start, "--start")
        t1 = parse_time(end, "--end")
        fetched = fetch_live(src.location, acc, t0, t1, step, timeout=timeout)
        entry["fetch"] = fetched.as_dict()
        for gap in fetched.gaps:
            report.gaps.append({"source": src.location, **gap})
            warnings.append(
                f"{src.location}: stopped answering at {gap['start']} ({gap['error']}); the "
                f"samples fetched before are kept, [{gap['start']}, {gap['end']}] is missing"
            )
    elif src.kind == SourceKind.METRICS_URL:
        scrape_exporter(src.location, acc, warnings, timeout=timeout, t=time.time())
    else:  # pragma: no cover - detect() returns only the kinds above
        raise InputError(f"{src.location}: unknown source kind {src.kind}")
    entry["scrapes"] = acc.stats.scrapes - before_scrapes
    entry["samples"] = acc.n_samples - before_samples
    lines = acc.stats.sample_lines - before_lines
    if (
        src.kind in NEED_SAMPLES
        and lines == 0
        and len(acc.declared) == declared_before
    ):
        raise InputError(f"{src.location}: no Prometheus samples in it")


def _run_report(
    acc: RunSamples,
    frame: pd.DataFrame,
    times: np.ndarray,
    label_info: dict[str, Any],
    origin: dict[str, Any],
) -> dict[str, Any]:
    written = set(acc.seen_families) | set(acc.declared) | set(acc.mapped)
    gen = names.detect_generation({names.written_family(f) for f in written})
    declared_empty = acc.missing_families()
    info: dict[str, Any] = {
        "generation": gen["generation"],
        "generation_evidence": gen["evidence"],
        "scrapes": acc.stats.scrapes,
        "timestamps": int(len(times)),
        "t_first": float(times[0]) if len(times) else None,
        "t_last": float(times[-1]) if len(times) else None,
        "median_interval_s": float(np.median(np.diff(times))) if len(times) > 1 else None,
        "samples": int(len(frame)),
        "metrics_present": acc.present_metrics(),
        "metrics_missing": sorted(set(_expected_missing(acc)) | set(declared_empty)),
        "declared_without_samples": declared_empty,
        "mapped_names": dict(sorted(acc.mapped.items())),
        "dropped_labels": label_info["dropped"],
        "target_labels_kept": label_info["kept"],
        "created_samples": "kept" if acc.keep_created else f"dropped ({len(acc.created)} families)",
        "filtered_out_families": sorted(acc.filtered),
        "counter_origin": origin,
        "nonfinite_values": acc.nonfinite_counts(),
        "duplicates_dropped": acc.stats.duplicate_samples,
    }
    if len(times) > 1:
        gaps = np.diff(times)
        med = float(np.median(gaps))
        long = gaps > 3 * med
        if long.any():
            info["scrape_gaps"] = [
                {"after": float(times[i]), "seconds": float(gaps[i])}
                for i in np.nonzero(long)[0][:20]
            ]
    return info


def _snap_end(times: np.ndarray, end: float, limit: float | None) -> float:
    """The first scrape at or after ``end`` (the counts of a run's last seconds are seen only
    by the next scrape), unless it falls at or after ``limit`` (the next run's start)."""
    i = int(np.searchsorted(times, end, side="left"))
    if i < len(times) and (limit is None or times[i] < limit):
        return float(times[i])
    return end


def _fmt_time(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _match_scrape_log(bench_rows: list[dict[str, Any]], scrape_rows: dict[str, dict[str, Any]],
                      tz: _dt.tzinfo | None, warnings: list[str]) -> None:
    """Bench rows named after their own files, read next to one scrape log with wall-clock
    times, join that log's run (what ``run=`` does by hand) when their windows fall in it:
    each is then cut at its own window in ``_merge_runs``."""
    clocked = [n for n, r in scrape_rows.items() if float(r.get("t_start") or 0) > 1e9]
    lonely = [r for r in bench_rows if r["run"] not in scrape_rows]
    if len(clocked) != 1 or not lonely:
        return
    name = clocked[0]
    t_first, t_last = scrape_rows[name]["t_start"], scrape_rows[name]["t_end"]
    inside = [r for r in lonely
              if (w := bench_window(r, tz)) is not None and w[0] < t_last and w[1] > t_first]
    for r in inside:
        r["run"] = name
    if inside:
        warnings.append(f"{len(inside)} bench result(s) matched to the scrape log of run "
                        f"'{name}' by their windows")
    outside = [r["source"] for r in lonely if r not in inside]
    if outside:
        warnings.append(f"{len(outside)} bench result(s) outside the scrape log's span "
                        f"({_fmt_time(t_first)} to {_fmt_time(t_last)}), not matched to it: "
                        + ", ".join(map(str, outside[:5]))
                        + ("" if len(outside) <= 5 else ", ...")
                        + " (a wrong bench_timezone, or another load test)")


def _merge_runs(
    bench_rows: list[dict[str, Any]],
    scrape_rows: dict[str, dict[str, Any]],
    frames: list[pd.DataFrame],
    accs: dict[str, RunSamples],
    warnings: list[str],
    tz: _dt.tzinfo | None = None,
    engine: EngineFacts | None = None,
) -> list[dict[str, Any]]:
    """Bench rows get the preemption and gauge columns of a scrape log of the same run.

    A log with wall-clock times is cut at each bench run's window (``date`` - ``duration``);
    the window's end moves to the first scrape after the run (before the next run starts) so
    that the last interval's counts are not lost. A bench run whose window lies outside the log
    is refused: the times do not line up (a wrong time zone, or another load test).
    """
    out: list[dict[str, Any]] = []
    merged: set[str] = set()
    frame_of = {name: f for name, f in zip(accs, frames, strict=True)}
    by_run: dict[str, list[dict[str, Any]]] = {}
    for row in bench_rows:
        by_run.setdefault(row["run"], []).append(row)
    for name, rows in by_run.items():
        scrape = scrape_rows.get(name)
        frame = frame_of.get(name)
        windows = [bench_window(row, tz) for row in rows]
        starts = sorted(w[0] for w in windows if w)
        times = _distinct_times(frame) if frame is not None else np.array([])
        for row, window in zip(rows, windows, strict=True):
            full = {c: row.get(c, math.nan) for c in RUNS_COLUMNS}
            if scrape is not None and frame is not None:
                t_first, t_last = scrape["t_start"], scrape["t_end"]
                if t_first > 1e9 and window:
                    if not (window[0] < t_last and window[1] > t_first):
                        raise InputError(
                            f"{row['source']}: the bench run ({row.get('date')}, "
                            f"{row['duration_s']:.0f} s: {_fmt_time(window[0])} to "
                            f"{_fmt_time(window[1])}) lies outside the scrape log "
                            f"({_fmt_time(t_first)} to {_fmt_time(t_last)}); the times do not "
                            "line up. vLLM writes 'date' in the bench machine's local time: "
                            "give its time zone (bench_timezone, e.g. '+08:00' or "
                            "'Asia/Shanghai'), or a log recorded during this load test"
                        )
                    if window[0] < t_first or window[1] - 1.0 > t_last:
                        warnings.append(
                            f"{row['source']}: the scrape log covers only part of the bench run "
                            f"({_fmt_time(window[0])} to {_fmt_time(window[1])}): its counters "
                            "miss what happened outside the log"
                        )
                    later = [s for s in starts if s > window[0]]
                    end = _snap_end(times, window[1], later[0] if later else None)
                    steady = steady_part(frame, window[0], end, run=name,
                                         concurrency=finite_or_none(row.get("concurrency")))
                    sub, _ = scrape_row(frame, name, t0=window[0], t1=end, source="",
                                        engine=engine,
                                        gauges=(steady.t0, steady.t1))
                    stamped = isinstance(row.get("window_start"), float)
                    how = (f"scrapes in [{window[0]:.0f}, {end:.0f}] "
                           + ("(the result's kvpressure_window)" if stamped
                              else "(bench 'date' - duration)")
                           + "".join(f"; {n}" for n in steady.notes))
                elif len(rows) == 1:
                    sub, how = scrape, "the whole scrape log"
                else:
                    sub, how = None, ""
                    warnings.append(
                        f"{row['source']}: several bench runs share run '{name}' with a scrape "
                        "log whose times cannot be matched to them: no preemption data for them"
                    )
                if sub is not None:
                    for c in SCRAPE_COLUMNS:
                        full[c] = sub[c]
                    full["source"] = f"{row['source']} + {scrape['source']}"
                    warnings.append(f"{row['source']}: preemption columns from {how}")
                    merged.add(name)
            out.append(full)
    for name, row in scrape_rows.items():
        if name not in merged:
            out.append({c: row.get(c, math.nan) for c in RUNS_COLUMNS})
    return out
