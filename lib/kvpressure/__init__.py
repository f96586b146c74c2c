"""kvpressure: investigate throughput knees caused by KV-cache pressure in vLLM."""

__version__ = "0.1.0"
VLLM_BEHAVIOUR_VERSION = "0.33.0"
