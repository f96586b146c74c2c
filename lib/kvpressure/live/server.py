"""What a running vLLM server says about itself: its model, and its KV-cache geometry.

``/v1/models`` names the served model (and ``max_model_len``); ``/metrics`` exports the cache
config as the labels of ``vllm:cache_config_info`` (``num_gpu_blocks``, ``block_size``,
``enable_prefix_caching``...). The scheduler's limits (``max_num_seqs``,
``max_num_batched_tokens``) are not exported, so they come from the user's ``--engine-args``.
A URL where no OpenAI-compatible vLLM answers is refused at once, naming the URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvpressure.errors import InputError
from kvpressure.ingestion.live_scrape import ACCEPT, check_url
from kvpressure.ingestion.names import CACHE_CONFIG_INFO

_FROM_CACHE_CONFIG: dict[str, Callable[[str], Any]] = {
    "num_gpu_blocks": int, "block_size": int,
    "enable_prefix_caching": lambda v: v.strip().lower() == "true",
}
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def base_url(url: str) -> str:
    """``http://host:8000`` from the server's URL as users write it (with ``/v1``,
    ``/metrics`` or a trailing slash)."""
    check_url(url, "URL")
    text = url.rstrip("/")
    for tail in ("/metrics", "/v1/completions", "/v1"):
        if text.endswith(tail):
            text = text[: -len(tail)]
    return text


def metric_values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in a plain-text exposition: (labels, value) each."""
    out = []
    prefix = name + "{"
    for line in text.splitlines():
        if not (line.startswith(prefix) or line.startswith(name + " ")):
            continue
        head, _, value = line.rpartition(" ")
        if "}" in head:
            labels = dict(_LABEL.findall(head[head.index("{"): head.rindex("}") + 1]))
        else:
            labels = {}
        try:
            out.append((labels, float(value)))
        except ValueError:
            continue
    return out


def metric_total(text: str, name: str) -> float | None:
    """The sum of a metric over its label sets (None when absent)."""
    values = metric_values(text, name)
    return sum(v for _, v in values) if values else None


def cache_config_from_text(text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (the first engine's), as exported."""
    values = metric_values(text, CACHE_CONFIG_INFO)
    if not values:
        return {}
    labels = dict(values[0][0])
    labels.pop("engine", None)
    return labels


@dataclass
class ServerInfo:
    base_url: str
    model: str
    max_model_len: int | None
    model_root: str | None
    version: str | None
    cache_config: dict[str, str] = field(default_factory=dict)

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    @property
    def completions_url(self) -> str:
        return self.base_url + "/v1/completions"

    def engine_args(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str],
                                                              list[str]]:
        """(engine_args for the report, where each came from, warnings): the server's own
        values win over what the user gave, with a warning when the two differ."""
        args: dict[str, Any] = {}
        origin: dict[str, str] = {}
        notes: list[str] = []
        for key, value in given.items():
            args[key], origin[key] = value, "--engine-args"
        for key, conv in _FROM_CACHE_CONFIG.items():
            raw = self.cache_config.get(key)
            if raw in (None, "", "None"):
                continue
            try:
                value = conv(raw)
            except ValueError:
                continue
            if key in args and args[key] != value:
                notes.append(f"--engine-args {key}={args[key]!r}, but the server exports "
                             f"{value!r} ({CACHE_CONFIG_INFO}): the server's value is used")
            args[key], origin[key] = value, CACHE_CONFIG_INFO
        if self.max_model_len is not None:
            if "max_model_len" in args and args["max_model_len"] != self.max_model_len:
                notes.append(f"--engine-args max_model_len={args['max_model_len']!r}, but "
                             f"/v1/models says {self.max_model_len}: the server's value is used")
            args["max_model_len"], origin["max_model_len"] = self.max_model_len, "/v1/models"
        return args, origin, notes

    def to_dict(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model,
                "max_model_len": self.max_model_len, "model_root": self.model_root,
                "version": self.version, "cache_config": self.cache_config}


def _get(http: httpx.Client, url: str, what: str, **kw: Any) -> httpx.Response:
    try:
        return http.get(url, **kw)
    except httpx.HTTPError as exc:
        raise InputError(f"URL {url}: no {what} answers there "
                         f"({type(exc).__name__}: {exc or 'connection failed'})") from None


def probe(url: str, *, model: str | None = None, timeout_s: float = 10.0) -> ServerInfo:
    """Ask the server at ``url`` what it serves; InputError naming the URL when it is not an
    OpenAI-compatible vLLM server."""
    base = base_url(url)
    with httpx.Client(timeout=timeout_s) as http:
        resp = _get(http, base + "/v1/models", "OpenAI-compatible server")
        try:
            data = resp.json()["data"]
            served = [m for m in data if isinstance(m, dict) and m.get("id")]
        except (ValueError, KeyError, TypeError):
            served = []
        if resp.status_code != 200 or not served:
            raise InputError(
                f"URL {base}: /v1/models answered HTTP {resp.status_code} without a model list: "
                "not an OpenAI-compatible server (give the server's base URL, e.g. "
                "http://host:8000)")
        names = [str(m["id"]) for m in served]
        if model is not None and model not in names:
            raise InputError(f"--model {model!r}: the server at {base} serves "
                             f"{', '.join(names)}")
        chosen = next(m for m in served if str(m["id"]) == (model or names[0]))
        metrics = _get(http, base + "/metrics", "metrics endpoint", headers={"Accept": ACCEPT})
        if metrics.status_code != 200:
            raise InputError(f"URL {base}/metrics: answered HTTP {metrics.status_code}; the "
                             "investigation needs the server's Prometheus metrics")
        from kvpressure.ingestion.live_scrape import exposition_problem

        problem = exposition_problem(metrics.content, metrics.headers.get("content-type", ""))
        if problem:  # a proxy's page or garbage: no level could be measured on it
            raise InputError(f"URL {base}/metrics: not Prometheus text ({problem})")
        version = None
        try:
            v = http.get(base + "/version")
            if v.status_code == 200:
                version = str(v.json().get("version"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    max_len = chosen.get("max_model_len")
    return ServerInfo(
        base_url=base,
        model=str(chosen["id"]),
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        model_root=str(chosen["root"]) if chosen.get("root") else None,
        version=version,
        cache_config=cache_config_from_text(metrics.text),
    )
