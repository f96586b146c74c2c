"""Where the batches run, behind one ``concurrent.futures.Executor`` interface.

* ``local``: in this process, one batch after the other (no pickling, easiest to debug);
* ``processes`` (``processes:N``): a pool of N local worker processes that die with this one;
* ``dask://HOST:PORT``: a ``dask.distributed`` cluster, through ``Client.get_executor()``.
  Dask reruns the tasks of a worker that dies on the workers left, so a lost machine costs
  only the batches it was running. Needs ``pip install 'kvpressure[dask]'``.

``open_executor`` yields an ``Executor`` and how many batches it runs at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from kvpressure.errors import InputError


class SerialExecutor(Executor):
    """Runs each task when it is submitted, in this process."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            fut.set_exception(exc)
        return fut


@dataclass
class Opened:
    executor: Executor
    slots: int
    """How many batches run at once (worker processes or Dask worker threads)."""
    description: str
    stop: Callable[[], None]
    """Ends the running work at once (Ctrl-C): local workers killed, Dask futures cancelled."""


def parse_executor(spec: str, workers: int | None = None) -> tuple[str, Any]:
    """``("local", None)``, ``("processes", N)`` or ``("dask", "tcp://HOST:PORT")``."""
    text = (spec or "local").strip()
    if text in ("local", "serial"):
        return "local", None
    if text.startswith("processes"):
        _, sep, n = text.partition(":")
        count = workers if not sep else None
        if sep:
            try:
                count = int(n)
            except ValueError:
                count = None
            if count is None:
                raise InputError(f"--executor {spec!r}: processes:N takes a number of workers")
        count = count if count is not None else min(2, os.cpu_count() or 1)
        if count < 1:
            raise InputError(f"--executor {spec!r}: needs at least 1 worker")
        return "processes", count
    if text.startswith(("dask://", "tcp://")):
        address = "tcp://" + text.split("://", 1)[1]
        host, sep, port = address[len("tcp://"):].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InputError(f"--executor {spec!r}: expected dask://HOST:PORT (the scheduler's "
                             "address)")
        return "dask", address
    raise InputError(f"--executor {spec!r}: expected local, processes[:N] or dask://HOST:PORT")


@contextlib.contextmanager
def open_executor(spec: str = "local", workers: int | None = None,
                  connect_timeout_s: float = 30.0) -> Iterator[Opened]:
    kind, arg = parse_executor(spec, workers)
    if kind == "local":
        ex = SerialExecutor()
        yield Opened(ex, 1, "this process", lambda: None)
        return
    if kind == "processes":
        from kvpressure.workers import process_pool, stop_pool

        pool = process_pool(arg)
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            stop_pool(pool)

        try:
            yield Opened(pool, arg, f"{arg} local worker process(es)", stop)
        finally:
            if not stopped:
                pool.shutdown(wait=True, cancel_futures=True)
        return
    try:
        from distributed import Client
    except ImportError:
        raise InputError(f"--executor {spec}: Dask is not installed; pip install "
                         "'kvpressure[dask]'") from None
    try:
        client = Client(arg, timeout=f"{connect_timeout_s}s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise InputError(f"--executor {spec}: cannot reach the Dask scheduler at {arg}: "
                         f"{exc}") from None
    try:
        threads = sum(int(w.get("nthreads", 1))
                      for w in client.scheduler_info().get("workers", {}).values())
        if threads < 1:
            client.wait_for_workers(1, timeout=connect_timeout_s)
            threads = sum(int(w.get("nthreads", 1))
                          for w in client.scheduler_info().get("workers", {}).values())
        ex = client.get_executor(pure=False)

        def cancel() -> None:
            with contextlib.suppress(Exception):
                ex.shutdown(wait=False)

        yield Opened(ex, max(1, threads), f"Dask cluster at {arg} ({threads} worker "
                                          "thread(s))", cancel)
    except TimeoutError:
        raise InputError(f"--executor {spec}: the Dask scheduler at {arg} has no worker") \
            from None
    finally:
        with contextlib.suppress(Exception):
            client.close()
