"""End-to-end tests against a real vLLM server (``make e2e``); ``make test`` does not collect
them. The vLLM environment and the model are built by ``scripts/vllm-env.sh`` and
``scripts/build-tiny-model.py`` and cached between runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The shared test helpers (prometheus_server.py) live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if os.environ.get("KVPRESSURE_E2E", "") != "1":
    collect_ignore_glob = ["test_*.py"]
