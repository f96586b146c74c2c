"""The step-level workload (docs/interfaces.md#scenario-json): parsing, vLLM 0.33.0 defaults,
validation.

Everything invalid is refused here, before anything runs, with an ``InputError`` naming the
field and the request id.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError, nearest, refuse_unknown
from kvpressure.user_files import parse_user_json, read_user_text

# vLLM 0.33.0's SchedulerConfig fallbacks (no usage context), config/scheduler.py.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class SchedulerSettings:
    """Engine arguments that drive the scheduler, with vLLM's names."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_num_active_seqs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(SchedulerSettings))
_INT_SETTINGS = {"num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                 "long_prefill_token_threshold", "max_model_len", "max_num_active_seqs"}
_BOOL_SETTINGS = {"enable_chunked_prefill", "enable_prefix_caching",
                  "scheduler_reserve_full_isl", "async_scheduling"}
# Steps are counted in 64-bit integers (numpy), and times in float64 from them.
MAX_ARRIVAL_STEP = 2**53
# The block pool is materialised lazily (block_pool.py): memory follows the blocks a run uses,
# not the pool's nominal size. The bound is vLLM's own: its block tables hold int32 ids.
MAX_NUM_GPU_BLOCKS = 2**31 - 1
# What the pool's tables cost per block once used (links, reference count, key slot).
BYTES_PER_BLOCK = 96


def check_pool_memory(num_gpu_blocks: int, where: str) -> None:
    """Refuse a pool beyond vLLM's int32 block ids (a nominal size alone costs nothing)."""
    if num_gpu_blocks > MAX_NUM_GPU_BLOCKS:
        raise InputError(f"{where} {num_gpu_blocks}: beyond vLLM's block ids (int32, at most "
                         f"{MAX_NUM_GPU_BLOCKS:,}); a pool that size, used, would need about "
                         f"{num_gpu_blocks * BYTES_PER_BLOCK / 2**30:,.0f} GiB of host memory "
                         "to simulate")


_REQUEST_KEYS = {"id", "prompt_len", "output_len", "arrival_step", "arrival_time_s",
                 "priority", "prefix_group", "prefix_len"}
_TOP_KEYS = {"name", "description", "seed", "mode", "settings", "prefix_groups", "requests"}
# Notes the kit itself writes (experiment points).
_KIT_NOTES = {"refused_requests"}


@dataclass
class RequestSpec:
    """One request of the workload, as written."""

    id: str
    prompt_len: int
    output_len: int
    arrival_step: int = 0
    arrival_time_s: float | None = None
    priority: int = 0
    prefix_group: str | None = None
    prefix_len: int = 0


@dataclass
class Scenario:
    name: str
    description: str
    seed: int | None
    mode: str
    concurrency: int | None
    settings: SchedulerSettings
    prefix_groups: dict[str, dict[str, Any]]
    requests: list[RequestSpec]
    annotations: dict[str, Any] = field(default_factory=dict)
    source: str = "<dict>"
    # Closed loop only (docs/interfaces.md#scenario-json): how many engine steps a client takes
    # to come back after its request finishes, and whether the first request starts alone.
    return_steps: int = 0
    first_alone: bool = False


def _where(source: str) -> str:
    return f"{source}: " if source else ""


def _int(value: Any, what: str, source: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputError(f"{_where(source)}{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(f"{_where(source)}{what} must be >= {minimum}, got {value}")
    return value


def parse_setting_value(key: str, text: str) -> Any:
    """A ``--set KEY=VALUE`` value: JSON literal when it parses, else the bare string."""
    if key not in SETTING_NAMES:
        raise InputError(f"--set: unknown setting {key!r} (known: {', '.join(SETTING_NAMES)})")
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def load_scenario(source: str | Path | dict | list,
                  overrides: dict[str, Any] | None = None) -> Scenario:
    """Read a workload from a JSON file path, a dict, or a bare list of requests."""
    where = "<dict>"
    if isinstance(source, (str, Path)):
        path = Path(source)
        where = str(path)
        data = parse_user_json(read_user_text(path, "scenario file"), path)
    else:
        data = source
    if isinstance(data, list):
        data = {"requests": data}
    if not isinstance(data, dict):
        raise InputError(f"{where}: a scenario is a JSON object or a list of requests")
    # Other top-level keys are notes (annotations), unless they look like a misspelt field:
    # "mdoe" would otherwise silently run an open loop.
    for key in data:
        guess = None if key in _TOP_KEYS | _KIT_NOTES else nearest(str(key), _TOP_KEYS)
        if guess:
            raise InputError(f"{where}: unknown key {key!r}; did you mean {guess!r}? (other "
                             "top-level keys are kept as notes)")
    annotations = {k: v for k, v in data.items() if k not in _TOP_KEYS}
    name = str(data.get("name") or (Path(where).stem.removesuffix(".scenario")
                                    if where != "<dict>" else "scenario"))
    description = str(data.get("description") or "")
    seed = data.get("seed")
    if seed is not None:
        seed = _int(seed, "seed", where, 0)
    mode_raw = data.get("mode", {"type": "open"})
    if isinstance(mode_raw, str):
        mode_raw = {"type": mode_raw}
    if not isinstance(mode_raw, dict):
        raise InputError(f"{where}: mode must be an object like {{\"type\": \"open\"}}")
    mode = mode_raw.get("type", "open")
    if mode not in ("open", "closed"):
        raise InputError(f"{where}: mode.type: unknown mode {mode!r} (open or closed)")
    refuse_unknown(mode_raw, ("type", "concurrency", "return_steps", "first_alone"),
                   f"{where}: mode")
    concurrency = None
    return_steps = 0
    first_alone = False
    if mode == "closed":
        if "concurrency" not in mode_raw:
            raise InputError(f"{where}: mode.concurrency is required for a closed loop")
        concurrency = _int(mode_raw["concurrency"], "mode.concurrency", where, 1)
        return_steps = _int(mode_raw.get("return_steps", 0), "mode.return_steps", where, 0)
        if return_steps > MAX_ARRIVAL_STEP:
            raise InputError(f"{where}: mode.return_steps {return_steps} is beyond the last "
                             f"step the simulation can count ({MAX_ARRIVAL_STEP})")
        first_alone = mode_raw.get("first_alone", False)
        if not isinstance(first_alone, bool):
            raise InputError(f"{where}: mode.first_alone must be true or false, got "
                             f"{first_alone!r}")
    else:
        for key in ("return_steps", "first_alone"):
            if key in mode_raw:
                raise InputError(f"{where}: mode.{key} applies to a closed loop only "
                                 "(mode.type is open)")
    settings_raw = data.get("settings", {})
    if not isinstance(settings_raw, dict):
        raise InputError(f"{where}: settings must be an object")
    settings_raw = dict(settings_raw)
    if overrides:
        settings_raw.update(overrides)
    groups_raw = data.get("prefix_groups", {}) or {}
    if not isinstance(groups_raw, dict):
        raise InputError(f"{where}: prefix_groups must be an object name -> {{length}}")
    groups: dict[str, dict[str, Any]] = {}
    for gname, g in groups_raw.items():
        if not isinstance(g, dict) or "length" not in g:
            raise InputError(f"{where}: prefix_groups.{gname}: needs a 'length'")
        groups[str(gname)] = {**g, "length": _int(g["length"], f"prefix_groups.{gname}.length",
                                                  where, 0)}
    reqs_raw = data.get("requests")
    if not isinstance(reqs_raw, list) or not reqs_raw:
        raise InputError(f"{where}: requests must be a non-empty list")
    requests: list[RequestSpec] = []
    for i, r in enumerate(reqs_raw):
        if not isinstance(r, dict):
            raise InputError(f"{where}: requests[{i}] must be an object")
        rid = str(r.get("id", f"r{i}"))
        ctx = f"request {rid!r} (requests[{i}])"
        refuse_unknown(r, _REQUEST_KEYS, f"{where}: {ctx}")
        for key in ("prompt_len", "output_len"):
            if key not in r:
                raise InputError(f"{where}: {ctx}: missing field {key!r}")
        prompt_len = _int(r["prompt_len"], f"{ctx}: prompt_len", where, 1)
        output_len = _int(r["output_len"], f"{ctx}: output_len", where, 1)
        arrival_step = _int(r.get("arrival_step", 0), f"{ctx}: arrival_step", where, 0)
        if arrival_step > MAX_ARRIVAL_STEP:
            raise InputError(f"{where}: {ctx}: arrival_step {arrival_step} is beyond the last "
                             f"step the simulation can count ({MAX_ARRIVAL_STEP})")
        arrival_time_s = r.get("arrival_time_s")
        if arrival_time_s is not None:
            if isinstance(arrival_time_s, bool) or not isinstance(arrival_time_s, (int, float)) \
                    or arrival_time_s < 0 or arrival_time_s != arrival_time_s:
                raise InputError(f"{where}: {ctx}: arrival_time_s must be a number >= 0")
            arrival_time_s = float(arrival_time_s)
        priority = _int(r.get("priority", 0), f"{ctx}: priority", where)
        group = r.get("prefix_group")
        prefix_len = 0
        if group is not None:
            group = str(group)
            if group not in groups:
                raise InputError(f"{where}: {ctx}: prefix_group: unknown prefix group {group!r}")
            if "prefix_len" in r:
                prefix_len = _int(r["prefix_len"], f"{ctx}: prefix_len", where, 0)
                if prefix_len > prompt_len:
                    raise InputError(f"{where}: {ctx}: prefix_len {prefix_len} exceeds "
                                     f"prompt_len {prompt_len}")
                if prefix_len > groups[group]["length"]:
                    # Tokens past the group's shared prefix are not shared: undefined.
                    raise InputError(f"{where}: {ctx}: prefix_len {prefix_len} exceeds the "
                                     f"length {groups[group]['length']} of prefix group "
                                     f"{group!r}")
            else:
                prefix_len = min(groups[group]["length"], prompt_len)
        elif "prefix_len" in r:
            raise InputError(f"{where}: {ctx}: prefix_len given without prefix_group")
        requests.append(RequestSpec(rid, prompt_len, output_len, arrival_step, arrival_time_s,
                                    priority, group, prefix_len))
    sc = _build(name, description, seed, mode, concurrency, settings_raw, groups, requests,
                annotations, where, explicit=set(settings_raw))
    sc.return_steps = return_steps
    sc.first_alone = first_alone
    return sc


def _build(name, description, seed, mode, concurrency, settings_raw, groups, requests,
           annotations, where, explicit) -> Scenario:
    seen: set[str] = set()
    for r in requests:
        if r.id in seen:
            raise InputError(f"{where}: request {r.id!r}: duplicate id")
        seen.add(r.id)
    settings = resolve_settings(settings_raw, requests, where)
    mml = settings.max_model_len
    B = settings.block_size
    usable = settings.num_gpu_blocks - 1
    for r in requests:
        if r.prompt_len >= mml:
            raise InputError(
                f"{where}: request {r.id!r}: prompt_len {r.prompt_len} >= max_model_len {mml} "
                "(vLLM's frontend rejects it)")
        # The longest sequence that ever needs KV slots: the last sampled token is never
        # written back, and max_model_len caps the sequence.
        longest = min(r.prompt_len + r.output_len - 1, mml - 1)
        if -(-longest // B) > usable:
            raise InputError(
                f"{where}: request {r.id!r}: cannot finish: {longest} tokens need "
                f"{-(-longest // B)} blocks but the pool has only {usable} usable blocks "
                f"(num_gpu_blocks {settings.num_gpu_blocks} minus the null block)")
    return Scenario(name=name, description=description, seed=seed, mode=mode,
                    concurrency=concurrency, settings=settings, prefix_groups=groups,
                    requests=requests, annotations=annotations, source=where)


def resolve_settings(raw: dict[str, Any], requests: list[RequestSpec],
                     where: str = "") -> SchedulerSettings:
    """Fill vLLM 0.33.0's defaults and apply its configuration checks
    (docs/scheduler.md#cfg-defaults, docs/scheduler.md#cfg-checks)."""
    refuse_unknown(raw, SETTING_NAMES, f"{_where(where)}settings")
    vals: dict[str, Any] = {}
    for k, v in raw.items():
        if v is None and k in ("max_num_active_seqs", "max_model_len", "max_num_seqs",
                               "max_num_batched_tokens", "async_scheduling"):
            continue
        if k in _INT_SETTINGS:
            vals[k] = _int(v, f"settings.{k}", where, 0)
        elif k in _BOOL_SETTINGS:
            if not isinstance(v, bool):
                raise InputError(f"{_where(where)}settings.{k} must be true or false, got {v!r}")
            vals[k] = v
        elif k == "watermark":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise InputError(f"{_where(where)}settings.watermark must be in [0, 1), "
                                 f"got {v!r}")
            vals[k] = float(v)
        elif k == "policy":
            if v not in ("fcfs", "priority"):
                raise InputError(f"{_where(where)}settings.policy: unknown policy {v!r} "
                                 "(fcfs or priority)")
            vals[k] = v
    if "num_gpu_blocks" not in vals:
        raise InputError(f"{_where(where)}settings.num_gpu_blocks is required")
    if vals["num_gpu_blocks"] < 2:
        raise InputError(f"{_where(where)}settings.num_gpu_blocks must be >= 2 "
                         "(block 0 is the null block)")
    check_pool_memory(vals["num_gpu_blocks"], f"{_where(where)}settings.num_gpu_blocks")
    if vals.get("block_size", 16) < 1:
        raise InputError(f"{_where(where)}settings.block_size must be >= 1")
    chunked = vals.get("enable_chunked_prefill", True)
    longest = max((r.prompt_len + r.output_len for r in requests), default=0)
    if "max_model_len" not in vals:
        if not chunked and "max_num_batched_tokens" in vals:
            vals["max_model_len"] = vals["max_num_batched_tokens"]
        else:
            vals["max_model_len"] = max(DEFAULT_MAX_MODEL_LEN, longest)
    if "max_num_batched_tokens" not in vals:
        mnbt = DEFAULT_MAX_NUM_BATCHED_TOKENS
        if not chunked:
            mnbt = max(mnbt, vals["max_model_len"])
        vals["max_num_batched_tokens"] = mnbt
    if "max_num_seqs" not in vals:
        vals["max_num_seqs"] = min(DEFAULT_MAX_NUM_SEQS, vals["max_num_batched_tokens"])
    for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if vals[k] < 1:
            raise InputError(f"{_where(where)}settings.{k} must be >= 1")
    if vals.get("max_num_active_seqs") is not None and vals["max_num_active_seqs"] < 1:
        raise InputError(f"{_where(where)}settings.max_num_active_seqs must be >= 1")
    if vals["max_num_batched_tokens"] < vals["max_num_seqs"]:
        raise InputError(
            f"{_where(where)}settings.max_num_batched_tokens ({vals['max_num_batched_tokens']}) "
            f"must be >= max_num_seqs ({vals['max_num_seqs']}) (vLLM's config check)")
    if vals.get("long_prefill_token_threshold", 0) > vals["max_model_len"]:
        raise InputError(
            f"{_where(where)}settings.long_prefill_token_threshold "
            f"({vals['long_prefill_token_threshold']}) cannot be greater than max_model_len "
            f"({vals['max_model_len']}) (vLLM's SchedulerConfig check)")
    if not chunked and vals["max_num_batched_tokens"] < vals["max_model_len"]:
        raise InputError(
            f"{_where(where)}settings.max_num_batched_tokens ({vals['max_num_batched_tokens']}) "
            f"must be >= max_model_len ({vals['max_model_len']}) when chunked prefill is "
            "disabled (vLLM's config check)")
    vals.setdefault("async_scheduling", False)
    return SchedulerSettings(**vals)
