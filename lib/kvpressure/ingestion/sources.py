"""What each SOURCE is, and the scrapes inside the scrape-like ones.

Kinds (:class:`~kvpressure.ingestion.source_kind.SourceKind`):

* ``prom_text``: one Prometheus text exposition (``curl /metrics > dump.prom``), one scrape.
* ``prom_dir``: a folder of such dumps, one per scrape, the time taken from each file name
  (unix seconds or milliseconds, or an ISO 8601 date-time), else its modification time.
* ``prom_jsonl``: a scrape log, one ``{"t": seconds, "text": "<exposition>"}`` per line
  (``metrics.prom.jsonl``, optionally gzip-compressed).
* ``query_range``: a saved Prometheus HTTP API answer (``/api/v1/query_range`` or a range-vector
  ``/api/v1/query``).
* ``bench``: ``vllm bench serve --save-result`` JSON (one object, or one per line with
  ``--append-result``), or a sweep table of another tool (a runs CSV, ``vllm bench sweep``
  results, GuideLLM and AIPerf exports: :mod:`kvpressure.ingestion.bench_tables`).
* ``aiperf_metrics``: the server's ``/metrics`` as AIPerf recorded it through a level
  (``server_metrics_export.jsonl`` or ``.parquet``: :mod:`kvpressure.ingestion.aiperf_metrics`).
* ``server_log``: a vLLM server's log (``vllm serve ... 2>&1 | tee server.log``, optionally
  gzip-compressed), recognised by vLLM's line prefix or its stats lines.
* ``prometheus_url``: a live Prometheus server (``http://host:9090``), read over a time range.
* ``metrics_url``: a live exporter (``http://host:8000/metrics``), scraped once.

Files are recognised by content, not by extension; gzip is recognised by its magic bytes.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.log_lines import (
    has_log_prefix,
    looks_like_prometheus,
    looks_like_server_log,
)
from kvpressure.ingestion.source_kind import IN_FOLDER, READABLE, SourceKind
from kvpressure.ingestion.text_files import GZIP_MAGIC, open_text

_BENCH_KEYS = {
    "duration",
    "completed",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrency",
    "num_prompts",
    "backend",
    "mean_ttft_ms",
}


@dataclass
class Source:
    kind: SourceKind
    location: str  # path or URL as given
    files: list[Path] = field(default_factory=list)  # prom_dir: the dumps, in time order
    notes: list[str] = field(default_factory=list)


def _refuse_deep(path: Path) -> None:
    """The strict reader's refusal of a file nested past the stack, naming file and line."""
    from kvpressure.user_files import parse_user_json, read_user_text

    parse_user_json(read_user_text(path), path)
    raise InputError(f"{path}: nested too deep to read")


def _head(path: Path, size: int = 65536) -> str:
    """The first ``size`` bytes as text; a cut gzip stream gives what it holds."""
    chunks: list[bytes] = []
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == GZIP_MAGIC
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            got = 0
            while got < size:
                chunk = fh.read(4096)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
    except EOFError:
        pass
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    return b"".join(chunks).decode("utf-8", errors="replace")


def _first_line(path: Path) -> str:
    """The first non-blank line, read whole, however long."""
    try:
        with open_text(path) as fh:
            for line in fh:
                if line.strip():
                    return line.strip()
    except (OSError, EOFError):
        pass
    return ""


def sniff_file(path: Path) -> SourceKind:
    """The kind of one file, from its first bytes."""
    from kvpressure.ingestion import aiperf_metrics, bench_tables  # both read through this module

    if aiperf_metrics.is_parquet(path):
        return SourceKind.AIPERF_METRICS
    head = _head(path)
    stripped = head.lstrip()
    if not stripped:
        return SourceKind.EMPTY
    if stripped[0] == "[":
        # A `vllm bench sweep` summary.json is a list of results.
        return SourceKind.BENCH if bench_tables.table_format(path) else SourceKind.JSON_LIST
    if stripped[0] == "{":
        first = stripped.split("\n", 1)[0]
        if "\n" not in stripped:
            # The first line is longer than the head (a scrape of a multi-engine server is
            # easily over 64 KiB): judge on the whole line.
            first = _first_line(path)
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        except RecursionError:
            _refuse_deep(path)
        if isinstance(obj, dict):
            if "text" in obj and any(k in obj for k in ("t", "time", "timestamp")):
                return SourceKind.PROM_JSONL
            if aiperf_metrics.is_jsonl_line(obj):
                return SourceKind.AIPERF_METRICS
            if "message" in obj and "levelname" in obj:
                # vLLM's JSON log lines (--logging-config.formatter json)
                return SourceKind.SERVER_LOG
            if obj.get("status") in ("success", "error") and ("data" in obj or "error" in obj):
                return SourceKind.QUERY_RANGE
            if len(_BENCH_KEYS & obj.keys()) >= 2 or bench_tables.sniff_table(path, head, obj):
                return SourceKind.BENCH
            return SourceKind.JSON_OTHER
        # A pretty-printed JSON document: decide on the whole file.
        try:
            with open_text(path) as fh:
                obj = json.load(fh)
        except (json.JSONDecodeError, OSError, EOFError):
            return SourceKind.JSON_BROKEN
        except RecursionError:
            _refuse_deep(path)
        if isinstance(obj, dict):
            if obj.get("status") in ("success", "error") and ("data" in obj or "error" in obj):
                return SourceKind.QUERY_RANGE
            if len(_BENCH_KEYS & obj.keys()) >= 2:
                return SourceKind.BENCH
        if bench_tables.sniff_table(path, head, obj):
            return SourceKind.BENCH  # a GuideLLM or AIPerf export
        return SourceKind.JSON_OTHER
    if looks_like_server_log(head):
        return SourceKind.SERVER_LOG
    if bench_tables.sniff_table(path, head):
        return SourceKind.BENCH  # a runs CSV, a sweep's summary.csv, a GuideLLM or AIPerf table
    if not looks_like_prometheus(head):
        return SourceKind.SERVER_LOG if _log_further_on(path) else SourceKind.TEXT_OTHER
    return SourceKind.PROM_TEXT


def _log_further_on(path: Path, limit: int = 4 << 20) -> bool:
    """Whether a vLLM log line comes after a long head of other output (a model download's
    progress bars, a traceback of an earlier start): the first ``limit`` characters decide."""
    read = 0
    try:
        with open_text(path) as fh:
            for line in fh:
                if has_log_prefix(line):
                    return True
                read += len(line)
                if read > limit:
                    break
    except (OSError, EOFError):
        pass
    return False


def _refuse(path: Path, kind: SourceKind) -> InputError:
    if kind == SourceKind.JSON_LIST:
        return InputError(
            f"{path}: a JSON list, not a vllm bench result (a '.pytorch.json' written beside the "
            "result?); pass the '--save-result' JSON itself"
        )
    if kind == SourceKind.JSON_BROKEN:
        return InputError(f"{path}: JSON that does not parse")
    if kind == SourceKind.TEXT_OTHER:
        return InputError(
            f"{path}: neither Prometheus text ('name{{labels}} value' lines) nor a vLLM server "
            "log (lines such as 'INFO 12-01 14:25:31 [loggers.py:123] Engine 000: Avg prompt "
            "throughput: ...')"
        )
    return InputError(
        f"{path}: JSON that is neither a Prometheus scrape log ({{'t', 'text'}} per line), a "
        "Prometheus HTTP API answer ({'status', 'data'}), a 'vllm bench serve' result nor a "
        "sweep export this kit reads (vllm bench sweep, GuideLLM, AIPerf with its "
        "output_token_throughput)"
    )


def detect(location: str | Path) -> list[Source]:
    """The sources behind one SOURCE argument (a folder may hold several)."""
    text = str(location)
    if re.match(r"^https?://", text):
        path_part = re.sub(r"^https?://[^/]+", "", text).rstrip("/")
        kind = (SourceKind.METRICS_URL if path_part.endswith("/metrics")
                else SourceKind.PROMETHEUS_URL)
        return [Source(kind, text)]
    path = Path(location)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_dir():
        return _detect_dir(path)
    kind = sniff_file(path)
    if kind == SourceKind.EMPTY:
        raise InputError(f"{path}: empty file")
    if kind not in READABLE:
        raise _refuse(path, kind)
    return [Source(kind, str(path))]


def _detect_dir(path: Path) -> list[Source]:
    from kvpressure.ingestion import bench_tables

    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    files = bench_tables.folder_tables(path, files)
    if not files:
        raise InputError(f"{path}: empty folder, no scrapes or results to read")
    dumps: list[Path] = []
    out: list[Source] = []
    skipped: list[str] = []
    for f in files:
        kind = sniff_file(f)
        if kind == SourceKind.PROM_TEXT:
            dumps.append(f)
        elif kind in IN_FOLDER:
            out.append(Source(kind, str(f)))
        else:
            skipped.append(f.name)
    if dumps:
        out.insert(0, Source(SourceKind.PROM_DIR, str(path), files=dumps))
    if not out:
        raise InputError(
            f"{path}: none of its {len(files)} files is a Prometheus text dump, scrape log, "
            f"HTTP API answer, vllm bench result or vLLM server log (e.g. {files[0].name})"
        )
    if skipped:
        out[0].notes.append(f"{path}: files not read: {', '.join(skipped[:10])}")
    return out


# ---------------------------------------------------------------------- scrape iteration
@dataclass
class Scrape:
    t: float
    text: str
    where: str  # file, and line for a JSONL
    first_line: int  # line of the text's first line, for messages
    last: bool = False  # the source's last scrape (a cut there is truncation, not an error)


def iter_jsonl(path: Path, warnings: list[str]) -> Iterator[Scrape]:
    """Scrapes of a JSONL log. A cut last line (or gzip stream) is reported and skipped; lines
    out of time order (logs run together) are read sorted by ``t``, the first such line named
    in a warning."""
    pending: tuple[int, str] | None = None
    lineno = 0
    before: tuple[float, int] | None = None
    said = False

    def forward(scrape: Scrape, at: int) -> Scrape:
        nonlocal before, said
        if math.isfinite(scrape.t):
            if before is not None and scrape.t < before[0] and not said:
                warnings.append(
                    f"{path}: line {at}: t {scrape.t:.3f} is earlier than line {before[1]}'s "
                    f"{before[0]:.3f}: the log's lines are out of time order (logs run "
                    "together?); they are read sorted by t")
                said = True
            before = (scrape.t, at)
        return scrape

    try:
        with open_text(path) as fh:
            for raw in fh:
                lineno += 1
                if pending is not None:
                    yield forward(_jsonl_scrape(path, *pending, last=False, warnings=warnings),
                                  pending[0])
                    pending = None
                if raw.strip():
                    pending = (lineno, raw)
    except EOFError:
        warnings.append(
            f"{path}: compressed stream ends early after line {lineno}: the file was cut; "
            "the complete scrapes before it are kept"
        )
        if pending is not None and not pending[1].endswith("\n"):
            warnings.append(f"{path}: line {pending[0]}: incomplete scrape dropped")
            return
    if pending is not None:
        yield forward(_jsonl_scrape(path, *pending, last=True, warnings=warnings), pending[0])


def _jsonl_scrape(
    path: Path, lineno: int, raw: str, *, last: bool, warnings: list[str]
) -> Scrape:
    where = f"{path}: line {lineno}"
    repeated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        out = dict(items)
        repeated = repeated or len(out) != len(items)
        return out

    try:
        obj = json.loads(raw, object_pairs_hook=pairs)
    except RecursionError:
        obj, repeated = None, True
    except json.JSONDecodeError as exc:
        if last and not raw.endswith("\n"):
            warnings.append(
                f"{path}: line {lineno}: the file ends in the middle of a scrape (cut at "
                f"column {exc.pos}); the complete scrapes before it are kept"
            )
            return Scrape(float("nan"), "", where, 1, last=True)
        if raw.startswith('{"t": ') and not raw.rstrip("\n").endswith("}"):
            # A scrape cut by a kill mid-write; the scraper, restarted, went on on a fresh line.
            warnings.append(f"{where}: a scrape cut short (the scraper was stopped while "
                            "writing it); the scrapes around it are kept")
            return Scrape(float("nan"), "", where, 1, last=last)
        raise InputError(f"{where}: not a JSON scrape ({exc.msg} at column {exc.colno})") from None
    if repeated:  # a key given twice or nesting past the stack: the strict reader names it
        from kvpressure.user_files import parse_user_json

        parse_user_json(raw, where)
    if isinstance(obj, dict) and "gap" in obj and "text" not in obj:
        # `kvpressure scrape` writes a failed scrape as a gap with its reason.
        warnings.append(f"{where}: the scraper recorded a gap: {obj['gap']}")
        return Scrape(float("nan"), "", where, 1, last=last)
    if not isinstance(obj, dict) or "text" not in obj:
        raise InputError(f"{where}: a scrape needs the fields 't' and 'text'")
    t = obj.get("t", obj.get("time", obj.get("timestamp")))
    if isinstance(t, str):
        t = parse_time(t, f"{where}: field 't'")
    if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t):
        raise InputError(f"{where}: field 't' must be a number of seconds, got {t!r}")
    if not isinstance(obj["text"], str):
        raise InputError(f"{where}: field 'text' must be a string")
    return Scrape(float(t), obj["text"], f"{path} (JSONL line {lineno})", 1, last=last)


_NUMBER = re.compile(r"(?<![\d.])(\d{10,13}(?:\.\d+)?)(?![\d])")
_ISO = re.compile(
    r"(\d{4})-?(\d{2})-?(\d{2})[T_ -]?(\d{2})[:\-]?(\d{2})[:\-]?(\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?"
)


def time_from_name(name: str) -> float | None:
    """Unix time encoded in a file name, or None."""
    m = _ISO.search(name)
    if m:
        y, mo, d, h, mi, s, frac, tz = m.groups()
        try:
            when = _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s))
        except ValueError:
            when = None
        if when is not None:
            offset = _dt.timedelta(0)
            if tz and tz != "Z":
                sign = 1 if tz[0] == "+" else -1
                digits = tz[1:].replace(":", "")
                offset = sign * _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            when = when.replace(tzinfo=_dt.timezone(offset))
            return when.timestamp() + (float(frac) if frac else 0.0)
    m = _NUMBER.search(name)
    if m:
        x = float(m.group(1))
        return x / 1000.0 if x >= 1e12 else x
    return None


def parse_time(text: str | float | int, what: str) -> float:
    """Unix seconds from a number, an ISO 8601 date-time (UTC unless it says otherwise), or
    ``now`` / ``now-1h`` / ``now-30m`` / ``now-90s``."""
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    try:
        return float(s)
    except ValueError:
        pass
    m = re.fullmatch(r"now(?:-(\d+(?:\.\d+)?)([smhd]))?", s)
    if m:
        now = _dt.datetime.now(_dt.UTC).timestamp()
        if m.group(1):
            unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
            now -= float(m.group(1)) * unit
        return now
    try:
        when = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{what}: {s!r} is not a time (unix seconds, ISO 8601, or now-1h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return when.timestamp()


def iter_dir_dumps(source: Source, warnings: list[str]) -> Iterator[Scrape]:
    """Scrapes of a folder of dumps, in time order."""
    timed: list[tuple[float, Path]] = []
    from_mtime = []
    for f in source.files:
        t = time_from_name(f.name)
        if t is None:
            t = f.stat().st_mtime
            from_mtime.append(f.name)
        timed.append((t, f))
    if from_mtime:
        warnings.append(
            f"{source.location}: no time in the names of {len(from_mtime)} file(s) "
            f"(e.g. {from_mtime[0]}); their modification time is used"
        )
    timed.sort(key=lambda x: (x[0], x[1].name))
    for i, (t, f) in enumerate(timed):
        yield Scrape(t, read_text(f), str(f), 1, last=i == len(timed) - 1)


def read_text(path: Path) -> str:
    try:
        with open_text(path) as fh:
            return fh.read()
    except EOFError:
        raise InputError(f"{path}: compressed file is cut") from None
