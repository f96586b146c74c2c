"""Differential check of the scheduler model against a real vLLM's scheduler classes
(``kvpressure verify-vllm``): same workloads, same tables, first divergent step."""
