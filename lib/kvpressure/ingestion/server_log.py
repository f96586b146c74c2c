"""A vLLM server log as a source: its lines (:mod:`log_lines`) into the canonical series.

What a log gives, as the series a scrape would:

* ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (V1 counts deferred requests in
  it, as its log does; V0's ``Pending``), ``vllm:kv_cache_usage_perc`` (V0's GPU usage under
  its V0 name ``vllm:gpu_cache_usage_perc``), V0's ``vllm:num_requests_swapped`` and
  ``vllm:cpu_cache_usage_perc``: gauges read at each stats line;
* ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``: **approximations**, the
  logged average throughputs times the interval each line covers, added up line by line and
  sampled at the stats lines like the gauges (so, as with a scrape log, increases count from
  the first line on). A V1 engine logs every ``VLLM_LOG_STATS_INTERVAL`` (10 s) and stays
  silent while idle, so a line after a silence covers one interval; V0 and the first V1
  releases log from the engine loop, so a line covers the time since the previous one.
  Recent V1 releases count only the prompt tokens actually computed (prefix-cache hits left
  out) in the prompt throughput;
* ``vllm:num_preemptions_total``: V0's cumulative count from its preemption warnings (printed
  for the 1st, 51st, 101st... preemption, so it is exact at each warning and up to 49 behind
  in between; sampled at the stats lines), or a V1 build's per-interval ``Preemptions: N``.
  vLLM V1 releases do not print preemptions (0.33.0 builds the part but never prints it): the
  counter is then missing, never zero;
* the number of per-step lines (``--enable-logging-iteration-details``) in the report, as
  ``iteration_lines``: those become a step trace (``iteration_log``), not series;
* ``vllm:cache_config_info`` with the labels the start-up lines give (``num_gpu_blocks``,
  ``block_size``, ``enable_prefix_caching``, ``gpu_memory_utilization``).

A V1 engine prints no stats line while it is idle (no tokens in this interval nor the one
before); a silence that follows a line with both throughputs at 0 is filled with idle samples
(0 running, 0 waiting, 0 KV usage) at the logging interval, so the gauges describe the idle
time as a scrape would. A silence after a busy line is not filled, and is reported.

The engine arguments the log shows (``max_num_seqs``, ``max_num_batched_tokens``,
``block_size``, ``num_gpu_blocks``, ``max_model_len``, the model...) are returned with the
series; a value the log does not show stays unknown (vLLM prints only non-default arguments).

Times: the log's dates carry no year. ``year`` gives the year of the first dated line; without
it the year is the one that puts the last line at or before the file's modification time. A
December -> January step starts the next year. Times without a zone are read in ``tz`` (default:
this machine's zone, where ``vllm serve`` usually ran).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvpressure.errors import InputError
from kvpressure.ingestion.log_lines import (
    Event,
    Stamp,
    from_json,
    may_hold_message,
    parse_message,
    split_prefix,
    strip_colours,
)
from kvpressure.ingestion.names import (
    CACHE_CONFIG_INFO,
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    RUNNING,
    WAITING,
)
from kvpressure.ingestion.prom_text import RunSamples
from kvpressure.ingestion.text_files import open_text

V0_KV_USAGE = "vllm:gpu_cache_usage_perc"
V0_CPU_USAGE = "vllm:cpu_cache_usage_perc"
V0_SWAPPED = "vllm:num_requests_swapped"
V0_PREFIX_HIT_RATE = "vllm:gpu_prefix_cache_hit_rate"

V1_LOG_INTERVAL_S = 10.0  # VLLM_LOG_STATS_INTERVAL's default
V0_LOG_INTERVAL_S = 5.0  # V0's and early V1's _LOCAL_LOGGING_INTERVAL_SEC
GAP_FACTOR = 1.5  # a step between lines longer than this many intervals is a silence
PREEMPTION_WARNING_EVERY = 50

# The cache_config_info labels vLLM exports, from the engine arguments the log shows.
_CACHE_LABELS = ("num_gpu_blocks", "block_size", "enable_prefix_caching",
                 "gpu_memory_utilization")
# What no vLLM log line carries.
_NEVER_LOGGED = {
    "vllm:request_success_total": "finished requests are not logged",
    "vllm:num_requests_waiting_by_reason": "the log gives one waiting count, not its reasons",
    "vllm:prefix_cache_queries_total": "the log gives a hit rate, not the counts",
    "vllm:time_to_first_token_seconds": "latency histograms are not logged",
    "vllm:inter_token_latency_seconds": "latency histograms are not logged",
    "vllm:e2e_request_latency_seconds": "latency histograms are not logged",
    "vllm:request_prompt_tokens": "request length histograms are not logged",
    "vllm:request_generation_tokens": "request length histograms are not logged",
}


@dataclass
class LogRead:
    """Everything read from one log, before it becomes series."""

    path: Path
    events: list[Event] = field(default_factory=list)
    lines: int = 0
    year: dict[str, Any] = field(default_factory=dict)


def read_events(path: Path, *, year: int | None = None, tz: _dt.tzinfo | None = None,
                warnings: list[str] | None = None) -> LogRead:
    """The lines the kit reads from ``path`` (plain or gzip), each with its unix time."""
    out = LogRead(path)
    stamps: list[Stamp] = []  # year-less stamps of every dated line, for the year rollovers
    rollovers: list[int] = []  # per entry of ``stamps``: December -> January steps before it
    rolled = 0
    last_month = 0
    try:
        with open_text(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                out.lines = lineno
                if not may_hold_message(raw):
                    continue
                line = from_json(strip_colours(raw).strip())
                parsed = parse_message(line)
                if parsed is None:
                    continue
                stamp, _message = split_prefix(line, lineno)
                if stamp is None:
                    if warnings is not None and parsed[0] in ("stats", "preemption"):
                        warnings.append(f"{path}: line {lineno}: no time on the line; skipped")
                    continue
                if stamp.iso is None:
                    # Months only go back at a new year (every read line is dated: a silence
                    # of a whole year between two of them is not told apart).
                    if last_month == 12 and stamp.month == 1:
                        rolled += 1
                    last_month = stamp.month
                    stamps.append(stamp)
                    rollovers.append(rolled)
                out.events.append(Event(parsed[0], stamp, parsed[1]))
    except EOFError:
        if warnings is not None:
            warnings.append(f"{path}: compressed stream ends early after line {out.lines}: "
                            "the file was cut; the lines before it are kept")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    base, how = _base_year(path, stamps, rollovers, year, tz)
    out.year = {"first_line": base, "from": how, "rollovers": rolled}
    offset = {id(s): r for s, r in zip(stamps, rollovers, strict=True)}
    for ev in out.events:
        ev.t = _unix(ev.stamp, base + offset.get(id(ev.stamp), 0), tz, path)
    return out


def _base_year(path: Path, stamps: list[Stamp], rollovers: list[int], year: int | None,
               tz: _dt.tzinfo | None) -> tuple[int, str]:
    if year is not None:
        if not isinstance(year, int) or isinstance(year, bool) or not 1970 <= year <= 9999:
            raise InputError(f"log year {year!r}: expected a year such as 2025")
        return year, "given"
    if not stamps:
        return _dt.datetime.now(tz).year, "not needed (ISO times)"
    mtime = _dt.datetime.fromtimestamp(path.stat().st_mtime, tz)
    last = stamps[-1]
    # The last line was written before the file was last modified; a day of slack covers a
    # log written in another zone than this machine's.
    year_last = mtime.year if (last.month, last.day) <= _next_day(mtime) else mtime.year - 1
    return year_last - rollovers[-1], f"the file's modification time ({mtime:%Y-%m-%d})"


def _next_day(when: _dt.datetime) -> tuple[int, int]:
    nxt = when + _dt.timedelta(days=1)
    return (nxt.month, nxt.day) if nxt.year == when.year else (12, 31)


def _unix(stamp: Stamp, year: int, tz: _dt.tzinfo | None, path: Path) -> float:
    if stamp.iso is not None:
        when = stamp.iso
        if when.tzinfo is None and tz is not None:
            when = when.replace(tzinfo=tz)
        return when.timestamp() + stamp.frac
    try:
        when = _dt.datetime(year, stamp.month, stamp.day, *stamp.hms, tzinfo=tz)
    except ValueError:
        h, mi, s = stamp.hms
        raise InputError(
            f"{path}: line {stamp.line}: {stamp.month:02d}-{stamp.day:02d} {h:02d}:{mi:02d}:"
            f"{s:02d} is not a time in {year} (a corrupt line, or give the log's year with "
            "--log-year)"
        ) from None
    return when.timestamp() + stamp.frac


# ---------------------------------------------------------------------------- series
@dataclass
class _Engine:
    """The stats lines of one engine (or of the aggregate), in time order."""

    key: str | None
    t: np.ndarray
    rows: list[dict[str, Any]]


def read_server_log(path: Path, acc: RunSamples, warnings: list[str], *,
                    year: int | None = None, tz: _dt.tzinfo | None = None) -> dict[str, Any]:
    """Add the series of one server log to ``acc``; returns what the ingest report says of it
    (format, intervals, engine arguments, what is missing and why)."""
    log = read_events(path, year=year, tz=tz, warnings=warnings)
    stats = [e for e in log.events if e.kind == "stats"]
    preempt = [e for e in log.events if e.kind == "preemption"]
    startup = [e for e in log.events if e.kind == "startup"]
    if not stats:
        found = (f"{len(startup)} start-up line(s) but " if startup else "")
        raise InputError(
            f"{path}: {found}no vLLM stats line ('Avg prompt throughput: ... Running: N reqs, "
            "Waiting: M reqs, GPU KV cache usage: X%') in its "
            f"{log.lines} lines: not a vLLM server log, or the server ran with "
            "--disable-log-stats or never had load (vLLM prints no stats while idle)"
        )
    args = engine_args(startup, warnings, path)
    v0 = any("swapped" in e.values for e in stats)
    engines = _engines(stats, warnings, path)
    periodic = all(g.key is not None for g in engines)
    labels_base = {}
    model = args.get("served_model_name") or args.get("model")
    if isinstance(model, str) and model:
        labels_base["model_name"] = model
    notes: list[str] = []
    info: dict[str, Any] = {
        "format": "v0" if v0 else ("v1" if periodic else "v1-early"),
        "version": next((e.values["version"] for e in reversed(startup)
                         if "version" in e.values), None),
        "device": next((e.values["device"] for e in reversed(startup)
                        if "device" in e.values), None),
        "lines": log.lines,
        "stats_lines": len(stats),
        "preemption_warnings": len(preempt),
        # one line per engine step (--enable-logging-iteration-details): iteration_log reads them
        "iteration_lines": sum(e.kind == "iteration" for e in log.events),
        "year": log.year,
        "timezone": _tz_name(tz),
        "engine_args": args,
        "notes": notes,
    }
    if log.year["from"] not in ("given", "not needed (ISO times)"):
        warnings.append(f"{path}: the log's dates have no year; {log.year['first_line']} taken "
                        f"from {log.year['from']} (give --log-year if it is wrong)")
    times: set[float] = set()
    filled = 0
    for group in engines:
        labels = dict(labels_base)
        if group.key not in (None, "aggregated"):
            labels["engine"] = group.key
        interval, how = _interval(group.t, periodic)
        info.setdefault("interval_s", interval)
        info.setdefault("interval_from", how)
        n = _add_engine(acc, group, labels, interval, periodic=periodic, v0=v0,
                        warnings=warnings, path=path, times=times)
        filled += n
    info["idle_intervals_filled"] = filled
    start = min(times)
    if preempt or v0:
        _add_v0_preemptions(acc, preempt, startup, stats, labels_base, info, notes, times)
    if any("preemptions" in e.values for e in stats):
        notes.append("vllm:num_preemptions_total: the sum of the per-interval 'Preemptions: N' "
                     "(a line without it had none)")
    elif not v0:
        notes.append("vllm:num_preemptions_total: missing, vLLM V1 does not print preemptions "
                     "in its log (not zero)")
    notes.append("vllm:prompt_tokens_total and vllm:generation_tokens_total: approximations, "
                 "the logged average throughputs (one decimal) times the interval each line "
                 f"covers ({info['interval_s']:g} s, {info['interval_from']})")
    if filled:
        notes.append(f"{filled} silent interval(s) of an idle V1 engine filled with idle samples "
                     "(0 running, 0 waiting, 0 KV usage)")
    _add_cache_config(acc, args, labels_base, sorted(times), info)
    _add_prefix_rates(acc, log.events, labels_base, v0)
    missing = dict(_NEVER_LOGGED)
    if PREEMPTIONS not in {s.canonical for s in acc.series}:
        missing[PREEMPTIONS] = ("vLLM V1 does not print preemptions in its log" if not v0 else
                                "no preemption warning, and the log does not start with the "
                                "engine: vLLM warns at every 50th preemption only, so up to 49 "
                                "may have gone unseen")
    for key, why in (("max_num_seqs", "vLLM prints only non-default arguments"),
                     ("num_gpu_blocks", "no '# GPU blocks' or 'KV cache size' line with a "
                      "known block size"),
                     ("block_size", "vLLM prints it only when set on the command line")):
        if args.get(key) is None:
            missing[f"engine argument {key}"] = why
    info["missing"] = missing
    info["t_first"] = start
    acc.stats.scrapes += len(times)
    acc.sources.append(str(path))
    warnings.extend(f"{path}: {note}" for note in notes)
    return info


def _tz_name(tz: _dt.tzinfo | None) -> str:
    if tz is None:
        return "this machine's local time"
    return str(tz)


def _engines(stats: list[Event], warnings: list[str], path: Path) -> list[_Engine]:
    keys = {e.values.get("engine") for e in stats}
    if "aggregated" in keys and len(keys) > 1:
        warnings.append(f"{path}: both per-engine and aggregated stats lines; the aggregated "
                        "ones are read (the others would count the same work twice)")
        stats = [e for e in stats if e.values.get("engine") == "aggregated"]
        keys = {"aggregated"}
    out = []
    for key in sorted(keys, key=lambda k: (k is None, str(k))):
        evs = sorted((e for e in stats if e.values.get("engine") == key), key=lambda e: e.t)
        out.append(_Engine(key, np.array([e.t for e in evs]),
                           [{**e.values, "_line": e.stamp.line} for e in evs]))
    return out


def _interval(t: np.ndarray, periodic: bool) -> tuple[float, str]:
    """The logging interval: the median step between consecutive lines (whole seconds on
    the line, so one step is off by up to a second), or vLLM's default with one line."""
    steps = np.diff(t)
    steps = steps[steps > 0]
    if len(steps):
        return float(np.median(steps)), "the median step between stats lines"
    default = V1_LOG_INTERVAL_S if periodic else V0_LOG_INTERVAL_S
    return default, "vLLM's default logging interval (one stats line)"


def _add_engine(acc: RunSamples, group: _Engine, labels: dict[str, str], interval: float, *,
                periodic: bool, v0: bool, warnings: list[str], path: Path,
                times: set[float]) -> int:
    """Gauges and integrated token counters of one engine; returns the idle intervals filled.

    Counters are sampled at the stats lines only, like the gauges (a scrape gives both at
    once): the first line's value is its own interval's count, so increases, which count from
    the first sample, start after it."""
    gauges: dict[str, list[tuple[float, float]]] = {}
    counters: dict[str, list[tuple[float, float]]] = {PROMPT_TOKENS: [], GENERATION_TOKENS: []}
    has_preempt = any("preemptions" in r for r in group.rows)
    if has_preempt:
        counters[PREEMPTIONS] = []
    totals = dict.fromkeys(counters, 0.0)
    filled = 0
    prev_t: float | None = None
    prev: dict[str, Any] | None = None
    for t, row in zip(group.t.tolist(), group.rows, strict=True):
        step = t - prev_t if prev_t is not None else math.inf
        if step <= GAP_FACTOR * interval:
            covered = step
        elif periodic or prev_t is None:
            covered = interval
        else:
            covered = step  # V0 averages over the whole time since its last line
        if prev_t is not None and step > GAP_FACTOR * interval and periodic:
            idle = prev is not None and prev["prompt_tps"] == 0 and prev["generation_tps"] == 0
            if idle:
                # Up to the start of the interval this line covers: the engine was idle.
                k = 1
                while prev_t + k * interval <= t - interval + 0.5:
                    ti = prev_t + k * interval
                    for name in (RUNNING, WAITING, KV_USAGE):
                        gauges.setdefault(name, []).append((ti, 0.0))
                    for name in counters:
                        counters[name].append((ti, totals[name]))
                    times.add(ti)
                    filled += 1
                    k += 1
            else:
                warnings.append(
                    f"{path}: no stats line for {step:.0f} s before line "
                    f"{_line_of(group, t)} after a busy line (a stall, a restart or lost "
                    "lines): the counters assume one interval of work there"
                )
        totals[PROMPT_TOKENS] += row["prompt_tps"] * covered
        totals[GENERATION_TOKENS] += row["generation_tps"] * covered
        if has_preempt:
            totals[PREEMPTIONS] += row.get("preemptions", 0)
        for name in counters:
            counters[name].append((t, totals[name]))
        for name, value in _gauges(row, v0):
            gauges.setdefault(name, []).append((t, value))
        times.add(t)
        prev_t, prev = t, row
    for name, points in gauges.items():
        _add(acc, name, "gauge", labels, points)
    for name, points in counters.items():
        _add(acc, name, "counter", labels, points)
    return filled


def _line_of(group: _Engine, t: float) -> str:
    i = int(np.searchsorted(group.t, t))
    return str(group.rows[i].get("_line", "?")) if i < len(group.rows) else "?"


def _gauges(row: dict[str, Any], v0: bool) -> list[tuple[str, float]]:
    out = [(RUNNING, float(row["running"]))] if "running" in row else []
    if "waiting" in row:
        out.append((WAITING, float(row["waiting"])))
    usage = row.get("usage") or []
    if v0:
        for device, value in usage:
            out.append((V0_CPU_USAGE if device == "CPU" else V0_KV_USAGE, value))
        if "swapped" in row:
            out.append((V0_SWAPPED, float(row["swapped"])))
    elif usage:
        out.append((KV_USAGE, usage[0][1]))  # V1: the device's pool, whatever the device
    return out


def _add(acc: RunSamples, name: str, kind: str, labels: dict[str, str],
         points: list[tuple[float, float]]) -> None:
    if not points:
        return
    sid = acc.series_id(name, labels, kind)
    if sid < 0:
        return
    t = np.array([p[0] for p in points], dtype=float)
    v = np.array([p[1] for p in points], dtype=float)
    acc.add_points(sid, t, v)


def _add_v0_preemptions(acc: RunSamples, preempt: list[Event], startup: list[Event],
                        stats: list[Event], labels: dict[str, str], info: dict[str, Any],
                        notes: list[str], times: set[float]) -> None:
    """V0's cumulative preemption count at each stats line: the total of the last warning
    before it (exact at a warning, up to 49 behind between warnings), 0 before the first
    warning when the log starts with the engine, unknown (no sample) otherwise."""
    starts = [e.t for e in startup if e.values.get("engine_start") or "num_gpu_blocks" in e.values]
    first_stats = min(e.t for e in stats)
    began = any(t <= first_stats for t in starts)
    warned = sorted((e.t, float(e.values["cumulative"])) for e in preempt)
    warn_t = np.array([w[0] for w in warned])
    points: list[tuple[float, float]] = []
    for t in sorted(times):
        i = int(np.searchsorted(warn_t, t, side="right"))
        if i:
            points.append((t, warned[i - 1][1]))
        elif began:
            points.append((t, 0.0))
    if not preempt:
        if not began:
            return
        # The first preemption is always warned about: none in a log that starts with the
        # engine means none happened.
        notes.append("vllm:num_preemptions_total: 0, the log starts with the engine and holds "
                     "no preemption warning (vLLM warns at the first one)")
    else:
        notes.append(
            f"vllm:num_preemptions_total: from {len(preempt)} preemption warning(s), last "
            f"total {warned[-1][1]:.0f}; vLLM warns every {PREEMPTION_WARNING_EVERY} "
            "preemptions, so at each stats line the count is the last warning's, up to "
            f"{PREEMPTION_WARNING_EVERY - 1} behind" + (
                "" if began else "; the log does not start with the engine, so the counter "
                "starts at the first stats line after the first warning")
        )
        info["preemption_modes"] = sorted({e.values["mode"] for e in preempt})
    _add(acc, PREEMPTIONS, "counter", labels, points)


def _add_cache_config(acc: RunSamples, args: dict[str, Any], labels: dict[str, str],
                      times: list[float], info: dict[str, Any]) -> None:
    cfg = {k: _label_value(args[k]) for k in _CACHE_LABELS if args.get(k) is not None}
    if not cfg:
        return
    _add(acc, CACHE_CONFIG_INFO, "gauge", {**labels, **cfg}, [(t, 1.0) for t in times])
    info["cache_config_info"] = cfg


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _add_prefix_rates(acc: RunSamples, events: list[Event], labels: dict[str, str],
                      v0: bool) -> None:
    """V0 logs its prefix-cache hit rate on a line of its own, as its gauge did."""
    if not v0:
        return
    points = [(e.t, e.values["gpu"]) for e in events if e.kind == "v0_prefix_rate"]
    _add(acc, V0_PREFIX_HIT_RATE, "gauge", labels, points)


# ---------------------------------------------------------------------------- engine args
def engine_args(startup: list[Event], warnings: list[str], path: Path) -> dict[str, Any]:
    """The engine arguments the start-up lines show; a value printed by the engine once it
    resolved it (``# GPU blocks``, ``Chunked prefill ... max_num_batched_tokens``) wins over the
    command line. With several starts in one log the last one's values are kept."""
    starts = sum(1 for e in startup if e.values.get("engine_start"))
    if starts > 1:
        warnings.append(f"{path}: the engine started {starts} times in this log; the engine "
                        "arguments of the last start are used")
    cli: dict[str, Any] = {}
    config: dict[str, Any] = {}
    resolved: dict[str, Any] = {}
    for e in startup:
        v = e.values
        cli.update({k: x for k, x in (v.get("args") or {}).items() if x is not None})
        config.update({k: x for k, x in (v.get("config") or {}).items() if x is not None})
        for key in ("num_gpu_blocks", "kv_cache_size_tokens", "max_model_len", "max_concurrency",
                    "max_num_batched_tokens", "pool_device", "num_cpu_blocks"):
            if key in v:
                resolved[key] = v[key]
    out: dict[str, Any] = {**cli, **config, **resolved}
    if out.get("num_gpu_blocks") is None and cli.get("num_gpu_blocks_override") is not None:
        out["num_gpu_blocks"] = cli["num_gpu_blocks_override"]
    tokens, block = out.get("kv_cache_size_tokens"), out.get("block_size")
    if out.get("num_gpu_blocks") is None and isinstance(tokens, int) and isinstance(block, int):
        if block > 0 and tokens % block == 0:
            out["num_gpu_blocks"] = tokens // block
    if out.get("scheduling_policy") is not None:
        out["policy"] = out["scheduling_policy"]
    return {k: out[k] for k in sorted(out)}


# The engine arguments a report's settings take from a log.
# (The scheduling policy and admission rule stay out: the runs table's recompute estimate does
# not take them from a log, and both must give one number.)
SETTINGS_KEYS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks",
                 "enable_prefix_caching", "gpu_memory_utilization", "max_model_len")


def engine_args_from_reports(reports: dict[str, Any]) -> dict[str, Any]:
    """The engine settings server logs showed, from ``ingest()`` reports (first seen wins)."""
    out: dict[str, Any] = {}
    for report in reports.values():
        for run in (report.get("runs") or {}).values():
            args = (run.get("server_log") or {}).get("engine_args") or {}
            for key in SETTINGS_KEYS:
                if args.get(key) is not None:
                    out.setdefault(key, args[key])
    return out


def startup_facts(path: Path) -> dict[str, Any]:
    """What a server log's start-up lines say of the server: ``version`` and ``device`` (the
    last start's, a log may hold several), each only when the log says. InputError when the
    file cannot be read."""
    from kvpressure.errors import InputError

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--server-log {path}: no such file")
    startup = [e for e in read_events(path).events if e.kind == "startup"]
    out: dict[str, Any] = {}
    for key in ("version", "device"):
        value = next((e.values[key] for e in reversed(startup) if key in e.values), None)
        if value:
            out[key] = str(value)
    if out:
        out["from_log"] = str(path)
    return out


def log_notes(reports: dict[str, Any]) -> list[str]:
    """One sentence per server log in ``ingest()`` reports: what its numbers are worth."""
    out = []
    for report in reports.values():
        for run in (report.get("runs") or {}).values():
            log = run.get("server_log")
            if not log:
                continue
            parts = [f"token counters are approximations (logged average throughputs times "
                     f"each line's {log.get('interval_s', 0):g} s interval)"]
            if "vllm:num_preemptions_total" in (log.get("missing") or {}):
                parts.append("preemptions are missing (not zero): "
                             + log["missing"]["vllm:num_preemptions_total"])
            if log.get("idle_intervals_filled"):
                parts.append(f"{log['idle_intervals_filled']} silent idle interval(s) filled "
                             "with idle samples")
            args = [k for k in ("max_num_seqs", "num_gpu_blocks", "block_size")
                    if (log.get("engine_args") or {}).get(k) is not None]
            if args:
                parts.append(f"{', '.join(args)} from its start-up lines")
            out.append(f"from a vLLM {log.get('format', '')} server log: " + "; ".join(parts))
    return out
