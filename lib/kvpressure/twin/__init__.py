"""The twin of a measured server: engine settings and workload from the data, a step-time
model fitted to the measured curve with bootstrap uncertainty, the fit shown level by level,
and the remedies predicted on the fitted twin (``api.py`` is the entry point)."""
