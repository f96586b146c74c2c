"""Run the investigation notebooks in batch with papermill.

Order: ``01_collect`` first (it writes the tables every later stage reads), then
``02_recompute`` .. ``05_interference``, which depend only on 01's files and so run side by side,
then ``06_record``. Each executed notebook is kept in ``run_dir/notebooks/``, also when it fails,
so the failing cell can be inspected.

Kernels are started once per worker, warmed with the imports every notebook needs, and reused:
a kernel start plus the pandas/seaborn imports cost several seconds, more than most notebooks'
own work. Each notebook starts from a reset namespace, and every kernel's working directory is
the notebooks folder (set at kernel start, so concurrent notebooks never change the process cwd).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kvpressure.folders.layout import NOTEBOOKS_DIR
from kvpressure.folders.run_context import BATCH_ENV
from kvpressure.paths import notebooks_dir
from kvpressure.stages.files import STAGES
from kvpressure.workers import die_with_parent

NOTEBOOK_SOURCE_DIR = notebooks_dir()
NOTEBOOKS: tuple[str, ...] = tuple(STAGES.values())
# Notebooks that read only 01's files, not each other's.
INDEPENDENT: frozenset[str] = frozenset(NOTEBOOKS[1:-1])
KERNEL = "python3"

WARM_CODE = (
    "import numpy, pandas, matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot, seaborn, IPython.display\n"
    "import kvpressure.report.display\n"
)
RESET_CODE = (
    "import os as _os\n"
    "import matplotlib.pyplot as _plt\n"
    "_plt.close('all')\n"
    "_os.chdir({cwd!r})\n"
    "get_ipython().run_line_magic('reset', '-f')\n"
    "get_ipython().execution_count = 1\n"
)

Progress = Callable[[str], None]


class NotebookFailed(RuntimeError):
    """A notebook raised; names the notebook and the cell, and where the executed copy is."""

    def __init__(
        self,
        notebook: str,
        cell_index: int | None,
        execution_count: int | None,
        ename: str,
        evalue: str,
        source_line: str,
        executed_path: Path,
    ) -> None:
        self.notebook = notebook
        self.cell_index = cell_index
        self.execution_count = execution_count
        self.ename = ename
        self.evalue = evalue
        self.source_line = source_line
        self.executed_path = executed_path
        cell = "an unknown cell" if cell_index is None else f"cell {cell_index}"
        if execution_count is not None:
            cell += f" (In [{execution_count}])"
        where = f": {source_line}" if source_line else ""
        super().__init__(
            f"notebook {notebook}.ipynb failed in {cell}{where}\n"
            f"  {ename}: {evalue}\n"
            f"  executed notebook kept at {executed_path}"
        )


@dataclass(frozen=True)
class NotebookRun:
    notebook: str
    output_path: Path
    seconds: float


def _stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _first_code_line(source: str) -> str:
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped[:120]
    return ""


def _code_notebook(code: str) -> Any:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    return nb


class _KernelWorker(threading.Thread):
    """A thread owning one warm kernel; runs notebooks taken from a shared queue."""

    def __init__(self, index: int, tasks: queue.Queue, cwd: Path, log_dir: Path) -> None:
        super().__init__(name=f"kvpressure-kernel-{index}", daemon=True)
        self.index = index
        self.tasks = tasks
        self.cwd = cwd
        self.log_dir = log_dir
        self.km: Any = None
        self._log: TextIO | None = None

    def _start_kernel(self) -> None:
        import papermill
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_dir / f"kernel-{self.index}.log", "a", encoding="utf-8")  # noqa: SIM115
        self.km = AsyncKernelManager(kernel_name=KERNEL)
        # The kernel's own diagnostics go to a log file, not the user's terminal.
        run_sync(self.km.start_kernel)(
            cwd=str(self.cwd), stdout=self._log, stderr=self._log,
            # Batch: progress as plain lines, and the user's current run left as it is.
            env={**os.environ, BATCH_ENV: "1"},
            # The kernel (and the sweep workers it starts) must not outlive this run, even
            # when it is killed with SIGKILL.
            preexec_fn=die_with_parent,
            # In-memory history: the execution counter restarts for every notebook.
            extra_arguments=["--HistoryManager.hist_file=:memory:"],
        )
        papermill.execute_notebook(
            _code_notebook(WARM_CODE), None, kernel_name=KERNEL, km=self.km, progress_bar=False
        )

    def kill_kernel(self) -> None:
        """End the kernel and everything it started at once (the run was interrupted)."""
        provisioner = getattr(self.km, "provisioner", None)
        pgid = getattr(provisioner, "pgid", None)
        if pgid:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)

    def _stop_kernel(self) -> None:
        from jupyter_core.utils import run_sync

        if self.km is not None:
            try:
                run_sync(self.km.shutdown_kernel)(now=True)
            except Exception:  # already dead: nothing left to stop
                pass
            self.km = None

    def run(self) -> None:
        try:
            try:
                self._start_kernel()  # warm up while other workers are busy
            except Exception:  # retried, and reported, with the first notebook
                self._stop_kernel()
            while True:
                item = self.tasks.get()
                if item is None:
                    return
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if self.km is None or not self.km.has_kernel:
                        self._start_kernel()
                    future.set_result(job(self.km))
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                    # A failed notebook may have left the kernel dead or odd: start afresh.
                    self._stop_kernel()
                    future.set_exception(exc)
        finally:
            self._stop_kernel()
            if self._log is not None:
                self._log.close()


def _execute(
    km: Any,
    notebook: str,
    source_dir: Path,
    run_dir: Path,
    parameters: Mapping[str, Any],
    stream: TextIO | None,
) -> NotebookRun:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    input_path = source_dir / f"{notebook}.ipynb"
    output_path = run_dir / NOTEBOOKS_DIR / f"{notebook}.ipynb"
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path}: no such notebook")
    known = parameter_names(input_path)
    # Only the notebook's own parameters: papermill warns about every other name.
    params = {k: v for k, v in parameters.items() if k in known}
    started = time.perf_counter()
    papermill.execute_notebook(
        _code_notebook(RESET_CODE.format(cwd=str(source_dir))), None,
        kernel_name=KERNEL, km=km, progress_bar=False,
    )
    try:
        papermill.execute_notebook(
            str(input_path),
            str(output_path),
            parameters={**params, "run_dir": str(run_dir)},
            kernel_name=KERNEL,
            km=km,
            progress_bar=False,
            stderr_file=stream,
        )
    except PapermillExecutionError as exc:
        raise NotebookFailed(
            notebook, exc.cell_index, exc.exec_count, exc.ename, exc.evalue,
            _first_code_line(exc.source or ""), output_path,
        ) from None
    except Exception as exc:  # a dead kernel or a broken notebook file
        raise NotebookFailed(
            notebook, None, None, type(exc).__name__, str(exc), "", output_path
        ) from None
    return NotebookRun(notebook, output_path, time.perf_counter() - started)


def parameter_names(path: str | os.PathLike[str]) -> set[str]:
    """Names assigned in a notebook's ``parameters`` cell."""
    return set(parameter_defaults(path))


def parameter_defaults(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Each name assigned in a notebook's ``parameters`` cell, with its default (None where
    the default is no literal)."""
    import ast

    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            out: dict[str, Any] = {}
            for node in ast.parse(cell.source).body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                try:
                    value = ast.literal_eval(node.value) if node.value is not None else None
                except (ValueError, AttributeError, TypeError, SyntaxError):
                    value = None
                out.update((t.id, value) for t in targets if isinstance(t, ast.Name))
            return out
    return {}


def _waves(notebooks: Sequence[str]) -> list[list[str]]:
    waves: list[list[str]] = []
    for name in notebooks:
        if name in INDEPENDENT and waves and all(n in INDEPENDENT for n in waves[-1]):
            waves[-1].append(name)
        else:
            waves.append([name])
    return waves


def run_notebooks(
    run_dir: str | os.PathLike[str],
    parameters: Mapping[str, Any] | None = None,
    *,
    notebooks: Sequence[str] = NOTEBOOKS,
    jobs: int = 2,
    notebooks_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = _stderr_progress,
    stream: TextIO | None = sys.stderr,
) -> list[NotebookRun]:
    """Run ``notebooks`` in the investigation's order, up to ``jobs`` independent ones at once.

    ``run_dir`` reaches every notebook as an absolute path; ``parameters`` are papermill
    parameters. The kernels' stderr (the sweep's progress lines) is copied to ``stream``.
    On a failure the notebooks of the same wave finish (their executed copies are kept), later
    ones are not started, and :class:`NotebookFailed` is raised for the first failing notebook.
    """
    say = progress or (lambda _msg: None)
    source_dir = Path(notebooks_dir).resolve() if notebooks_dir else NOTEBOOK_SOURCE_DIR
    run_dir = Path(run_dir).resolve()
    (run_dir / NOTEBOOKS_DIR).mkdir(parents=True, exist_ok=True)
    params = dict(parameters or {})
    total = len(notebooks)
    position = {name: i + 1 for i, name in enumerate(notebooks)}
    waves = _waves(notebooks)
    widest = max(len(w) for w in waves) if waves else 1
    tasks: queue.Queue = queue.Queue()
    workers = [
        _KernelWorker(i, tasks, source_dir, run_dir / NOTEBOOKS_DIR)
        for i in range(max(1, min(jobs, widest)))
    ]
    for worker in workers:
        worker.start()

    def job_for(name: str) -> Callable[[Any], NotebookRun]:
        def job(km: Any) -> NotebookRun:
            say(f"[{position[name]}/{total}] {name} ...")
            result = _execute(km, name, source_dir, run_dir, params, stream)
            say(f"[{position[name]}/{total}] {name} done in {result.seconds:.1f} s")
            return result

        return job

    done: list[NotebookRun] = []
    stopped = False
    try:
        for wave in waves:
            futures: list[Future] = []
            for name in wave:
                future: Future = Future()
                tasks.put((job_for(name), future))
                futures.append(future)
            failures = []
            for future in futures:
                try:
                    done.append(future.result())
                except NotebookFailed as exc:
                    failures.append(exc)
            if failures:
                raise failures[0]
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM) or failed: running notebooks are not waited for.
        stopped = True
        for worker in workers:
            worker.kill_kernel()
        raise
    finally:
        for _ in workers:
            tasks.put(None)
        for worker in workers:
            # A killed kernel's client may take long to notice; its thread is a daemon.
            worker.join(timeout=2 if stopped else 30)
    return done


class TerminalProgress:
    """``kvpressure report``'s progress in a terminal: one tqdm bar over the notebooks and the
    page, the running notebook's own progress lines (the sweep's points) as its postfix, other
    messages printed above it. ``progress`` and ``stream`` for :func:`run_notebooks`."""

    def __init__(self, total: int, file: TextIO = sys.stderr) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, file=file, unit="step", dynamic_ncols=True,
                        desc="starting the notebooks' kernel",
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} stages [{elapsed}] "
                                   "{postfix}")
        self._partial = ""

    def __call__(self, message: str) -> None:
        import re

        m = re.match(r"^\[(\d+)/(\d+)\] (\S+) (\.\.\.|done in .*)$", message)
        if m and m.group(4) == "...":
            # A new stage: the last stage's progress line would read as this one's.
            self.bar.set_description(m.group(3))
            self.bar.set_postfix_str("")
        elif m:
            self.bar.update(1)
        elif message == "index.html ...":
            self.bar.set_description("index.html")
        elif message.startswith("done in"):
            self.bar.update(self.bar.total - self.bar.n)
            self.close()
            print(message, file=sys.stderr)
        else:
            self.bar.write(message, file=sys.stderr)

    # A text stream: the kernels' stderr lines become the bar's postfix.
    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self.bar.set_postfix_str(line.strip()[:70])
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.bar.close()
