"""A stand-in for ``vllm serve`` (``live_fake.py``'s server) started from a command line, for the
verify-remedy tests: ``python tests/fake_serve.py MODEL --port P --max-num-seqs N``.

Each token takes ``--token-ms`` (default 4 ms), halved when ``--max-num-seqs`` is at most 4: the
"remedy" of the tests is 100% faster, a plain fact to measure. ``/health`` answers once up.
"""

from __future__ import annotations

import argparse
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live_fake import FakeState, _handler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--token-ms", type=float, default=4.0)
    args, _ = ap.parse_known_args()
    token_s = args.token_ms / 1000.0 / (2.0 if args.max_num_seqs <= 4 else 1.0)
    state = FakeState(token_s=token_s, kv_capacity=4)
    base = _handler(state)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path == "/health":
                self._send(200, b"")
            else:
                super().do_GET()

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
