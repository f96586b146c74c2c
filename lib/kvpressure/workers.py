"""Worker processes that never outlive the run that started them.

A sweep's pool workers and the report's notebook kernels hold 150-250 MB each; if the run is
killed (also with ``kill -9``, which no handler sees) they must go with it. On Linux each child
asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``); an interrupted
run also stops its workers itself rather than waiting for their current point.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once here: a child between fork and exec must not load libraries.
_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask for SIGKILL when the parent process ends (Linux; elsewhere a no-op).

    ``parent_pid``: the parent expected; if it is already gone (it died before this ran), exit.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _pool_worker_init(parent_pid: int) -> None:
    die_with_parent(parent_pid)
    # The parent handles Ctrl-C and stops the pool; a worker's own KeyboardInterrupt traceback
    # would only clutter the terminal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process."""
    return ProcessPoolExecutor(max_workers=max_workers, initializer=_pool_worker_init,
                               initargs=(os.getpid(),))


def stop_pool(pool: Any) -> None:
    """Kill a pool's workers now (an interrupted run does not wait for their current point)."""
    processes = dict(getattr(pool, "_processes", None) or {})
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.kill()
    with contextlib.suppress(Exception):
        pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.join(5)
