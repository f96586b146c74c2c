"""Output folders the kit owns: a marker, a lock, and whole-folder replacement.

Every folder a command writes (``report``, ``simulate``, ``sweep``, ``ingest``) carries
``.kvpressure.json``: the command, the hashes of its input files, the files it wrote and a
completion flag. A run never writes into its ``--out`` directly: it fills a hidden sibling
(``.<name>.kvpressure-partial/<name>``) and swaps it in only when it completed, so ``--out`` is
always either the previous complete run or the new one, never a mix and never half of one.

``--force`` replaces a folder only when the kit made it and it holds nothing the kit did not
write (an empty folder the user made inside is theirs too): a folder with foreign files, the checkout itself or one of the kit's own folders is
refused whatever the flags. A lock (``.<name>.kvpressure.lock`` beside the folder) keeps two
runs out of one folder; the second is refused, naming the process that holds it.

A run killed before its swap leaves its partial sibling; the next run into the same folder
adopts it, so a sweep keeps the points it had finished (each checked complete by its own
marker, see :mod:`kvpressure.sweeps.point_marker`) and discards everything else.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.paths import PACKAGE_DIR, checkout_root, data_dir

MARKER = ".kvpressure.json"
FORMAT = 1
# The marker's command for a run folder the notebooks wrote in place (run on their own, or
# under nbval); ``kvpressure report`` replaces such a folder as its own.
NOTEBOOKS_COMMAND = "notebooks"
_PARTIAL = ".kvpressure-partial"
_OLD = ".kvpressure-old"
_LOCK = ".kvpressure.lock"
# What an adopted partial folder keeps: finished sweep points, each checked by its own marker,
# and tune's streamed results (each line checked against the run's identity).
_ADOPTABLE = ("points", "results.jsonl")


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def input_hashes(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """``{path: sha256}`` of the input files (folders: every file under them)."""
    out: dict[str, str] = {}
    for p in paths:
        path = Path(p)
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            if f.is_file():
                out[str(f)] = file_sha256(f)
    return out


def read_marker(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The folder's marker, or None when it has none (or an unreadable one)."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _listing(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative, POSIX), the marker excepted."""
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.name != MARKER
    )


def _folders(folder: Path) -> list[str]:
    """Every folder under ``folder`` (relative, POSIX), empty ones included."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_dir() and not p.is_symlink())


def _foreign(out: Path, marker: dict[str, Any]) -> list[str]:
    """What under ``out`` the kit did not write: files its marker does not list, and folders
    (an empty one too: the user's ``mkdir``) it neither listed nor wrote a file into."""
    listed = set(marker.get("files") or ())
    kit_folders = set(marker.get("folders") or ())
    for name in listed:
        parts = name.split("/")[:-1]
        kit_folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    in_place = marker.get("command") == NOTEBOOKS_COMMAND
    files = [f for f in _listing(out) if f not in listed and not (in_place and _in_run_layout(f))]
    folders = [f"{d}/" for d in _folders(out) if d not in kit_folders and not (
        in_place and _in_run_layout(f"{d}/"))]
    return files + folders


def _in_run_layout(name: str) -> bool:
    """A file notebooks run in place write (their folder's marker cannot list them all)."""
    from kvpressure.folders.layout import RUN_LAYOUT, RUN_LAYOUT_DIRS

    top = name.split("/", 1)[0]
    return name in RUN_LAYOUT or ("/" in name and top in RUN_LAYOUT_DIRS)


def _protected(path: Path) -> str | None:
    """Why ``path`` may never be an output folder (None when it may)."""
    home = Path.home().resolve()
    root = checkout_root()
    kit = [PACKAGE_DIR, data_dir().resolve()]
    if root is not None:
        kit += [root, root / "notebooks", root / "lib", root / "tests"]
    if path == Path(path.anchor) or path == home:
        return "is the filesystem root or the home folder"
    for own in kit:
        if path == own or path in own.parents:
            return f"would replace the kit's own files ({own})"
    if any((path / "notebooks" / f"{n}.ipynb").is_file() and not read_marker(path)
           for n in ("01_collect", "06_record")):
        return "holds the kit's notebooks"
    return None


def check_replaceable(out: Path, force: bool, command: str, option: str = "--out",
                      rerun_ok: bool = False) -> None:
    """Refuse an ``--out`` the run may not replace (InputError naming the option and why)."""
    shown, out = out, Path(out).absolute()
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"{option} {shown}: exists and is not a folder")
    blocked = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise InputError(f"{option} {shown}: {blocked} is a file, not a folder to create it in")
    why = _protected(out.resolve())
    if why:
        raise InputError(f"{option} {shown}: {why}; choose another folder")
    if not out.exists() or not any(out.iterdir()):
        return
    marker = read_marker(out)
    if marker is None:
        raise InputError(f"{option} {shown}: holds files kvpressure did not write (no {MARKER}); "
                         "it is never replaced, choose a new or empty folder")
    foreign = _foreign(out, marker)
    if foreign:
        raise InputError(f"{option} {shown}: holds {foreign[0]!r}, which kvpressure did not write "
                         f"({len(foreign)} such file(s) or folder(s)); it is never replaced, "
                         "choose another folder")
    same = marker.get("command") in (command, NOTEBOOKS_COMMAND if command == "report" else None)
    if not force and not (rerun_ok and same):
        raise InputError(f"{option} {shown}: holds an earlier `kvpressure {marker.get('command')}` "
                         "run (pass --force to replace it)")


@contextlib.contextmanager
def _lock(out: Path, option: str, shown: Path) -> Iterator[None]:
    import fcntl

    path = out.parent / f".{out.name}{_LOCK}"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise InputError(f"{option} {shown}: another kvpressure run (pid {holder}) is "
                                 "writing this folder; wait for it or choose another") from None
            raise
        # The file may have been unlinked by its previous holder between open and lock.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False when unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    # Here, not with the module: only a replaced folder needs it (a few ms of every start).
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def _swap_in(new: Path, out: Path) -> None:
    """Put ``new`` at ``out``; the folder that was there is removed afterwards."""
    if out.exists() and any(out.iterdir()):
        old_holder = out.parent / f".{out.name}{_OLD}"
        shutil.rmtree(old_holder, ignore_errors=True)
        if _exchange(new, out):
            shutil.rmtree(new)
            return
        # Two renames: a crash between them leaves the old run at old_holder, restored by the
        # next run's recovery (see ``_recover``).
        os.rename(out, old_holder)
        os.rename(new, out)
        shutil.rmtree(old_holder, ignore_errors=True)
        return
    if out.exists():
        out.rmdir()
    os.rename(new, out)


def _recover(out: Path) -> None:
    """Undo what a killed run left half done (the lock is held)."""
    old_holder = out.parent / f".{out.name}{_OLD}"
    if old_holder.is_dir():
        if not out.exists():
            os.rename(old_holder, out)
        else:
            shutil.rmtree(old_holder, ignore_errors=True)


def write_marker(folder: Path, command: str, inputs: dict[str, str], complete: bool,
                 extra: dict[str, Any] | None = None) -> None:
    from kvpressure import __version__

    data = {
        "format": FORMAT, "command": command, "kvpressure": __version__,
        "inputs": dict(sorted(inputs.items())), "complete": complete,
        "files": _listing(folder), "folders": _folders(folder), **(extra or {}),
    }
    tmp = folder / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


@contextlib.contextmanager
def output_folder(out: str | os.PathLike[str], command: str, *, inputs: Iterable[Any] = (),
                  force: bool = False, option: str = "--out", rerun_ok: bool = False,
                  extra: dict[str, Any] | None = None) -> Iterator[Path]:
    """Claim ``out`` for one run; yield the folder to write into.

    The yielded folder is a hidden sibling whose own name is ``out``'s, so paths shown inside
    the run keep the right folder name; it is moved to ``out`` when the block ends without an
    exception, with its marker flagged complete. On an exception (or a kill) ``out`` is left as
    it was. ``rerun_ok`` lets the same command replace its own earlier run without ``force``.
    """
    shown, out = Path(out), Path(out).absolute()
    check_replaceable(shown, force, command, option, rerun_ok)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out, option, shown):
        _recover(out)
        check_replaceable(shown, force, command, option, rerun_ok)  # it may have changed meanwhile
        holder = out.parent / f".{out.name}{_PARTIAL}"
        work = holder / out.name
        if work.is_dir():
            for entry in work.iterdir():  # a killed run's leftovers: keep only what is checked
                if entry.name not in _ADOPTABLE:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() \
                        else entry.unlink()
        elif holder.exists():
            shutil.rmtree(holder)
        work.mkdir(parents=True, exist_ok=True)
        hashes = input_hashes(p for p in inputs if p is not None and Path(p).exists())
        write_marker(work, command, hashes, complete=False, extra=extra)
        yield work
        write_marker(work, command, hashes, complete=True, extra=extra)
        _fsync_tree(work)
        _swap_in(work, out)
        shutil.rmtree(holder, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Flush the files to disk before the swap: a power cut must not leave a swapped-in run of
    empty files."""
    for p in folder.rglob("*"):
        if p.is_file():
            with contextlib.suppress(OSError), open(p, "rb") as fh:
                os.fsync(fh.fileno())


def point_paths_at(work: Path, final: Path) -> None:
    """Rewrite ``work``'s absolute path to ``final`` in the run's text files (executed
    notebooks, stage results, the record), as they will read once the folder is swapped in."""
    pairs = [(str(work), str(final)), (json.dumps(str(work))[1:-1], json.dumps(str(final))[1:-1])]
    for path in work.rglob("*"):
        if not path.is_file() or path.suffix not in (".ipynb", ".json", ".yaml", ".html",
                                                     ".txt", ".log"):
            continue
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        new = text
        for a, b in pairs:
            new = new.replace(a, b)
        if new != text:
            path.write_text(new, encoding="utf-8", errors="surrogateescape")
