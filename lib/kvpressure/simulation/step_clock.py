"""The fixed clock of step-level runs (the reference harness's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepClock:
    """The fixed clock of step-level runs: step ``k`` starts at ``t0 + k * dt``.

    Its own module, kept out of the compiled set (native.py): a compiled dataclass's class
    attributes are descriptors, and ``StepClock.dt`` is read as the default."""

    t0: float = 1.0
    dt: float = 0.015625
