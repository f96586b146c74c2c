"""Where ingested data came from, as far as the data says: the vLLM that served it and on which
platform, and the load tool that produced it. Each answer names where it was read; None when
the data does not say (the record keeps it as a meaningful null, never a guess)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# A source's format (ingestion.bench_tables) -> the load tool that writes it.
_TABLE_TOOLS = {"guidellm": "GuideLLM", "aiperf": "AIPerf", "vllm_sweep": "vllm bench sweep"}


def _engine_json(sources: list[str]) -> tuple[dict[str, Any], Path] | None:
    """The ``engine.json`` of a ``kvpressure collect`` folder holding a source."""
    import json

    for source in sources:
        for folder in (Path(source).parent, Path(source).parent.parent, Path(source)):
            engine = folder / "engine.json"
            if not engine.is_file():
                continue
            try:
                data = json.loads(engine.read_text(encoding="utf-8"))
            except (ValueError, OSError):
                continue
            if isinstance(data, dict):
                return data, engine
    return None


def _from_logs(reports: dict[str, Any], key: str) -> str | None:
    for report in reports.values():
        for run in (report.get("runs") or {}).values():
            value = (run.get("server_log") or {}).get(key)
            if value:
                return str(value)
    return None


def served_version(reports: dict[str, Any], sources: list[str]) -> tuple[str, str] | None:
    """The vLLM version that served the data and where it was read: a server log's start-up
    lines (``ingest()`` reports), else the ``engine.json`` of a ``kvpressure collect`` folder
    holding a source (the server's ``/version``); None when the data does not say."""
    version = _from_logs(reports, "version")
    if version:
        return version, "the server log's start-up lines"
    found = _engine_json(sources)
    if found is not None:
        server = found[0].get("server")
        version = server.get("version") if isinstance(server, dict) else None
        if version:
            return str(version), f"the server's /version ({found[1].name})"
    return None




# A vLLM build's local version label -> its device (PyPI's CUDA wheels carry none).
_BUILD_DEVICES = {"cpu": "cpu", "rocm": "rocm", "xpu": "xpu", "hpu": "hpu", "tpu": "tpu",
                  "neuron": "neuron"}


def served_platform(reports: dict[str, Any], sources: Sequence[str] = ()
                    ) -> tuple[str, str] | None:
    """The device the server ran on (``cuda``, ``cpu``, ``xpu``...): a server log's engine
    configuration line, else the local label of the served version (``0.32.0+cpu``, a
    ``+cu128`` build: cuda); None when the data does not say."""
    device = _from_logs(reports, "device")
    if device:
        return device, "the server log's engine configuration (device_config)"
    found = _engine_json(list(sources))
    server = found[0].get("server") if found is not None else None
    if found is not None and isinstance(server, dict) and isinstance(server.get("device"), str):
        return server["device"], (f"the server log's engine configuration "
                                  f"({found[1].name}, from collect --server-log)")
    served = served_version(reports, list(sources))
    if served is None:
        return None
    label = served[0].partition("+")[2].lower()
    build = _BUILD_DEVICES.get(label) or ("cuda" if label.startswith("cu") else None)
    return (build, f"the build of the served version ({served[0]})") if build else None


def load_tool(sources: list[str], bench_files: list[str]) -> str | None:
    """What produced the load: ``kvpressure collect`` for its own folders (``sources``), else
    the tool of the first sweep table among the bench files ingestion read (GuideLLM, AIPerf,
    vllm bench sweep), else ``vllm bench serve`` for its result JSON; None for scrapes or logs
    alone (the data does not say what loaded the server)."""
    from kvpressure.ingestion.bench_tables import table_format

    found = _engine_json(sources)
    if found is not None:
        client = found[0].get("client")
        client = client if isinstance(client, dict) else {}
        version, how = client.get("kvpressure"), client.get("name")
        return ("kvpressure collect" + (f" {version}" if isinstance(version, str) else "")
                + (f" ({how})" if isinstance(how, str) and how else ""))
    for f in map(Path, bench_files):
        fmt = table_format(f) or ""
        if fmt in _TABLE_TOOLS:
            version = _tool_version(f, fmt)
            return _TABLE_TOOLS[fmt] + (f" {version}" if version else "")
    # vllm bench serve's result JSON does not record vLLM's version
    return "vllm bench serve" if bench_files else None


def _tool_version(path: Path, fmt: str) -> str | None:
    """The version a tool's JSON export records of itself (``metadata.guidellm_version``)."""
    import json

    if path.suffix != ".json":
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return None
    key = f"{fmt}_version"
    for where in (data, data.get("metadata") if isinstance(data, dict) else None):
        if isinstance(where, dict) and isinstance(where.get(key), str):
            return where[key]
    return None
