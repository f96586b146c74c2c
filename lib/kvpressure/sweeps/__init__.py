"""Simulated sweeps: every variant at every level, their points and their layout as a real load test leaves it."""
