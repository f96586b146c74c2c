"""Fixtures more than one test module uses (test modules never import one another; plain
helpers live in ``*_helpers.py``)."""

from __future__ import annotations

import fcntl
import os
import pickle

import pytest

# The suite checks the simulation's sources, which run whenever no compiled set matches them;
# test_sim_native.py holds the compiled set (make native) to the same bytes. Set
# KVPRESSURE_NATIVE=1 to run everything compiled (tests that subclass a compiled class then fail).
os.environ.setdefault("KVPRESSURE_NATIVE", "0")

from kvpressure.paths import REPO_ROOT  # noqa: E402

CI_SMALL = REPO_ROOT / "data" / "experiments" / "ci_small.yaml"


@pytest.fixture(scope="session")
def ci_small_report(tmp_path_factory):
    """``kvpressure report`` on the small built-in experiment: the notebooks through papermill,
    once for every module that reads the run folder (none of them may change it). Under
    parallel workers (pytest -n) the first worker to ask writes it and the others wait for it
    and read the same folder: a second report would only cost a core for a minute."""
    from kvpressure.investigation.report import make_report

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp("report") / "ci_small"
        return make_report(out, experiment=CI_SMALL, jobs=2, progress=lambda _m: None,
                           stream=None)
    shared = tmp_path_factory.getbasetemp().parent  # one folder for all workers of a run
    done = shared / "ci_small_report.pickle"
    with open(shared / "ci_small_report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            result = make_report(shared / "ci_small_report" / "ci_small", experiment=CI_SMALL,
                                 jobs=2, progress=lambda _m: None, stream=None)
            done.write_bytes(pickle.dumps(result))
    return pickle.loads(done.read_bytes())
