"""How long a closed-loop client's slot stays empty between a finish and its next request.

The twin's clients resubmit at the next engine step. A real client does not: after the last
token it closes the response, then sends the next request, which the API server tokenizes
before the engine sees it. Two measurements of that gap, from what a sweep records:

* **client side** (``client_gaps``): from a ``vllm bench serve`` result's per-request
  ``start_times`` and ``latencies``. In a closed loop of ``C`` clients the first ``C``
  requests start together and every later one starts when a request finishes; matched in
  order (the ``j``-th start after the first ``C`` follows the ``j``-th finish), the gap is
  the next start minus that finish. It misses the time between sending and reaching the
  engine (inside TTFT).
* **engine side** (``engine_gap_s``): by Little's law over a level's steady window, the
  engine holds on average ``L = running + waiting`` requests while ``C`` clients cycle at
  ``lambda`` requests per second, so each cycle leaves a slot empty ``(C - L) / lambda``
  seconds: everything between a finish leaving the engine and the next request reaching it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def client_gaps(start_times: Sequence[float], latencies: Sequence[float],
                concurrency: int) -> np.ndarray:
    """Per request after the first ``concurrency``: its start minus the finish that freed
    its client (seconds); empty when the lists do not fit a closed loop."""
    start = np.asarray(start_times, float)
    lat = np.asarray(latencies, float)
    c = int(concurrency)
    if c < 1 or len(start) != len(lat) or len(start) <= c:
        return np.array([])
    ok = np.isfinite(start) & np.isfinite(lat) & (lat > 0)
    if not ok.all():
        return np.array([])  # a failed request breaks the pairing of starts and finishes
    starts = np.sort(start)
    finishes = np.sort(start + lat)
    return starts[c:] - finishes[: len(starts) - c]


def engine_gap_s(mean_in_engine: float, concurrency: int, request_rate: float) -> float:
    """Mean time a client's slot is empty as the engine sees it, ``(C - L) / lambda``; NaN
    when an input is missing, and 0 when the engine held every client's request."""
    if not (math.isfinite(mean_in_engine) and math.isfinite(request_rate)) or request_rate <= 0:
        return math.nan
    return max(0.0, (float(concurrency) - float(mean_in_engine)) / float(request_rate))
