"""The grid of configurations: ``--param NAME=VALUES`` options or a grid YAML file, expanded to
the cartesian product in a fixed order.

Values of one parameter:

* ``16,32,64``: a list;
* ``16..256``: doubling from 16 up to 256 (16, 32, 64, 128, 256), as vLLM's own sweeps of
  ``max_num_seqs`` and ``max_num_batched_tokens`` go;
* ``512..4096:512``: from 512 to 4096 in steps of 512 (also for fractions:
  ``0.8..0.95:0.05``);
* ``true,false`` for switches, names for ``scheduling_policy``.

A grid file holds the same under ``parameters:`` (a YAML list, or one of the strings above)::

    parameters:
      max_num_seqs: 16..256
      max_num_batched_tokens: [1024, 2048, 4096]
      scheduler_reserve_full_isl: [false, true]
      tensor_parallel_size: [4, 8]
    limits: {ttft_p95: 30s, itl_p95: 150ms}     # optional; --limits wins
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.simulation.experiment import ALIASES, ENGINE_ARGS
from kvpressure.user_files import parse_user_yaml, read_user_text

# tensor_parallel_size is not an engine argument of the scheduler but changes the pool, the
# step time and whether vLLM starts at all (heads must divide across the ranks).
PARAMETERS: tuple[str, ...] = (*ENGINE_ARGS, "tensor_parallel_size")
_BOOL = {"enable_chunked_prefill", "enable_prefix_caching", "scheduler_reserve_full_isl"}
_FLOAT = {"gpu_memory_utilization", "watermark"}
_TEXT = {"scheduling_policy"}
# Far past what a cluster finishes in a day on the seed case; a typo like 1..1e9 stops here.
MAX_CONFIGURATIONS = 1_000_000
_RANGE = re.compile(r"^\s*([-+0-9.eE]+)\s*\.\.\s*([-+0-9.eE]+)\s*(?::\s*([-+0-9.eE]+)\s*)?$")

Configuration = dict[str, Any]


def canonical_name(name: str, where: str) -> str:
    name = ALIASES.get(name.strip(), name.strip())
    if name not in PARAMETERS:
        raise InputError(f"{where}: unknown parameter {name!r}; known: {', '.join(PARAMETERS)}")
    return name


def _scalar(name: str, value: Any, where: str) -> Any:
    """One value of ``name`` in its type (text from the command line, or YAML scalars)."""
    text = str(value).strip()
    if name in _BOOL:
        if isinstance(value, bool):
            return value
        if text.lower() in ("true", "yes", "1", "on"):
            return True
        if text.lower() in ("false", "no", "0", "off"):
            return False
        raise InputError(f"{where}: {name} takes true or false, got {text!r}")
    if name in _TEXT:
        if text not in ("fcfs", "priority"):
            raise InputError(f"{where}: {name} takes fcfs or priority, got {text!r}")
        return text
    if isinstance(value, bool):
        raise InputError(f"{where}: {name} takes a number, got {text!r}")
    try:
        number = float(text)
    except ValueError:
        raise InputError(f"{where}: {name} takes a number, got {text!r}") from None
    if not math.isfinite(number):
        raise InputError(f"{where}: {name} takes a finite number, got {text!r}")
    if name in _FLOAT:
        return number
    if number != int(number):
        raise InputError(f"{where}: {name} takes an integer, got {text!r}")
    return int(number)


def _range(name: str, m: re.Match[str], where: str) -> list[Any]:
    lo, hi = _scalar(name, m.group(1), where), _scalar(name, m.group(2), where)
    if hi < lo:
        raise InputError(f"{where}: {name} range {m.group(0).strip()!r} runs backwards")
    out: list[Any] = []
    if m.group(3) is None:
        if not lo > 0:
            raise InputError(f"{where}: {name} doubling range must start above 0 "
                             f"(give LO..HI:STEP for steps)")
        v = lo
        while v <= hi * (1 + 1e-12):
            out.append(v)
            v = v * 2
    else:
        step = _scalar("gpu_memory_utilization" if name in _FLOAT else name, m.group(3), where)
        if not step > 0:
            raise InputError(f"{where}: {name} range step must be > 0")
        n = int(math.floor((hi - lo) / step + 1e-9)) + 1
        if n > MAX_CONFIGURATIONS:
            raise InputError(f"{where}: {name} range has {n:,} values (at most "
                             f"{MAX_CONFIGURATIONS:,})")
        # Values computed from the index, not summed, so 0.8..0.95:0.05 ends on 0.95 exactly.
        out = [round(lo + k * step, 12) if name in _FLOAT else lo + k * step for k in range(n)]
    return out


def parse_values(name: str, spec: Any, where: str) -> list[Any]:
    """The values one parameter takes, from a YAML list or the text forms of the module doc."""
    if isinstance(spec, list | tuple):
        values = [_scalar(name, v, where) for v in spec]
    elif isinstance(spec, str) and (m := _RANGE.match(spec)) and name not in _BOOL | _TEXT:
        values = _range(name, m, where)
    elif isinstance(spec, str):
        values = [_scalar(name, v, where) for v in spec.split(",") if v.strip()]
    elif spec is None or isinstance(spec, Mapping):
        raise InputError(f"{where}: {name} needs values (a list, LO..HI or LO..HI:STEP)")
    else:
        values = [_scalar(name, spec, where)]
    if not values:
        raise InputError(f"{where}: {name} has no values")
    unique: list[Any] = []
    for v in values:
        if v not in unique:
            unique.append(v)
    return unique


def parse_param_options(options: Sequence[str]) -> dict[str, list[Any]]:
    """``["max_num_seqs=16..256", "scheduler_reserve_full_isl=true,false"]`` -> values."""
    out: dict[str, list[Any]] = {}
    for option in options:
        name, sep, spec = option.partition("=")
        where = f"--param {option!r}"
        if not sep or not name.strip() or not spec.strip():
            raise InputError(f"{where}: expected NAME=VALUES (e.g. max_num_seqs=16..256)")
        key = canonical_name(name, where)
        if key in out:
            raise InputError(f"{where}: {key} given twice")
        out[key] = parse_values(key, spec, where)
    return out


def load_grid_file(path: str | Path) -> tuple[dict[str, list[Any]], str | None]:
    """A grid YAML: its parameters' values and its ``limits`` text (None when absent)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: grid file not found")
    data = parse_user_yaml(read_user_text(p, "grid file"), p)
    if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
        raise InputError(f"{p}: expected a mapping with a 'parameters' mapping "
                         "(parameter: values)")
    unknown = sorted(set(data) - {"parameters", "limits"})
    if unknown:
        raise InputError(f"{p}: unknown field(s) {', '.join(map(str, unknown))}; known: "
                         "parameters, limits")
    out: dict[str, list[Any]] = {}
    for name, spec in data["parameters"].items():
        where = f"{p}: parameters.{name}"
        key = canonical_name(str(name), where)
        if key in out:
            raise InputError(f"{where}: {key} given twice")
        out[key] = parse_values(key, spec, where)
    if not out:
        raise InputError(f"{p}: parameters is empty")
    limits = data.get("limits")
    if isinstance(limits, Mapping):
        limits = ",".join(f"{k}={v}" for k, v in limits.items())
    elif limits is not None and not isinstance(limits, str):
        raise InputError(f"{p}: limits: expected a mapping (ttft_p95: 2s) or a string")
    return out, limits


def expand(values: Mapping[str, Sequence[Any]]) -> list[Configuration]:
    """Every combination, the first parameter varying slowest."""
    names = list(values)
    total = math.prod(len(values[n]) for n in names) if names else 0
    if total > MAX_CONFIGURATIONS:
        raise InputError(f"the grid has {total:,} configurations (at most "
                         f"{MAX_CONFIGURATIONS:,}); narrow a parameter's range")
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(values[n] for n in names))]


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def config_id(config: Mapping[str, Any]) -> str:
    """``max_num_batched_tokens=2048,max_num_seqs=64``: names sorted, so one configuration has
    one id whatever the grid's order; ``baseline`` for no change."""
    if not config:
        return "baseline"
    return ",".join(f"{k}={format_value(config[k])}" for k in sorted(config))


def unique_configs(configs: Iterable[Configuration]) -> list[Configuration]:
    seen: set[str] = set()
    out = []
    for c in configs:
        cid = config_id(c)
        if cid not in seen:
            seen.add(cid)
            out.append(dict(c))
    return out
