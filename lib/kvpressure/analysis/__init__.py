"""The diagnosis: functions the notebooks call, identical on simulated and ingested tables.

``recompute`` (exact ratio from steps, estimated range from counters, estimator validation),
``waiting`` (capacity vs deferred, the silent form), ``symptoms`` (the six-symptom checklist),
``knee`` (knee, peak, plateau, decline), ``compare`` (single-variable comparison),
``interference`` (preemption vs prefill interference), ``status`` (the record's status) and
``remedies`` (what-if of each remedy). Every result is a dataclass with ``to_dict()``, except
the parts a stage holds as they are (the knee, the comparison, the interference: pydantic
models of ``stages.results``).
"""
