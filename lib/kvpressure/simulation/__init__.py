"""vLLM 0.33.0's V1 scheduler and KV-cache manager, simulated decision for decision.

Entry points: ``scenario.load_scenario`` (workload JSON -> ``Scenario``) and
``engine.simulate`` (``Scenario`` -> ``SimResult``). Submodules are imported on demand so
that the command line stays light.
"""
