"""vLLM 0.33.0's V1 scheduler and KV-cache manager, simulated decision for decision.

Entry points: ``scenario.load_scenario`` (workload JSON -> ``Scenario``) and
``engine.simulate`` (``Scenario`` -> ``SimResult``). Submodules are imported on demand so
that the command line stays light. The exact step's modules run compiled when a build of
these very sources exists (``native.py``, ``make native``), else as they are.
"""

from kvpressure.simulation import native as _native

NATIVE = _native.enable(__path__)
