"""A real Prometheus server on loopback for the tests, and an exporter replaying scrapes.

``prometheus`` is Debian's package (``apt-get install -y prometheus``). Without it the tests
skip, except under CI (``CI`` set to anything but ""/0/false), where a missing binary fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_prometheus() -> str:
    """Path of the ``prometheus`` binary; skip (locally) or fail (CI) without it."""
    path = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if path:
        return path
    reason = "prometheus binary not found (Debian: apt-get install -y prometheus)"
    if in_ci():
        pytest.fail(reason + "; CI must have it", pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReplayCollector:
    """Serves scrape ``k`` of a recorded log at the ``k``-th collection (then the last one).

    Exposed through ``prometheus_client``'s own HTTP handler, so Prometheus gets the content
    negotiation vLLM's exporter gives it (OpenMetrics, names escaped to ``vllm_``).
    """

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.served: list[tuple[float, int]] = []  # (wall time, index of the text)
        self._lock = threading.Lock()

    def describe(self) -> list:
        return []

    def collect(self):
        with self._lock:
            k = min(len(self.served), len(self.texts) - 1)
            self.served.append((time.time(), k))
        for family in text_string_to_metric_families(self.texts[k]):
            # The 0.0.4 text carries each counter's creation time as a separate gauge family;
            # the OpenMetrics writer derives _created itself, so these are not re-exposed.
            if family.name.endswith("_created"):
                continue
            yield family


@contextmanager
def replay_exporter(texts: list[str]) -> Iterator[tuple[str, ReplayCollector]]:
    registry = CollectorRegistry(auto_describe=False)
    collector = ReplayCollector(texts)
    registry.register(collector)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def prometheus_server(target: str, binary: str, scrape_interval: str = "1s") -> Iterator[str]:
    """A Prometheus scraping ``target``; yields its base URL; stopped by its pid."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvp-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: vllm\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n",
            encoding="utf-8",
        )
        log = open(Path(tmp) / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={Path(tmp) / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 15
            while True:
                if proc.poll() is not None:
                    log.flush()
                    text = (Path(tmp) / "prometheus.log").read_text(errors="replace")
                    raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{text}")
                try:
                    if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError("prometheus did not become ready in 15 s")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            log.close()
