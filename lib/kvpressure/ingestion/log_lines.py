"""What the lines of a vLLM server log say: their time, and the messages the kit reads.

A vLLM log line is ``[PREFIX](PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``
(0.10 and later; ``(APIServer pid=1)``, ``(EngineCore_DP0 pid=7)``), ``LEVEL MM-DD HH:MM:SS
[file.py:line] message`` (0.6-0.9) or ``LEVEL MM-DD HH:MM:SS file.py:line] message`` (earlier),
colours included when the terminal had them, or a JSON record per line (``asctime``,
``message``; ``--logging-config.formatter json``). The date has no year. A collector may put its
own ISO 8601 time in front (``docker logs -t``, ``kubectl logs --timestamps``): that one has a
year and wins.

Messages read (by content, wherever they sit on the line):

* periodic stats: ``[Engine 000: ]Avg prompt throughput: X tokens/s, Avg generation throughput:
  Y tokens/s, Running: N reqs, Waiting: M reqs[, Deferred: D reqs][, Preemptions: P], GPU KV
  cache usage: Z%[, Prefix cache hit rate: W%]...`` (V1; ``CPU``/``XPU`` instead of ``GPU`` on
  other devices; ``K Engines Aggregated:`` with data parallelism), and V0's ``..., Running: N
  reqs, Swapped: S reqs, Pending: M reqs, GPU KV cache usage: Z%, CPU KV cache usage: C%.``;
* one line per engine step with ``--enable-logging-iteration-details``: ``[Engine 000: ]
  Iteration(I): A context requests, B context tokens, C generation requests, D generation
  tokens, iteration elapsed time: E ms[ (dummy)], CPU KV cache usage: U%`` (read into a per-step
  frame by ``iteration_log``; a line that starts like one but does not parse is kept as
  ``iteration_malformed`` so that reader can name it);
* V0's preemption warning ``Sequence group X is preempted by PreemptionMode.RECOMPUTE mode
  because there is not enough KV cache space. ... total_num_cumulative_preemption=N`` (printed
  for the 1st, 51st, 101st... preemption);
* start-up lines that size the pool and give the engine arguments: ``# GPU blocks: N[, # CPU
  blocks: M]``, ``GPU KV cache size: N tokens``, ``Maximum concurrency for L tokens per request:
  Xx``, ``num_gpu_blocks is: N``, ``Chunked prefill is enabled with max_num_batched_tokens=N``,
  ``non-default args: {...}``, ``args: Namespace(...)``, ``Initializing a V1 LLM engine (vX)
  with config: ...`` and the server version line.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ISO = re.compile(
    r"^\s*\[?(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?"
    r"(Z|[+-]\d{2}:?\d{2})?\]?\s*"
)
_VLLM = re.compile(
    r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d{2})-(\d{2})\s+(\d{2}):(\d{2}):(\d{2})"
    r"(?:\.(\d+))?\s+\[?[\w./<>-]+:\d+\]\s?"
)

# Periodic stats.
_THROUGHPUT = re.compile(
    r"Avg prompt throughput:\s*(\d+(?:\.\d+)?)\s*tokens/s,\s*"
    r"Avg generation throughput:\s*(\d+(?:\.\d+)?)\s*tokens/s"
)
_ENGINE_PREFIX = re.compile(r"Engine\s+(\d+)\s*:\s*$")
_ENGINE = re.compile(r"(?:Engine\s+(\d+)|(\d+)\s+Engines\s+Aggregated)\s*:\s*Avg prompt")
_COUNTS = {
    "running": re.compile(r"\bRunning:\s*(\d+)\s*reqs"),
    "waiting": re.compile(r"\b(?:Waiting|Pending):\s*(\d+)\s*reqs"),
    "swapped": re.compile(r"\bSwapped:\s*(\d+)\s*reqs"),
    "deferred": re.compile(r"\bDeferred:\s*(\d+)\s*reqs"),
    "preemptions": re.compile(r"\bPreemptions:\s*(\d+)"),
}
_USAGE = re.compile(r"\b(\w+(?: \+ host)?) KV cache usage:\s*(\d+(?:\.\d+)?)%")
_RATES = {
    # case matters: "External prefix cache hit rate" must not read as the local one
    "prefix_cache_hit_rate": re.compile(r"(?<![A-Za-z] )Prefix cache hit rate:\s*(\d+(?:\.\d+)?)%"),
    "external_prefix_cache_hit_rate": re.compile(
        r"External prefix cache hit rate:\s*(\d+(?:\.\d+)?)%"),
    "mm_cache_hit_rate": re.compile(r"MM cache hit rate:\s*(\d+(?:\.\d+)?)%"),
}
_V0_PREFIX_RATE = re.compile(
    r"Prefix cache hit rate:\s*GPU:\s*(\d+(?:\.\d+)?)%,\s*CPU:\s*(\d+(?:\.\d+)?)%")

# One engine step (V1, --enable-logging-iteration-details).
_ITERATION_HEAD = re.compile(r"\bIteration\((\d+)\):")
_ITERATION = re.compile(
    r"\bIteration\((\d+)\):\s*(\d+) context requests,\s*(\d+) context tokens,\s*"
    r"(\d+) generation requests,\s*(\d+) generation tokens,\s*"
    r"iteration elapsed time:\s*(\d+(?:\.\d+)?) ms( \(dummy\))?"
    r"(?:,\s*(\w+(?: \+ host)?) KV cache usage:\s*(\d+(?:\.\d+)?)%)?"
)

# Preemption warnings (V0, and the early V1 prototype's "request X is preempted by RECOMPUTE").
_PREEMPTED = re.compile(
    r"is preempted by (?:PreemptionMode\.)?(\w+) mode\b.*?total_num_cumulative_preemption=(\d+)"
)

# Start-up lines.
_BLOCKS = re.compile(r"#\s*(\w+) blocks:\s*(\d+)(?:,\s*#\s*CPU blocks:\s*(\d+))?")
_KV_SIZE = re.compile(r"\b(\w+(?: \+ host)?) KV cache size:\s*(\d[\d,]*)\s*tokens")
_MAX_CONCURRENCY = re.compile(
    r"Maximum concurrency for\s*(\d[\d,]*)\s*tokens per request:\s*(\d+(?:\.\d+)?)x"
)
_GPU_BLOCKS_IS = re.compile(r"num_gpu_blocks is:\s*(\d+)")
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_NON_DEFAULT = re.compile(r"non-default args:\s*\{(.*)\}\s*$")
_NAMESPACE = re.compile(r"\bargs:\s*Namespace\((.*)\)\s*$")
_ENGINE_CONFIG = re.compile(
    r"Initializing an? (V1 )?LLM engine \(v([^)\s]+)\) with config:\s*(.*)$"
)
_VERSION = re.compile(r"vLLM (?:API )?server version\s+([\w.+-]+)")
_LOGO_VERSION = re.compile(r"[\u2580-\u259f].*\bversion\s+(\d+\.\d+[\w.+-]*)\s*$")

# Engine arguments read from the argument and config lines, and how to read their values.
ENGINE_ARG_KEYS = (
    "model", "served_model_name", "max_num_seqs", "max_num_batched_tokens", "block_size",
    "num_gpu_blocks_override", "gpu_memory_utilization", "enable_prefix_caching",
    "enable_chunked_prefill", "max_model_len", "scheduling_policy", "scheduler_reserve_full_isl",
    "tensor_parallel_size", "kv_cache_memory_bytes",
)
_DEVICE = re.compile(r"(?<![\w.])device_config=([\w:-]+)")  # cuda, cpu, xpu, npu...
_CONFIG_ALIASES = {"max_seq_len": "max_model_len"}  # the config line's name for max_model_len


@dataclass
class Stamp:
    """A line's time: absolute (ISO with a zone) or a wall-clock date without a year."""

    line: int
    iso: _dt.datetime | None = None  # from an ISO prefix (aware, or naive local)
    month: int = 0
    day: int = 0
    hms: tuple[int, int, int] = (0, 0, 0)
    frac: float = 0.0


@dataclass
class Event:
    """One line the kit reads: its kind, its stamp and what it says."""

    kind: str  # stats | preemption | startup | v0_prefix_rate
    stamp: Stamp
    values: dict[str, Any] = field(default_factory=dict)
    t: float = float("nan")  # unix seconds, set once the year is known


def from_json(line: str) -> str:
    """A JSON log record (``{"asctime": ..., "levelname": ..., "message": ...}``, vLLM's
    ``--logging-config.formatter json``) as ``<asctime> <message>``; other lines unchanged."""
    if not line.startswith("{"):
        return line
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(obj, dict) or not isinstance(obj.get("message"), str):
        return line
    when = obj.get("asctime", obj.get("timestamp", ""))
    return f"{when} {obj['message']}" if isinstance(when, str) else obj["message"]


def strip_colours(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def may_hold_message(line: str) -> bool:
    """A cheap first look: False means the line holds no message this module reads.

    Most of a busy server's log is request and access lines; substring tests (a chain of
    ``in``, several times faster than one alternation regex) skip them."""
    return ("throughput:" in line or "preempted by" in line or "blocks:" in line
            or "KV cache size" in line or "Maximum concurrency" in line
            or "num_gpu_blocks is" in line or "Chunked prefill" in line or "args:" in line
            or "LLM engine" in line or "version" in line or "hit rate: GPU" in line
            or "Iteration(" in line)


def split_prefix(line: str, lineno: int) -> tuple[Stamp | None, str]:
    """The line's time and its message (the line itself when it has no known prefix)."""
    iso_stamp: Stamp | None = None
    rest = line
    m = _ISO.match(line)
    if m:
        y, mo, d, h, mi, s, frac, zone = m.groups()
        try:
            when = _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s))
        except ValueError:
            when = None
        zone_info = _zone(zone) if zone else None
        if zone and zone_info is None:
            when = None
        if when is not None:
            if zone_info is not None:
                when = when.replace(tzinfo=zone_info)
            iso_stamp = Stamp(lineno, iso=when, frac=float("0." + frac) if frac else 0.0)
            rest = line[m.end():]
    v = _VLLM.search(rest)
    if v:
        _level, mo, d, h, mi, s, frac = v.groups()
        message = rest[v.end():]
        if iso_stamp is not None:
            return iso_stamp, message
        return Stamp(lineno, month=int(mo), day=int(d), hms=(int(h), int(mi), int(s)),
                     frac=float("0." + frac) if frac else 0.0), message
    return iso_stamp, rest


def _zone(text: str) -> _dt.tzinfo | None:
    """The zone of an ISO suffix; None for an offset no zone has (the line is then undated)."""
    if text == "Z":
        return _dt.UTC
    sign = 1 if text[0] == "+" else -1
    digits = text[1:].replace(":", "")
    try:
        return _dt.timezone(sign * _dt.timedelta(hours=int(digits[:2]),
                                                 minutes=int(digits[2:])))
    except ValueError:
        return None


def has_log_prefix(line: str) -> bool:
    """Whether a line carries vLLM's log prefix (``INFO 12-01 14:25:31 [file.py:12]``)."""
    return _VLLM.search(strip_colours(line)) is not None


def has_known_message(line: str) -> bool:
    """Whether a line holds one of the messages this module reads."""
    return parse_message(strip_colours(line)) is not None


def parse_message(message: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, values) of one message (or whole line), or None when the kit does not read it."""
    if not may_hold_message(message):
        return None
    if _ITERATION_HEAD.search(message):
        return _iteration(message)
    m = _THROUGHPUT.search(message)
    if m:
        return "stats", _stats(message, m)
    m = _PREEMPTED.search(message)
    if m:
        return "preemption", {"mode": m.group(1), "cumulative": int(m.group(2))}
    m = _V0_PREFIX_RATE.search(message)
    if m:
        return "v0_prefix_rate", {"gpu": float(m.group(1)) / 100, "cpu": float(m.group(2)) / 100}
    startup = _startup(message)
    if startup:
        return "startup", startup
    return None


def _iteration(message: str) -> tuple[str, dict[str, Any]]:
    m = _ITERATION.search(message)
    if m is None:
        return "iteration_malformed", {"text": message.strip()[:160]}
    e = _ENGINE_PREFIX.search(message[:m.start()])
    return "iteration", {
        "engine": str(int(e.group(1))) if e else None,
        "iteration": int(m.group(1)),
        "context_requests": int(m.group(2)),
        "context_tokens": int(m.group(3)),
        "generation_requests": int(m.group(4)),
        "generation_tokens": int(m.group(5)),
        "elapsed_ms": float(m.group(6)),
        "dummy": m.group(7) is not None,
        "kv_cache_usage": float(m.group(9)) / 100 if m.group(9) is not None else None,
    }


def _stats(message: str, m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tps": float(m.group(1)),
        "generation_tps": float(m.group(2)),
        "engine": None,
    }
    e = _ENGINE.search(message)
    if e and e.group(1) is not None:
        out["engine"] = str(int(e.group(1)))  # "Engine 000" is engine="0" in /metrics
    elif e:
        out["engine"] = "aggregated"
        out["engines_aggregated"] = int(e.group(2))
    for key, rx in _COUNTS.items():
        c = rx.search(message)
        if c:
            out[key] = int(c.group(1))
    out["usage"] = [(dev, float(pct) / 100) for dev, pct in _USAGE.findall(message)]
    for key, rx in _RATES.items():
        r = rx.search(message)
        if r:
            out[key] = float(r.group(1)) / 100
    return out


def _startup(message: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _BLOCKS.search(message)
    if m:
        device, n, cpu = m.groups()
        out["pool_device"] = device
        out["num_gpu_blocks"] = int(n)
        if cpu is not None:
            out["num_cpu_blocks"] = int(cpu)
    m = _KV_SIZE.search(message)
    if m:
        out["pool_device"] = m.group(1)
        out["kv_cache_size_tokens"] = int(m.group(2).replace(",", ""))
    m = _MAX_CONCURRENCY.search(message)
    if m:
        out["max_model_len"] = int(m.group(1).replace(",", ""))
        out["max_concurrency"] = float(m.group(2))
    m = _GPU_BLOCKS_IS.search(message)
    if m:
        out["num_gpu_blocks"] = int(m.group(1))
    m = _CHUNKED.search(message)
    if m:
        out["max_num_batched_tokens"] = int(m.group(1))
    m = _NON_DEFAULT.search(message)
    if m:
        out["args"] = _dict_items(m.group(1))
        out["server_start"] = True
    m = _NAMESPACE.search(message)
    if m:
        out["args"] = _keyword_items(m.group(1))
        out["server_start"] = True
    m = _ENGINE_CONFIG.search(message)
    if m:
        out["engine_generation"] = "v1" if m.group(1) else "v0"
        out["version"] = m.group(2)
        out["config"] = _keyword_items(m.group(3))
        device = _DEVICE.search(m.group(3))
        if device:
            out["device"] = device.group(1)
        out["engine_start"] = True
    m = _VERSION.search(message) or _LOGO_VERSION.search(message)
    if m:
        out["version"] = m.group(1)
        out["server_start"] = True
    return out


_VALUE = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]]*\]|[^,\s)}]+)"


def _dict_items(text: str) -> dict[str, Any]:
    """The engine arguments of a printed dict (``{'max_num_seqs': 64, ...}``), read key by key:
    values such as ``CompilationConfig(...)`` are not Python literals."""
    out = {}
    for key in ENGINE_ARG_KEYS:
        m = re.search(r"['\"]" + key + r"['\"]\s*:\s*" + _VALUE, text)
        if m:
            out[key] = _value(m.group(1))
    return out


def _keyword_items(text: str) -> dict[str, Any]:
    """The engine arguments of ``key=value, ...`` text (a Namespace or the config line)."""
    out = {}
    for key in (*ENGINE_ARG_KEYS, *_CONFIG_ALIASES):
        m = re.search(r"(?<![\w.])" + key + r"=" + _VALUE, text)
        if m:
            out[_CONFIG_ALIASES.get(key, key)] = _value(m.group(1))
    return out


def _value(text: str) -> Any:
    if text[:1] == "[":  # served_model_name as a list: the first name is the one exported
        names = re.findall(r"'([^']*)'|\"([^\"]*)\"", text)
        return next((a or b for a, b in names), None)
    if text[:1] in ("'", '"'):
        return text[1:-1]
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


_PROM_LINE = re.compile(
    r"^(?:#\s*(?:HELP|TYPE)\s|[a-zA-Z_:][\w:]*(?:\{[^}]*\})?\s+[-+]?(?:[\d.]+(?:[eE][-+]?\d+)?"
    r"|NaN|Inf)(?:\s+\d+)?\s*$)"
)


def looks_like_server_log(head: str, max_lines: int = 2000) -> bool:
    """Whether the first lines of a text are a vLLM server log (its prefix, or a message this
    module reads) rather than anything else."""
    for i, line in enumerate(head.splitlines()):
        if i >= max_lines:
            break
        if has_log_prefix(line) or has_known_message(line):
            return True
    return False


def looks_like_prometheus(head: str, max_lines: int = 200) -> bool:
    """Whether the first lines of a text hold a Prometheus exposition line."""
    for i, line in enumerate(head.splitlines()):
        if i >= max_lines:
            break
        if _PROM_LINE.match(line.strip()):
            return True
    return False
