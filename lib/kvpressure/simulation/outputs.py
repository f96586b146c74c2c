"""Simulation results: the steps table, per-request rows, ``summary.json``, ``steps.csv``,
``requests.csv``, in the reference runs' column order and number formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kvpressure.simulation.steps_table import (  # noqa: F401 (re-exported)
    _FLOAT_COLUMNS,
    STEP_COLUMNS,
    TIME_STEP_COLUMNS,
    StepRow,
    StepsTable,
)

REQUEST_COLUMNS = (
    "id", "prompt_len", "output_len", "priority", "prefix_group", "submit_step",
    "first_sched_step", "first_token_step", "finish_step", "preemptions", "recomputed_tokens",
    "scheduled_tokens", "prefix_hit_tokens_at_admission",
)
TIME_REQUEST_COLUMNS = ("arrival_time_s", "first_token_time_s", "finish_time_s", "ttft_s",
                        "itl_mean_s", "itl_max_s")


def _fmt(name: str) -> str:
    if name in ("kv_usage", "kv_usage_after"):
        return "%.6f"
    if name in _FLOAT_COLUMNS:
        return "%.9g"
    return "%d"


def percentile(values: list[float], weights: list[int] | None, q: float) -> float:
    """Inverted-CDF percentile (the smallest value whose cumulative weight reaches q); 0.0
    without values (no request emitted a second token), so that summary.json stays JSON."""
    if not values:
        return 0.0
    import numpy as np

    v = np.asarray(values, dtype=float)
    # A stable sort of the values alone: ties may come in another order than sorting
    # (value, weight) pairs, but the first cumulative weight reaching the target still
    # falls on the same value. Integer weights keep the sums exact.
    order = np.argsort(v, kind="stable")
    w = (np.ones(len(v), dtype=np.int64) if weights is None
         else np.asarray(weights, dtype=np.int64)[order])
    cum = np.cumsum(w)
    target = q * int(cum[-1])
    i = int(np.searchsorted(cum, target, side="left"))
    return float(v[order[min(i, len(v) - 1)]])


def _sequential_sum(values: Any) -> float:
    """``sum(values)`` of a float array, bit for bit: Python 3.11 adds floats one after
    another, as a cumulative sum does (numpy's ``sum`` adds pairwise: other bits). From 3.12
    on ``sum`` compensates its rounding, so it is called itself; on 3.11 too unless numpy is
    loaded already (its cumulative sum, faster on a long run, is not worth its import)."""
    if sys.version_info >= (3, 12) or "numpy" not in sys.modules:
        return sum(values)
    import numpy as np

    a = np.frombuffer(values, dtype="d")
    return float(np.cumsum(a)[-1]) if len(a) else 0


class SimResult:
    """What ``simulate`` returns: the steps table, the requests, and the summary."""

    def __init__(self, scenario, steps: StepsTable, requests: list, timing: dict[str, float],
                 time_stats: dict[str, Any] | None = None, recorder=None) -> None:
        self.scenario = scenario
        self.steps = steps
        self.requests = requests
        self.timing = timing
        self.time_stats = time_stats
        self.recorder = recorder
        self.summary = self._summary()

    @property
    def timed(self) -> bool:
        return self.steps.timed

    def _summary(self) -> dict[str, Any]:
        c = self.steps.columns
        np = sys.modules.get("numpy")
        # Count columns summed exactly: by numpy over the arrays' own bytes when it is loaded
        # (64 bits; faster), else by Python (its int fast path over an ``array``); the
        # float columns keep Python's sum and its order of additions, hence their bytes.
        ints: dict[str, Any] = {}
        if np is not None:
            ints = {name: np.frombuffer(c[name], dtype=c[name].typecode)
                    for name in ("num_scheduled_tokens", "recomputed_tokens", "preemptions",
                                 "num_prefill_tokens", "num_decode_tokens",
                                 "prefix_cache_queries", "prefix_cache_hits", "num_running")}

        def col_sum(name: str) -> int:
            if np is not None:
                return int(ints[name].sum(dtype=np.int64))
            return sum(c[name])

        sc = self.scenario
        n = len(self.steps)
        total = col_sum("num_scheduled_tokens")
        recomputed = col_sum("recomputed_tokens")
        reqs = self.requests
        mode: dict[str, Any] = {"type": sc.mode}
        if sc.mode == "closed":
            mode["concurrency"] = sc.concurrency
            # Written only when set, so that runs without a lag keep their bytes.
            if sc.return_steps:
                mode["return_steps"] = sc.return_steps
            if sc.first_alone:
                mode["first_alone"] = True
        s: dict[str, Any] = {
            "workload": sc.name,
            "mode": mode,
            "settings": sc.settings.to_dict(),
            "num_requests": len(reqs),
            "total_prompt_tokens": sum(r.num_prompt_tokens for r in reqs),
            "total_output_tokens": sum(r.num_output_tokens for r in reqs),
            "steps": n,
            "last_step": int(c["step"][-1]) if n else -1,
            "preemptions": col_sum("preemptions"),
            "requests_preempted": sum(1 for r in reqs if r.num_preemptions > 0),
            "recomputed_tokens": recomputed,
            "total_scheduled_tokens": total,
            "prefill_tokens": col_sum("num_prefill_tokens"),
            "decode_tokens": col_sum("num_decode_tokens"),
            "recompute_ratio": recomputed / total if total else 0.0,
            "prefix_cache_queries": col_sum("prefix_cache_queries"),
            "prefix_cache_hits": col_sum("prefix_cache_hits"),
            "mean_running": col_sum("num_running") / n if n else 0.0,
            "max_running": (int(ints["num_running"].max()) if np is not None
                            else max(c["num_running"])) if n else 0,
            "mean_kv_usage": _sequential_sum(c["kv_usage"]) / n if n else 0.0,
            "max_kv_usage": (float(np.frombuffer(c["kv_usage"], dtype="d").max())
                             if np is not None else max(c["kv_usage"])) if n else 0.0,
        }
        if sc.annotations:
            s["annotations"] = sorted(sc.annotations)
        if self.time_stats is not None:
            s.update(self.time_stats)
        s["timing"] = dict(self.timing)
        return s

    # -- frames ---------------------------------------------------------------------------
    def steps_frame(self):
        import pandas as pd

        return pd.DataFrame({k: v.tolist() for k, v in self.steps.columns.items()})

    def request_rows(self) -> list[tuple]:
        rows = []
        timed = self.timed
        for r in self.requests:
            row: tuple[Any, ...] = (r.request_id, r.num_prompt_tokens, r.max_tokens, r.priority,
                   r.prefix_group or "", r.submit_step, r.first_sched_step, r.first_token_step,
                   r.finish_step, r.num_preemptions, r.recomputed_tokens, r.scheduled_tokens,
                   r.prefix_hit_tokens_at_admission)
            if timed:
                ttft = r.first_token_time_s - r.submit_time_s
                itl_mean = ((r.last_token_time_s - r.first_token_time_s) / r.num_itl
                            if r.num_itl else float("nan"))
                itl_max = r.itl_max_s if r.num_itl else float("nan")
                row += (r.submit_time_s, r.first_token_time_s, r.finish_time_s, ttft,
                        itl_mean, itl_max)
            rows.append(row)
        return rows

    def request_columns(self) -> tuple[str, ...]:
        return REQUEST_COLUMNS + (TIME_REQUEST_COLUMNS if self.timed else ())

    def requests_frame(self):
        import pandas as pd

        return pd.DataFrame(self.request_rows(), columns=list(self.request_columns()))

    # -- files ----------------------------------------------------------------------------
    def steps_csv(self) -> str:
        cols = self.steps.columns
        names = list(cols)
        fmt = ",".join(_fmt(n) for n in names) + "\n"
        lines = [",".join(names) + "\n"]
        lines.extend(fmt % row for row in zip(*cols.values(), strict=True))
        return "".join(lines)

    def requests_csv(self) -> str:
        names = self.request_columns()
        out = [",".join(names) + "\n"]
        for row in self.request_rows():
            cells = []
            for v in row:
                if isinstance(v, float):
                    cells.append("" if v != v else f"{v:.9g}")
                else:
                    cells.append(str(v))
            out.append(",".join(cells) + "\n")
        return "".join(out)

    def write(self, out_dir: str | Path) -> None:
        """``summary.json``, ``steps.csv``, ``requests.csv`` (and ``metrics.prom.jsonl``
        when a recorder with a ``write(path)`` method was given)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        (out / "steps.csv").write_text(self.steps_csv())
        (out / "requests.csv").write_text(self.requests_csv())
        if self.recorder is not None and hasattr(self.recorder, "write"):
            self.recorder.write(out / "metrics.prom.jsonl")
