"""What ``kvpressure collect`` sends at a level beyond a closed loop of random prompts.

* the levels: closed-loop concurrencies (``c<C>``), request rates (``r<R>``: an open loop, or one
  capped at ``--max-concurrency`` requests in flight) or one trace replayed (``trace``);
* when each request of a rate level is sent: gaps drawn from a gamma distribution of shape
  ``burstiness`` (1: Poisson arrivals, as ``vllm bench serve --burstiness 1``), or evenly spaced
  (``constant``), from the seed and the level;
* a dataset's requests (``--dataset``): JSONL of token counts (``input_length``/
  ``output_length``, or ``prompt_len``/``output_len``), JSONL of prompts (``prompt``, with an
  optional ``output_len``/``max_tokens``), or ShareGPT-style JSON (``conversations``: the first
  human turn is the prompt, the reply's length the output length); text is tokenized once by
  the server's own ``/tokenize``, so every prompt is sent as token ids of known length;
* a trace (``--trace``, Mooncake-style JSONL): ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids``, one block of :data:`TRACE_BLOCK` tokens per hash id, so
  requests that share hash ids share their prompt's prefix (the prefix cache sees what the
  trace's users sent).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvpressure.errors import InputError

TRACE_BLOCK = 512  # tokens per hash id of a Mooncake trace
ARRIVALS = ("poisson", "constant")
MAX_DATASET = 100_000  # dataset entries read at most


@dataclass(frozen=True)
class LoadLevel:
    """One level of a sweep: its name (``c8``, ``r2``, ``trace``) and what it holds fixed."""

    name: str
    concurrency: int | None
    """The closed loop's clients, or the cap on requests in flight (None: an open loop)."""
    request_rate: float | None = None
    """Requests/s of a rate level (None: a closed loop or a trace)."""
    trace: bool = False

    @property
    def closed(self) -> bool:
        return self.request_rate is None and not self.trace

    @property
    def label(self) -> str:
        """How the terminal names it: ``c=8``, ``r=2/s``, ``trace``."""
        if self.trace:
            return "trace"
        if self.request_rate is not None:
            return f"r={self.request_rate:g}/s"
        return f"c={self.concurrency}"


def closed_level(concurrency: int) -> LoadLevel:
    return LoadLevel(f"c{concurrency}", int(concurrency))


def rate_level(rate: float, cap: int | None) -> LoadLevel:
    return LoadLevel(f"r{rate:g}", cap, float(rate))


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,2"`` -> [0.5, 1.0, 2.0]; InputError naming ``--request-rate`` otherwise."""
    try:
        rates = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--request-rate {text!r}: give requests/s like 0.5,1,2") from None
    if not rates:
        raise InputError("--request-rate: give at least one rate, e.g. 0.5,1,2")
    for r in rates:
        if not (math.isfinite(r) and r > 0):
            raise InputError(f"--request-rate: every rate must be a finite number > 0, got {r:g}")
    if len(set(rates)) != len(rates):
        raise InputError("--request-rate: a rate is listed twice")
    return rates


def send_times(n: int, rate: float, *, burstiness: float = 1.0, arrivals: str = "poisson",
               seed: int = 0, stream: int = 0) -> list[float]:
    """When each of ``n`` requests is sent, in seconds from the level's start (the first at 0).

    ``poisson``: gaps from a gamma distribution of shape ``burstiness`` and mean ``1/rate``
    (shape 1 is exponential: Poisson arrivals; smaller is burstier); ``constant``: every
    ``1/rate`` seconds. The same seed and stream give the same times."""
    if n <= 0:
        return []
    if arrivals == "constant":
        return [k / rate for k in range(n)]
    rng = np.random.default_rng([seed, stream, 7])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


# --------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class DatasetRequest:
    """One request of a dataset: its prompt (a token count, or text until tokenized, then its
    token ids) and its output length (a ShareGPT reply's until tokenized)."""

    output_len: int
    input_len: int | None = None
    text: str | None = None
    reply: str | None = None
    """A ShareGPT reply: the output length is its token count."""
    ids: tuple[int, ...] | None = None


def _positive_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) \
            or value < 1:
        raise InputError(f"{where}: '{key}' must be a whole number >= 1, got {value!r}")
    return int(value)


_INPUT_KEYS = ("input_length", "input_len", "prompt_len", "prompt_tokens")
_OUTPUT_KEYS = ("output_length", "output_len", "max_tokens", "completion_tokens")


def _from_mapping(obj: Any, where: str, default_output: int) -> DatasetRequest:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: each line is a JSON object, got {type(obj).__name__}")
    out_key = next((k for k in _OUTPUT_KEYS if k in obj), None)
    output = (_positive_int(obj[out_key], where, out_key) if out_key else default_output)
    if "conversations" in obj:
        return _sharegpt(obj, where, default_output)
    if isinstance(obj.get("prompt"), str):
        if not obj["prompt"]:
            raise InputError(f"{where}: 'prompt' is empty")
        return DatasetRequest(output, text=obj["prompt"])
    in_key = next((k for k in _INPUT_KEYS if k in obj), None)
    if in_key is None:
        raise InputError(f"{where}: no prompt: give 'prompt' (text) or one of "
                         f"{', '.join(_INPUT_KEYS)} (a token count)")
    return DatasetRequest(output, input_len=_positive_int(obj[in_key], where, in_key))


def _sharegpt(obj: dict[str, Any], where: str, default_output: int) -> DatasetRequest:
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise InputError(f"{where}: 'conversations' must be a list of turns")
    texts = [(str(t.get("from", t.get("role", ""))), t.get("value", t.get("content")))
             for t in turns]
    ask = next((i for i, (who, v) in enumerate(texts)
                if who in ("human", "user") and isinstance(v, str) and v), None)
    if ask is None:
        raise InputError(f"{where}: no human turn with text in 'conversations'")
    reply = next((v for who, v in texts[ask + 1:]
                  if who in ("gpt", "assistant") and isinstance(v, str) and v), None)
    return DatasetRequest(default_output, text=texts[ask][1], reply=reply)


def read_dataset(path: Path, default_output: int) -> list[DatasetRequest]:
    """The requests of ``--dataset FILE`` (JSONL of token counts or prompts, or ShareGPT JSON),
    in file order; InputError naming the file and line."""
    from kvpressure.user_files import parse_user_json, read_user_text

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--dataset {path}: no such file")
    text = read_user_text(path, "--dataset")
    stripped = text.lstrip()
    out: list[DatasetRequest] = []
    if stripped.startswith("["):
        data = parse_user_json(text, path)
        if not isinstance(data, list):
            raise InputError(f"{path}: a JSON dataset is a list of entries")
        for i, obj in enumerate(data[:MAX_DATASET]):
            out.append(_from_mapping(obj, f"{path}: entry {i + 1}", default_output))
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:  # a JSON syntax error, or a number past Python's limits
                raise InputError(f"{path}: line {i}: not JSON ({getattr(exc, 'msg', exc)})"
                                 ) from None
            out.append(_from_mapping(obj, f"{path}: line {i}", default_output))
            if len(out) >= MAX_DATASET:
                break
    if not out:
        raise InputError(f"{path}: no requests in the dataset")
    return out


def needs_tokenizer(requests: Sequence[DatasetRequest]) -> bool:
    return any(r.text is not None for r in requests)


# --------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class TraceRequest:
    t_s: float
    """When it is sent, in seconds from the trace's first request."""
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


def read_trace(path: Path) -> list[TraceRequest]:
    """A Mooncake-style JSONL trace: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids``; in send order (stable by timestamp); InputError naming the line."""
    from kvpressure.user_files import read_user_text

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--trace {path}: no such file")
    rows = []
    for i, line in enumerate(read_user_text(path, "--trace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {i}"
        try:
            obj = json.loads(line)
        except ValueError as exc:  # a JSON syntax error, or a number past Python's limits
            raise InputError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: each line is a JSON object")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise InputError(f"{where}: no '{key}' (a Mooncake trace line has timestamp, "
                                 "input_length, output_length, hash_ids)")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) \
                or ts < 0:
            raise InputError(f"{where}: 'timestamp' must be milliseconds >= 0, got {ts!r}")
        hashes = obj.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise InputError(f"{where}: 'hash_ids' must be a list of integers")
        n_in = _positive_int(obj["input_length"], where, "input_length")
        if hashes and n_in > TRACE_BLOCK * len(hashes):
            raise InputError(f"{where}: input_length {n_in} is longer than its "
                             f"{len(hashes)} hash ids of {TRACE_BLOCK} tokens")
        rows.append((float(ts), n_in, _positive_int(obj["output_length"], where,
                                                    "output_length"), tuple(hashes)))
    if not rows:
        raise InputError(f"{path}: no requests in the trace")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceRequest((ts - t0) / 1000.0, n_in, n_out, h) for ts, n_in, n_out, h in rows]


def trace_prompt(req: TraceRequest, index: int, seed: int,
                 token_ids: tuple[int, int]) -> list[int]:
    """The token ids of a trace request: one block of ids per hash id (the same hash id, the
    same block, whichever request carries it), cut to its input length; a request without hash
    ids draws its own."""
    low, high = token_ids
    if not req.hash_ids:
        rng = np.random.default_rng([seed, 9, index])
        return rng.integers(low, high, size=req.input_len).tolist()
    ids: list[int] = []
    for h in req.hash_ids:
        rng = np.random.default_rng([seed, 8, int(h) & 0xFFFFFFFFFFFF])
        ids.extend(rng.integers(low, high, size=TRACE_BLOCK).tolist())
        if len(ids) >= req.input_len:
            break
    return ids[: req.input_len]


async def tokenize(http: Any, base_url: str, model: str, requests: list[DatasetRequest]
                   ) -> list[DatasetRequest]:
    """Text prompts (and ShareGPT replies) tokenized by the server's own ``/tokenize``, so each
    is sent as token ids of known length; token-count requests are kept as they are."""
    import httpx

    url = base_url.rstrip("/") + "/tokenize"

    async def ids_of(text: str, special: bool) -> list[int]:
        try:
            resp = await http.post(url, json={"model": model, "prompt": text,
                                              "add_special_tokens": special}, timeout=60.0)
        except httpx.HTTPError as exc:
            raise InputError(f"--dataset: the server's /tokenize failed: {exc}") from None
        if resp.status_code != 200:
            raise InputError(f"--dataset: the server's /tokenize answered HTTP "
                             f"{resp.status_code}: {resp.text[:200]}")
        tokens = resp.json().get("tokens")
        if not isinstance(tokens, list):
            raise InputError("--dataset: the server's /tokenize gave no 'tokens'")
        return [int(t) for t in tokens]

    out = []
    for r in requests:
        if r.text is None:
            out.append(r)
            continue
        ids = await ids_of(r.text, True)
        output = r.output_len
        if r.reply is not None:
            output = max(1, len(await ids_of(r.reply, False)))
        out.append(DatasetRequest(output, input_len=len(ids), ids=tuple(ids)))
    return out


def dataset_prompt(req: DatasetRequest, index: int, seed: int,
                   token_ids: tuple[int, int]) -> list[int]:
    """The token ids of dataset request ``index``: its own (tokenized text), else ids of its
    token count drawn from the seed and the index (never a repeat of another request's)."""
    if req.ids is not None:
        return list(req.ids)
    assert req.input_len is not None
    rng = np.random.default_rng([seed, 11, index])
    low, high = token_ids
    return rng.integers(low, high, size=req.input_len).tolist()
