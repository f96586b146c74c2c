"""A small stand-in for a vLLM OpenAI-compatible server, for the collect tests.

It streams ``max_tokens`` chunks per completion (one every ``token_s``), keeps real counters
(generation tokens, successes, a preemption for every request that arrives while
``kv_capacity`` are already running) and exports them on ``/metrics`` with a
``vllm:cache_config_info``. ``mode`` makes it misbehave: ``"500"`` / ``"429"`` answer every
completion with that status, ``"stall"`` accepts and never sends a byte.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FakeState:
    mode: str = "ok"
    token_s: float = 0.002
    kv_capacity: int = 2
    running: int = 0
    generation_tokens: int = 0
    prompt_tokens: int = 0
    successes: int = 0
    preemptions: int = 0
    completions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def metrics(self) -> str:
        with self.lock:
            return (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="fake"}} {self.running}.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{engine="0",model_name="fake"} 0.0\n'
                "# TYPE vllm:num_preemptions_total counter\n"
                f'vllm:num_preemptions_total{{engine="0",model_name="fake"}} '
                f"{self.preemptions}.0\n"
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{engine="0",model_name="fake"}} '
                f"{self.generation_tokens}.0\n"
                "# TYPE vllm:prompt_tokens_total counter\n"
                f'vllm:prompt_tokens_total{{engine="0",model_name="fake"}} '
                f"{self.prompt_tokens}.0\n"
                "# TYPE vllm:request_success_total counter\n"
                f'vllm:request_success_total{{engine="0",finished_reason="length",'
                f'model_name="fake"}} {self.successes}.0\n'
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="fake"}} '
                f"{min(1.0, self.running / self.kv_capacity)}\n"
                "# TYPE vllm:cache_config_info gauge\n"
                'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
                'engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="64"} 1.0\n'
            )


def _handler(state: FakeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path == "/v1/models":
                body = {"object": "list", "data": [{"id": "fake", "root": "/models/fake",
                                                    "max_model_len": 1024}]}
                self._send(200, json.dumps(body).encode())
            elif self.path == "/metrics":
                self._send(200, state.metrics().encode(), "text/plain; version=0.0.4")
            elif self.path == "/version":
                self._send(200, b'{"version": "fake"}')
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(length))
            with state.lock:
                state.completions += 1
            if state.mode in ("500", "429"):
                msg = {"error": {"message": f"fake {state.mode}", "code": int(state.mode)}}
                self._send(int(state.mode), json.dumps(msg).encode())
                return
            if state.mode == "stall":
                state.release.wait(60)
                return
            n = int(req["max_tokens"])
            with state.lock:
                if state.running >= state.kv_capacity:
                    state.preemptions += 1
                state.running += 1
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for _ in range(n):
                    time.sleep(state.token_s)
                    with state.lock:
                        state.generation_tokens += 1
                    chunk = {"choices": [{"index": 0, "text": " w1"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"prompt_tokens": len(req["prompt"]),
                                                  "completion_tokens": n}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                with state.lock:
                    state.successes += 1
                    state.prompt_tokens += len(req["prompt"])
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                with state.lock:
                    state.running -= 1

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def fake_vllm(**kwargs: object) -> Iterator[tuple[str, FakeState]]:
    state = FakeState(**kwargs)  # type: ignore[arg-type]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
