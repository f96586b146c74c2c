"""Compile the simulation's hot modules with mypyc (``make native``).

Builds ``kvpressure.simulation.native.COMPILED`` from ``lib/`` into a fresh folder, writes the
stamp of the sources it built from, and swaps the folder in as ``native_dir()``
(``<venv>/kvpressure-native``); the sources are not touched and nothing is written beside them.
Without mypyc or a C compiler it says so and exits 1; the simulation then runs its sources.

    .venv/bin/python scripts/build_native.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent / "lib"
sys.path.insert(0, str(LIB))

from kvpressure.simulation import native  # noqa: E402


def build(out: Path) -> None:
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as e:
        raise SystemExit(f"build_native: {e.name} is not installed (make native installs it)"
                         ) from None
    modules = [f"kvpressure/simulation/{name}.py" for name in native.COMPILED]
    stamp = native.expected_stamp()
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    cwd = os.getcwd()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(LIB)  # mypyc names modules by their path from here
            # Type errors of the modules they import (not compiled) are not theirs to fix;
            # mypy's cache stays out of the source tree.
            options = ["--follow-imports=silent", f"--cache-dir={Path(tmp) / 'cache'}"]
            exts = mypycify([*options, *modules], opt_level="3",
                            target_dir=str(Path(tmp) / "c"))
            dist = Distribution({"name": "kvpressure-native", "ext_modules": exts})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib = str(fresh)
            cmd.build_temp = str(Path(tmp) / "o")
            cmd.ensure_finalized()
            cmd.run()
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    finally:
        os.chdir(cwd)
    if native.expected_stamp() != stamp:
        shutil.rmtree(fresh, ignore_errors=True)
        raise SystemExit("build_native: the sources changed during the build; run it again")
    (fresh / native.STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    # Swapped in by renames: a process that loaded the old set keeps its mapped files.
    old = None
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    fresh.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="where the compiled set goes (default: native_dir())")
    ap.add_argument("--force", action="store_true", help="build even if the stamp matches")
    args = ap.parse_args()
    out = (args.out or native.native_dir()).resolve()
    try:
        current = json.loads((out / native.STAMP).read_text())
    except (OSError, ValueError):
        current = None
    if current == native.expected_stamp() and not args.force:
        print(f"build_native: {out} is built from these sources")
        return
    try:
        build(out)
    except Exception as e:  # a compiler's or mypy's refusal: said in one line, not a traceback
        raise SystemExit(f"build_native: not built ({type(e).__name__}: {e}); the simulation "
                         "runs its sources") from None
    print(f"build_native: {', '.join(native.COMPILED)} compiled into {out}")


if __name__ == "__main__":
    main()
