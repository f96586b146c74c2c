"""Hardware and model profiles, and KV-pool sizing as vLLM 0.33.0 does it.

```python
from kvpressure.profiles import load_hardware, load_model, size_kv_pool, safe_concurrency
hw = load_hardware("ascend-910b-64g")
model = load_model("llama-3.1-70b")          # or a profile YAML, or an HF config.json
sizing = size_kv_pool(hw, model, tp=8, max_model_len=8192)   # pp=2 for pipeline stages
sizing.num_gpu_blocks, sizing.block_size, safe_concurrency(sizing, 4096)
```
"""

from kvpressure.profiles.hardware import (
    GB,
    GiB,
    HardwareProfile,
    MiB,
    list_hardware,
    load_hardware,
)
from kvpressure.profiles.kvpool import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KVPoolError,
    KVPoolSizing,
    estimate_activation,
    estimate_cudagraph,
    estimate_non_torch,
    resolve_batch_limits,
    safe_concurrency,
    safe_concurrency_grid,
    size_kv_pool,
)
from kvpressure.profiles.model import (
    ModelProfile,
    dtype_bytes,
    estimate_params,
    list_models,
    load_model,
)

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "GB",
    "GiB",
    "MiB",
    "HardwareProfile",
    "KVPoolError",
    "KVPoolSizing",
    "ModelProfile",
    "dtype_bytes",
    "estimate_activation",
    "estimate_cudagraph",
    "estimate_non_torch",
    "estimate_params",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
    "resolve_batch_limits",
    "safe_concurrency",
    "safe_concurrency_grid",
    "size_kv_pool",
]
