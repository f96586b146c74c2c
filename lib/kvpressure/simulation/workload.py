"""Seeded request sets for experiments: length distributions, prefix groups, priorities, arrivals.

The generator produces the request dicts of the step-level workload
(``docs/interfaces.md#scenario-json``: ``id, prompt_len, output_len`` and optionally
``priority, prefix_group, prefix_len``), plus
``arrival_time_s`` for open-loop workloads. Closed-loop workloads carry no arrival times: the
driving loop keeps ``concurrency`` requests in flight, like ``vllm bench serve
--max-concurrency``. The same specification and seed give the same requests, whatever the
concurrency level, so a sweep replays one fixed request set at every point.

Every random aspect draws from its own stream spawned from ``seed``, so changing, say, the
priority mix leaves the lengths and the arrival times unchanged.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvpressure.errors import InputError, nearest
from kvpressure.user_files import parse_user_json, read_user_text

Z90 = 1.2815515655446004  # standard normal quantile at 0.90


# A simulated request costs about this much memory (its spec, state and output rows); a
# workload this large would exhaust a workstation long before it finished.
BYTES_PER_REQUEST = 4096
MAX_REQUESTS = 5_000_000


class _Strict(BaseModel):
    # NaN and infinity are refused wherever a number is read (a rate says when it takes .inf);
    # strict: YAML's `true` is no count and `3.5` no token length.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


# --- length distributions ---------------------------------------------------------------------
class _Bounds(_Strict):
    min: int = Field(1, ge=1, description="smallest length kept (values below are clipped)")
    max: int | None = Field(None, ge=1, description="largest length kept (clipped)")

    @model_validator(mode="after")
    def _ordered(self) -> _Bounds:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def clip(self, values: np.ndarray) -> np.ndarray:
        hi = self.max if self.max is not None else np.iinfo(np.int64).max
        return np.clip(np.rint(values), self.min, hi).astype(np.int64)


class FixedLength(_Strict):
    type: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed {self.value}"


class UniformLength(_Strict):
    type: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None) -> np.ndarray:
        # Integers in [low, high], both ends included.
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform [{self.low}, {self.high}]"


class NormalLength(_Bounds):
    type: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None) -> np.ndarray:
        return self.clip(rng.normal(self.mean, self.std, size=n))

    def describe(self) -> str:
        return f"normal mean {self.mean:g} std {self.std:g}, clipped to [{self.min}, {self.max}]"


class LognormalLength(_Bounds):
    """Either ``mean`` (of the lengths) with ``sigma`` (of their logarithm), or ``median`` with
    ``p90`` (both of the lengths)."""

    type: Literal["lognormal"] = "lognormal"
    mean: float | None = Field(None, gt=0)
    sigma: float | None = Field(None, ge=0)
    median: float | None = Field(None, gt=0)
    p90: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_form(self) -> LognormalLength:
        by_mean = self.mean is not None and self.sigma is not None
        by_median = self.median is not None and self.p90 is not None
        if by_mean == by_median:
            raise ValueError("give either mean and sigma, or median and p90 (not both)")
        if self.median is not None and self.p90 is not None and self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90:g}) must be >= median ({self.median:g})")
        return self

    def log_params(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal."""
        if self.median is not None and self.p90 is not None:
            sigma = math.log(self.p90 / self.median) / Z90
            return math.log(self.median), sigma
        assert self.mean is not None and self.sigma is not None  # the validator's one form
        return math.log(self.mean) - self.sigma**2 / 2.0, self.sigma

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None) -> np.ndarray:
        mu, sigma = self.log_params()
        return self.clip(rng.lognormal(mu, sigma, size=n))

    def describe(self) -> str:
        mu, sigma = self.log_params()
        return f"lognormal median {math.exp(mu):.0f} sigma {sigma:.2f}"


class EmpiricalLength(_Strict):
    """Sampled with replacement from observed lengths: a file with one length per line, or a
    CSV column."""

    type: Literal["empirical"] = "empirical"
    path: str
    column: str | None = None

    def values(self, base_dir: Path | None) -> np.ndarray:
        path = Path(self.path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise InputError(f"{path}: length file not found")
        out: list[int] = []
        with path.open(encoding="utf-8", newline="") as fh:
            if self.column is not None:
                reader = csv.DictReader(fh)
                if reader.fieldnames is None or self.column not in reader.fieldnames:
                    raise InputError(f"{path}: no column '{self.column}'")
                for i, row in enumerate(reader, start=2):
                    out.append(_positive_int(row[self.column], f"{path} line {i}", self.column))
            else:
                for i, line in enumerate(fh, start=1):
                    text = line.strip()
                    if text and not text.startswith("#"):
                        out.append(_positive_int(text, f"{path} line {i}", "length"))
        if not out:
            raise InputError(f"{path}: no lengths in the file")
        return np.asarray(out, dtype=np.int64)

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None) -> np.ndarray:
        values = self.values(base_dir)
        return values[rng.integers(0, len(values), size=n)]

    def describe(self) -> str:
        return f"empirical from {self.path}" + (f" column {self.column}" if self.column else "")


LengthDistribution = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength,
    Field(discriminator="type"),
]


def _coerce_length(value: Any) -> Any:
    """A bare integer means a fixed length."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"type": "fixed", "value": value}
    return value


# --- the rest of the workload -------------------------------------------------------------------
class PrefixGroup(_Strict):
    share: float = Field(gt=0, le=1, description="fraction of requests in the group")
    length: int = Field(ge=1, description="tokens of the shared prefix")


class PriorityMix(_Strict):
    values: list[int] = Field(min_length=1)
    weights: list[float] | None = None

    @model_validator(mode="after")
    def _weights(self) -> PriorityMix:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError("weights must have one entry per value")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self


class Arrivals(_Strict):
    """Open-loop arrivals: Poisson at ``request_rate`` (req/s) or, with ``burstiness`` != 1,
    gamma-distributed gaps as ``vllm bench serve --burstiness`` draws them; ``.inf``: evenly
    spaced (a constant-rate load generator)."""

    request_rate: float = Field(gt=0, allow_inf_nan=True,
                                description="requests per second; .inf = all at once")
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=True)


class LoadStage(_Strict):
    """One stage of an open loop whose rate changes in stages (as inference-perf's and
    GuideLLM's staged loads run): ``request_rate`` for ``duration_s`` seconds."""

    request_rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class Trace(_Strict):
    """Replay of recorded requests from CSV or JSONL."""

    path: str
    time_scale: float = Field(1.0, gt=0, description="multiplies the recorded gaps")
    use_arrivals: bool = True
    time_unit: Literal["s", "ms"] = Field(
        "s", description="unit of the arrival column (Mooncake traces: ms timestamps)")


class WorkloadSpec(_Strict):
    """How to build the request set of an experiment."""

    num_requests: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0, lt=2**63)

    @field_validator("num_requests")
    @classmethod
    def _fits_in_memory(cls, v: int | None) -> int | None:
        if v is not None and v > MAX_REQUESTS:
            raise ValueError(
                f"{v} requests would take about {v * BYTES_PER_REQUEST / 2**30:,.0f} GiB of "
                f"memory to simulate; at most {MAX_REQUESTS:,}")
        return v
    input_len: LengthDistribution | None = None
    output_len: LengthDistribution | None = None
    prefix_groups: dict[str, PrefixGroup] = Field(default_factory=dict)
    priority: int | PriorityMix | None = None
    trace: Trace | None = None

    @model_validator(mode="before")
    @classmethod
    def _fixed_lengths(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)
            for key in ("input_len", "output_len"):
                if key in data:
                    data[key] = _coerce_length(data[key])
        return data

    @model_validator(mode="after")
    def _complete(self) -> WorkloadSpec:
        if self.trace is None:
            missing = [
                k for k in ("num_requests", "input_len", "output_len") if getattr(self, k) is None
            ]
            if missing:
                raise ValueError(f"missing {', '.join(missing)} (or give a trace)")
        total = sum(g.share for g in self.prefix_groups.values())
        if total > 1.0 + 1e-9:
            raise ValueError(f"prefix group shares add up to {total:g} > 1")
        return self

    def describe(self) -> dict[str, str]:
        if self.trace is not None:
            return {"input_len": f"trace {self.trace.path}", "output_len": f"trace {self.trace.path}"}
        assert self.input_len is not None and self.output_len is not None  # no trace: both given
        return {"input_len": self.input_len.describe(), "output_len": self.output_len.describe()}


def format_validation_error(exc: ValidationError, where: str, prefix: str = "") -> InputError:
    """One ``InputError`` naming the file and every offending field path."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"] if not _is_union_tag(x))
        field = ".".join(x for x in (prefix, loc) if x)
        message = err["msg"].removeprefix("Value error, ")
        if err.get("type", "").endswith("_type") and isinstance(err.get("input"),
                                                                bool | int | float | str):
            message += f", got {err['input']!r}"  # `true` for a count is the usual slip
        if err.get("type") == "extra_forbidden" and err["loc"]:
            guess = nearest(str(err["loc"][-1]), _field_names())
            message = "unknown key" + (f"; did you mean {guess!r}?" if guess else "")
        parts.append(f"field '{field}': {message}" if field else message)
    return InputError(f"{where}: " + "; ".join(parts))


def _field_names() -> set[str]:
    """Every field name of the kit's input models (the candidates a typo is matched with)."""
    names: set[str] = set()
    todo: list[type] = [BaseModel]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("kvpressure."):
            names.update(getattr(cls, "model_fields", {}))
    return names


_UNION_TAGS = {"fixed", "uniform", "normal", "lognormal", "empirical", "int", "float", "bool",
               "str", "list[int]", "list[float]"}


def _is_union_tag(item: Any) -> bool:
    """Pydantic puts the chosen union member into error locations; users never wrote it."""
    text = str(item)
    return (text in _UNION_TAGS or text.startswith(("function-", "tagged-union"))
            or (text[:1].isupper() and text.isidentifier()))


def parse_workload(data: Mapping[str, Any] | WorkloadSpec, where: str = "workload") -> WorkloadSpec:
    """Validate a workload mapping; errors name ``where`` and the field (``workload.input_len``)."""
    if isinstance(data, WorkloadSpec):
        return data
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, where, "workload") from None


def generate_requests(
    spec: Mapping[str, Any] | WorkloadSpec,
    *,
    arrivals: Arrivals | Mapping[str, Any] | None = None,
    stages: list[LoadStage] | None = None,
    base_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """The request dicts of the workload; with ``arrivals`` each carries ``arrival_time_s``.
    With ``stages`` (and ``arrivals`` giving only the burstiness) the arrivals are staged and
    fix the number of requests (a trace gives its first requests to them).

    ``base_dir`` resolves relative paths (trace, empirical lengths), normally the folder of the
    experiment file.
    """
    spec = parse_workload(spec)
    if isinstance(arrivals, Mapping):
        try:
            arrivals = Arrivals.model_validate(arrivals)
        except ValidationError as exc:
            raise format_validation_error(exc, "arrivals", "workload") from None
    base = Path(base_dir) if base_dir is not None else None
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(5)]
    rng_in, rng_out, rng_group, rng_prio, rng_arrival = streams

    staged = None
    if stages:
        staged = staged_arrivals(stages, arrivals.burstiness if arrivals else 1.0, rng_arrival)
        spec = spec.model_copy(update={"num_requests": len(staged[0])})
    if spec.trace is not None:
        requests = read_trace(spec.trace, base)
        if spec.num_requests is not None:
            requests = requests[: spec.num_requests]
        if arrivals is None and not spec.trace.use_arrivals:
            for r in requests:
                r.pop("arrival_time_s", None)
    else:
        # without a trace the spec's validator requires the count and both lengths
        assert spec.num_requests is not None
        assert spec.input_len is not None and spec.output_len is not None
        n = int(spec.num_requests)
        prompt = spec.input_len.sample(rng_in, n, base)
        output = spec.output_len.sample(rng_out, n, base)
        requests = [
            {"id": f"r{i}", "prompt_len": int(prompt[i]), "output_len": int(output[i])}
            for i in range(n)
        ]
        _assign_prefix_groups(requests, spec.prefix_groups, rng_group)
        _assign_priorities(requests, spec.priority, rng_prio)

    if staged is not None:
        if len(requests) < len(staged[0]):
            raise InputError(f"workload.stages: {len(staged[0])} arrivals but the trace holds "
                             f"only {len(requests)} requests")
        requests = requests[:len(staged[0])]
        for r, t in zip(requests, staged[0], strict=True):
            r["arrival_time_s"] = float(t)
    elif arrivals is not None:
        times = poisson_arrivals(len(requests), arrivals, rng_arrival)
        for r, t in zip(requests, times, strict=True):
            r["arrival_time_s"] = float(t)
    return requests


def _assign_prefix_groups(
    requests: list[dict[str, Any]], groups: Mapping[str, PrefixGroup], rng: np.random.Generator
) -> None:
    """Each request joins a group with the group's share of probability; its prompt is the
    group's shared prefix followed by its own sampled tokens (as in vllm bench serve's prefix
    datasets), so ``prompt_len`` = prefix + sampled length."""
    if not groups:
        return
    names = sorted(groups)
    shares = np.array([groups[g].share for g in names])
    edges = np.cumsum(shares)
    draws = rng.random(len(requests))
    for r, u in zip(requests, draws, strict=True):
        idx = int(np.searchsorted(edges, u, side="right"))
        if idx < len(names):
            group = groups[names[idx]]
            r["prefix_group"] = names[idx]
            r["prefix_len"] = group.length
            r["prompt_len"] += group.length


def _assign_priorities(
    requests: list[dict[str, Any]], priority: int | PriorityMix | None, rng: np.random.Generator
) -> None:
    if priority is None:
        return
    if isinstance(priority, int):
        for r in requests:
            r["priority"] = priority
        return
    weights = np.asarray(priority.weights or [1.0] * len(priority.values), dtype=float)
    picks = rng.choice(len(priority.values), size=len(requests), p=weights / weights.sum())
    for r, k in zip(requests, picks, strict=True):
        r["priority"] = int(priority.values[int(k)])


def poisson_arrivals(n: int, arrivals: Arrivals, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of ``n`` requests: the first at 0, then gamma gaps with shape
    ``burstiness`` and mean ``1/request_rate`` (exponential gaps, i.e. Poisson, at 1; equal
    gaps at ``.inf``)."""
    if n == 0:
        return np.zeros(0)
    if math.isinf(arrivals.request_rate):
        return np.zeros(n)
    gaps = _gaps(arrivals.request_rate, arrivals.burstiness, n - 1, rng)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _gaps(rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if math.isinf(burstiness):
        return np.full(n, 1.0 / rate)
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)


def staged_arrivals(stages: list[LoadStage], burstiness: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (s) of an open loop run in stages, one after the other from 0, and each
    arrival's stage index. Within a stage the gaps are drawn as ``poisson_arrivals`` draws
    them at the stage's rate, the first at the stage's start; a stage ends at its duration."""
    times: list[np.ndarray] = []
    index: list[np.ndarray] = []
    start = 0.0
    for k, stage in enumerate(stages):
        expected = stage.request_rate * stage.duration_s
        if math.isinf(burstiness):
            # Counted, not summed: rate x duration sends, the k-th at k / rate.
            offsets = np.arange(math.ceil(expected - 1e-9)) / stage.request_rate
        else:
            # Enough gaps to pass the stage's end with near certainty, then cut there.
            n = int(expected + 10 * math.sqrt(expected) + 10)
            offsets = np.concatenate([[0.0], np.cumsum(_gaps(stage.request_rate, burstiness,
                                                             n, rng))])
            offsets = offsets[offsets < stage.duration_s]
        times.append(start + offsets)
        index.append(np.full(len(offsets), k))
        start += stage.duration_s
    return np.concatenate(times), np.concatenate(index)


# --- trace replay ---------------------------------------------------------------------------------
_PROMPT_KEYS = ("prompt_len", "input_len", "prompt_tokens", "input_tokens", "input_length")
_OUTPUT_KEYS = ("output_len", "output_tokens", "max_tokens", "output_length")
_TIME_KEYS = ("arrival_time_s", "arrival_time", "timestamp", "time_s")


def read_trace(trace: Trace, base_dir: Path | None = None) -> list[dict[str, Any]]:
    """Requests from a CSV or JSONL trace. Columns: ``prompt_len`` (or ``input_len``),
    ``output_len``, optional ``arrival_time_s``/``timestamp`` (seconds; shifted so the first
    request arrives at 0 and scaled by ``time_scale``), ``priority``, ``prefix_group``,
    ``prefix_len``, ``id``."""
    path = Path(trace.path)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise InputError(f"{path}: trace file not found")
    rows: list[tuple[str, dict[str, Any]]] = []
    text = read_user_text(path, "trace file")
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = parse_user_json(line, path)
            except InputError as exc:
                # the reader counts lines of the one line it was given
                raise InputError(str(exc).replace(f"{path}: line 1:", f"{path} line {i}:",
                                                  1)) from None
            if not isinstance(row, dict):
                raise InputError(f"{path} line {i}: expected a JSON object per line")
            rows.append((f"{path} line {i}", row))
    else:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        for i, row in enumerate(reader, start=2):
            rows.append((f"{path} line {i}", {k: v for k, v in row.items() if v != ""}))
    if not rows:
        raise InputError(f"{path}: the trace holds no requests")

    requests: list[dict[str, Any]] = []
    times: list[float | None] = []
    seen: set[str] = set()
    for idx, (where, row) in enumerate(rows):
        prompt_key = next((k for k in _PROMPT_KEYS if k in row), None)
        output_key = next((k for k in _OUTPUT_KEYS if k in row), None)
        if prompt_key is None:
            raise InputError(f"{where}: missing field 'prompt_len' (or 'input_len')")
        if output_key is None:
            raise InputError(f"{where}: missing field 'output_len'")
        req: dict[str, Any] = {
            "id": str(row.get("id", row.get("request_id", f"r{idx}"))),
            "prompt_len": _positive_int(row[prompt_key], where, prompt_key),
            "output_len": _positive_int(row[output_key], where, output_key),
        }
        if req["id"] in seen:
            raise InputError(f"{where}: duplicate request id '{req['id']}'")
        seen.add(req["id"])
        if "priority" in row:
            req["priority"] = _int(row["priority"], where, "priority")
        if "prefix_group" in row:
            req["prefix_group"] = str(row["prefix_group"])
            if "prefix_len" in row:
                req["prefix_len"] = _positive_int(row["prefix_len"], where, "prefix_len")
        time_key = next((k for k in _TIME_KEYS if k in row), None)
        times.append(_float(row[time_key], where, time_key) if time_key else None)
        requests.append(req)

    known = [t for t in times if t is not None]
    if known and trace.use_arrivals:
        if len(known) != len(times):
            raise InputError(f"{path}: some rows have an arrival time and some do not")
        t0 = min(known)
        for req, t in zip(requests, known, strict=True):  # every row has one
            req["arrival_time_s"] = (t - t0) * trace.time_scale * (
                1e-3 if trace.time_unit == "ms" else 1.0)
        requests.sort(key=lambda r: r["arrival_time_s"])  # stable: ties keep file order
    return requests


def _int(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"{where}: field '{field}': expected an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: field '{field}': expected an integer, got {value!r}") from None
    if not number.is_integer():
        raise InputError(f"{where}: field '{field}': expected an integer, got {value!r}")
    return int(number)


def _positive_int(value: Any, where: str, field: str) -> int:
    number = _int(value, where, field)
    if number < 1:
        raise InputError(f"{where}: field '{field}': must be >= 1, got {number}")
    return number


def _float(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"{where}: field '{field}': expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: field '{field}': expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(f"{where}: field '{field}': must be finite, got {value!r}")
    return number
