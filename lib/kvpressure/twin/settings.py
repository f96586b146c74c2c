"""The engine settings of a measured server, each with where it came from.

Sources, first one that has a setting wins:

1. ``overrides`` (the user's ``--set KEY=VALUE``);
2. an engine-settings file in the run folder: ``engine.json`` / ``engine_args.json`` /
   ``settings.json`` (a flat mapping of vLLM engine arguments, or one under ``engine_args``
   or ``settings``), or ``analysis/collect.json``'s ``settings`` (a report folder);
3. ``runs.csv`` columns named like engine arguments (a simulated sweep writes them), and the
   engine arguments a bench result records (``vllm bench serve --metadata max_num_seqs=64``);
4. ``ingest.json``'s options (``policy``, ``scheduler_reserve_full_isl``);
5. ``vllm:cache_config_info`` in ``series.csv`` (``num_gpu_blocks``, ``block_size``,
   ``enable_prefix_caching``);
6. the server's log (the one given, one the run was ingested from, else a ``*.log`` in the run
   folder): the engine arguments of its start-up lines (``non-default args: {...}``, the
   engine's config line, the resolved pool and ``max_num_batched_tokens``), else the KV-cache
   size and block count lines;
7. vLLM's defaults, marked as assumed.

The pool size (``num_gpu_blocks``) has no default: a twin without it is refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.folders.run_folder import RunFolder, as_run_folder
from kvpressure.simulation.scenario import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    SETTING_NAMES,
)
from kvpressure.stages.results import CollectInfo
from kvpressure.user_files import parse_user_json, read_user_text

ALIASES = {"scheduling_policy": "policy", "num_gpu_blocks_override": "num_gpu_blocks",
           "max_seq_len": "max_model_len"}
DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
    "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "long_prefill_token_threshold": 0,
    "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
}
SETTINGS_FILES = ("engine.json", "engine_args.json", "settings.json")
_BOOL = {"enable_chunked_prefill", "enable_prefix_caching", "scheduler_reserve_full_isl"}
_INT = {"num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
        "max_model_len", "long_prefill_token_threshold", "max_num_active_seqs"}


def _convert(name: str, value: Any, where: str) -> Any:
    if name in _BOOL:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise InputError(f"{where}: {name} must be true or false, got {value!r}")
    if name in _INT:
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{where}: {name} must be an integer, got {value!r}") from None
        if not math.isfinite(f) or f != int(f) or f < 1 and name != "long_prefill_token_threshold":
            raise InputError(f"{where}: {name} must be a positive integer, got {value!r}")
        return int(f)
    if name == "watermark":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InputError(f"{where}: watermark must be a number, got {value!r}") from None
    if name == "policy":
        if value not in ("fcfs", "priority"):
            raise InputError(f"{where}: policy must be fcfs or priority, got {value!r}")
        return value
    return value


def _known(mapping: dict[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for key, value in mapping.items():
        name = ALIASES.get(key, key)
        if name in SETTING_NAMES and value is not None and name != "async_scheduling":
            if isinstance(value, float) and math.isnan(value):
                continue
            out[name] = _convert(name, value, f"{where}: {key}")
        if name == "async_scheduling" and value in (True, "true", "True"):
            raise InputError(f"{where}: async_scheduling is on; the twin models the "
                             "synchronous engine loop only")
    return out


def _settings_file(folder: RunFolder) -> tuple[dict[str, Any], str] | None:
    run_dir = folder.path
    for name in SETTINGS_FILES:
        path = run_dir / name
        if path.is_file():
            data = parse_user_json(read_user_text(path, "engine-arguments file"), path)
            if isinstance(data, dict):
                for key in ("engine_args", "settings", "engine"):
                    if isinstance(data.get(key), dict):
                        data = data[key]
                        break
                return _known(data, str(path)), str(path)
    for held in (folder, RunFolder(run_dir / "report")):
        if held.has_stage(CollectInfo):
            break
    path = held.stage_path(CollectInfo.STAGE)
    if path.is_file():
        try:
            # Stage 01's settings, as the folder has read them already.
            settings = held.stage(CollectInfo).settings
        except InputError:  # not a collect result as this version writes it: its JSON then
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                return None
            if not (isinstance(data, dict) and isinstance(data.get("settings"), dict)):
                return None
            settings = data["settings"]
        return _known(dict(settings), str(path)), str(path)
    return None


def _runs_columns(runs: pd.DataFrame, where: str) -> dict[str, Any]:
    out = {}
    for name in SETTING_NAMES:
        col = name if name in runs.columns else next(
            (a for a, n in ALIASES.items() if n == name and a in runs.columns), None)
        if col is None:
            continue
        values = runs[col].dropna().unique()
        if len(values) == 1:
            out.update(_known({name: values[0]}, f"{where} column {col}"))
    return out


_LOG_PATTERNS = (
    # vLLM's CPU and GPU workers report the pool in tokens; with the block size it gives blocks.
    (re.compile(r"(?:CPU|GPU) KV cache size:\s*([\d,]+)\s*tokens"), "kv_cache_tokens"),
    (re.compile(r"#\s*(?:GPU|CPU) blocks:\s*(\d+)"), "num_gpu_blocks"),
    (re.compile(r"num_gpu_blocks_override=(\d+)"), "num_gpu_blocks"),
    (re.compile(r"max_seq_len=(\d+)"), "max_model_len"),
    (re.compile(r"--block-size[ =](\d+)|block_size=(\d+)"), "block_size"),
)


def _start_up_args(path: Path) -> dict[str, Any]:
    """The engine arguments a vLLM log's start-up lines show (``ingestion.server_log``)."""
    from kvpressure.ingestion.server_log import engine_args, read_events

    try:
        log = read_events(path)
    except (InputError, OSError, UnicodeDecodeError):
        return {}
    startup = [e for e in log.events if e.kind == "startup"]
    args = engine_args(startup, [], path)
    # The pool in tokens is the caller's to turn into blocks (it needs the block size).
    args.pop("kv_cache_size_tokens", None)
    return _known(args, str(path))


def _server_log(run_dir: Path, logs: list[Path]) -> tuple[dict[str, Any], str] | None:
    seen: set[Path] = set()
    for path in [*logs, *sorted(run_dir.glob("*.log"))]:
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        found = _start_up_args(path)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for pattern, name in _LOG_PATTERNS:
            m = pattern.search(text)
            if m:
                value = next(g for g in m.groups() if g is not None)
                found.setdefault(name, int(value.replace(",", "")))
        if found:
            return found, str(path)
    return None


def twin_settings(run_dir: RunFolder | Path, runs: pd.DataFrame, series: pd.DataFrame | None,
                  ingest: dict[str, Any], overrides: Mapping[str, Any] | None = None,
                  logs: list[Path] | None = None, bench: dict[str, Any] | None = None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """``(settings, source of each setting)`` for the scheduler of the twin; ``logs`` are the
    server logs known besides the run folder's own (given, or ingested from)."""
    from kvpressure.ingestion.cache_config import cache_config

    layers: list[tuple[dict[str, Any], str]] = []
    if overrides:
        layers.append((_known(dict(overrides), "--set"), "given (--set)"))
    folder = as_run_folder(run_dir)
    run_dir = folder.path
    got = _settings_file(folder)
    if got:
        layers.append((got[0], got[1]))
    layers.append((_runs_columns(runs, "runs.csv"), "runs.csv"))
    if bench:
        layers.append((_known(dict(bench), "bench result"), "the bench result (--metadata)"))
    got_options = ingest.get("options")
    options: dict[str, Any] = got_options if isinstance(got_options, dict) else {}
    layers.append((_known({k: options.get(k) for k in ("policy", "scheduler_reserve_full_isl")},
                          "ingest.json options"), "ingest.json options"))
    if series is not None and not series.empty:
        single = series
        if "run" in series.columns and series["run"].nunique() > 1:
            single = series[series["run"] == series["run"].iloc[0]]
        layers.append((_known(cache_config(single), "series.csv"),
                       "vllm:cache_config_info (series.csv)"))
    log = _server_log(run_dir, list(logs or []))
    log_tokens = None
    if log:
        found, where = log
        log_tokens = found.pop("kv_cache_tokens", None)
        layers.append((_known(found, where), where))
    settings: dict[str, Any] = {}
    source: dict[str, str] = {}
    for values, where in layers:
        for key, value in values.items():
            if key not in settings:
                settings[key], source[key] = value, where
    if log and "num_gpu_blocks" not in settings and log_tokens and "block_size" in settings:
        settings["num_gpu_blocks"] = int(log_tokens) // int(settings["block_size"])
        source["num_gpu_blocks"] = f"{log[1]} (KV cache size in tokens / block_size)"
    if "num_gpu_blocks" not in settings:
        raise InputError(
            f"{run_dir}: the KV pool size is not in the data (no vllm:cache_config_info with "
            "num_gpu_blocks in series.csv, no engine-settings file, no server log); give it "
            "with --set num_gpu_blocks=N")
    for key, value in DEFAULTS.items():
        if key not in settings:
            settings[key], source[key] = value, "vLLM default (assumed: not in the data)"
    if "max_model_len" not in settings:
        # vLLM refuses to start with a max_model_len the pool cannot hold, so the pool bounds it.
        settings["max_model_len"] = settings["num_gpu_blocks"] * settings["block_size"]
        source["max_model_len"] = "assumed: not in the data (the pool size in tokens)"
    return settings, source


def is_assumed(source: str) -> bool:
    """Whether a setting's source (``twin_settings``) says it is not in the data."""
    return "assumed" in source or "default" in source


def assumed_settings(source: dict[str, str]) -> list[str]:
    """The settings the twin was not told and took a default for, sorted."""
    return sorted(k for k, src in source.items() if is_assumed(src))


def parse_set(items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` options as a mapping (the values are checked by ``twin_settings``)."""
    from kvpressure.errors import refuse_unknown

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        # A misspelt setting would leave the twin on the data's value without a word.
        refuse_unknown([key.strip()], [*SETTING_NAMES, *ALIASES], f"--set {item!r}")
        out[key.strip()] = value.strip()
    return out
