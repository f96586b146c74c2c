"""The request path in time (docs/scheduler.md#time-path): what lies between a client and the
engine core's steps, as vLLM 0.33.0 serves a streamed request.

```
client send ─► API server (HTTP, tokenising, input processing, IPC to the engine core)
            ─► engine core: the request joins the waiting queue before the next schedule()
            ─► the step that computes its first token ends
            ─► output path (update_from_output, IPC to the API server, detokenising, the SSE
               chunk) ─► client receives the token
```

* ``api_server_s + tokenize_s_per_token * prompt_len``: from the client's send to the request
  reaching the engine core (vLLM: ``entrypoints/openai`` serving, ``v1/engine/input_processor``,
  ``v1/engine/core_client``).
* ``async_scheduling`` (a scheduler setting, read by the engine loop; vLLM 0.33.0's default on CUDA, ``config/vllm.py``): the engine core
  keeps two steps in flight (``v1/engine/core.py: step_with_batch_queue``). Step ``k + 1`` is
  scheduled as soon as step ``k`` is launched, that is when step ``k - 1``'s output has been
  processed, at the start of step ``k``. A request that reaches the engine core while step
  ``k`` runs therefore waits for step ``k + 2``, where the synchronous loop takes it in step
  ``k + 1``: one step more of queueing, in time. A closed-loop client whose request finished in
  step ``k`` likewise comes back in step ``k + 2``. Step ``k``'s outputs are still processed
  when it ends (the core blocks on them right after launching step ``k + 1``).
* ``output_s``: from the end of the step that computed a token to the client reading it.
  A constant per token: it moves TTFT and E2E, not the gaps between tokens.

The decisions (which requests a step schedules) follow from the times at which requests reach
the engine core; the scheduler itself is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpressure.errors import InputError


@dataclass(frozen=True)
class RequestPath:
    """CPU-side latencies of one request outside the engine core's steps, seconds (the
    engine loop applies them, with ``SchedulerSettings.async_scheduling``)."""

    api_server_s: float = 0.0
    """Client send to the engine core's input queue, before tokenising (HTTP, input
    processing, IPC)."""
    tokenize_s_per_token: float = 0.0
    """Tokenising cost per prompt token in the API server."""
    output_s: float = 0.0
    """End of the step that computed a token to the client reading it (engine core output
    processing, IPC, detokenising, streaming)."""
    def __post_init__(self) -> None:
        for name in ("api_server_s", "tokenize_s_per_token", "output_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    value >= 0 and value < float("inf")):
                raise InputError(f"request path: {name} must be a finite number >= 0, "
                                 f"got {value!r}")

    @property
    def is_zero(self) -> bool:
        """True when the path adds nothing: the engine's own times are the client's."""
        return self.api_server_s == 0 and self.tokenize_s_per_token == 0 and self.output_s == 0

    def input_s(self, prompt_len: int) -> float:
        """Seconds from the client's send to the request reaching the engine core."""
        return self.api_server_s + self.tokenize_s_per_token * prompt_len

    def describe(self) -> dict[str, Any]:
        return {"api_server_s": self.api_server_s,
                "tokenize_s_per_token": self.tokenize_s_per_token,
                "output_s": self.output_s}

    @classmethod
    def from_hardware(cls, hardware: Any) -> RequestPath:
        """The path priced from a hardware profile's host costs."""
        return cls(api_server_s=float(getattr(hardware, "api_server_s", 0.0)),
                   tokenize_s_per_token=float(getattr(hardware, "tokenize_s_per_token", 0.0)),
                   output_s=float(getattr(hardware, "output_s", 0.0)))


NO_PATH = RequestPath()
