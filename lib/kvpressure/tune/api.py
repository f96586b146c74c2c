"""``run_tune``: the one call behind ``kvpressure tune`` and ``notebooks/07_tune.ipynb``.

```python
from kvpressure.tune.api import run_tune
result = run_tune("data/experiments/seed_case.yaml", "reports/tune",
                  parameters={"max_num_seqs": [16, 32, 64], "max_num_batched_tokens": [1024, 2048]},
                  limits="ttft_p95=60s,itl_p95=150ms", executor="processes:2")
result.table            # ranked, best first (tune.csv)
result.recommendation   # recommended, runner_up, text
```

The baseline (the experiment's or twin's own settings) always runs beside the grid. Output
folder: ``results.jsonl`` (streamed), ``tune.csv``, ``levels.csv``, ``invalid.csv``,
``pareto.csv``, ``recommendation.json``, ``pareto.png``, ``recommended.png``, ``tune.md``.
Every file but ``results.jsonl`` is written from the records sorted by the grid's order, so
they are the same bytes whatever ran the configurations and in whatever order they finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.analysis.limits import format_limits, parse_limits, require_priced
from kvpressure.errors import InputError
from kvpressure.tune.executors import open_executor
from kvpressure.tune.grid import config_id, expand, unique_configs
from kvpressure.tune.progress import Progress
from kvpressure.tune.ranking import invalid_frame, levels_frame, pareto_front, rank
from kvpressure.tune.recommend import recommend
from kvpressure.tune.results import ResultStore
from kvpressure.tune.tasks import batch_size, run_batch


@dataclass
class TuneResult:
    out_dir: Path
    table: pd.DataFrame
    levels: pd.DataFrame
    invalid: pd.DataFrame
    pareto: pd.DataFrame
    recommendation: dict[str, Any]
    limits: dict[str, float]
    configurations: int
    simulated: int
    reused: int
    wall_s: float
    executor: str
    timings: dict[str, float] = field(default_factory=dict)


def run_tune(
    source: Any,
    out_dir: str | os.PathLike[str],
    *,
    parameters: Mapping[str, Sequence[Any]] | None = None,
    configs: Sequence[Mapping[str, Any]] | None = None,
    limits: str | Mapping[str, float] | None = None,
    executor: str = "local",
    workers: int | None = None,
    batch: int | None = None,
    progress: Callable[[str], None] | None = None,
    on_batch: Callable[[int], None] | None = None,
    connect_timeout_s: float = 30.0,
) -> TuneResult:
    """Simulate every configuration of the grid (``parameters``' cartesian product, or
    ``configs``) on ``source`` (an experiment path or name, a run folder for its twin, or a
    target from ``targets``), rank them under ``limits`` and write ``out_dir``.

    ``executor``: ``local``, ``processes[:N]`` or ``dask://HOST:PORT``. ``batch``:
    configurations per task (default: sized from the grid and the workers). ``progress``
    receives progress lines with the ETA; ``on_batch`` the count finished so far.
    ``connect_timeout_s``: how long to wait for a Dask scheduler and its first worker.
    """
    from kvpressure.tune.targets import load_target

    started = time.perf_counter()
    target = load_target(str(source)) if isinstance(source, str | os.PathLike) else source
    limit_map = dict(limits) if isinstance(limits, Mapping) else parse_limits(limits)
    require_priced(limit_map, target.latencies, f"a {target.kind}")
    if (parameters is None) == (configs is None):
        raise InputError("give the grid as parameters (name: values) or as configs")
    grid = expand(parameters) if parameters is not None else [dict(c) for c in configs or ()]
    names = list(dict.fromkeys(k for c in grid for k in c))
    if hasattr(target, "check_parameters"):
        target.check_parameters(names)
    # The baseline runs first: the recommendation is measured against it.
    all_configs = unique_configs([{}, *grid])
    out = Path(out_dir)
    store = ResultStore(out, target.identity())
    done = store.load()
    ids = [config_id(c) for c in all_configs]
    records: dict[str, dict[str, Any]] = {i: done[i] for i in ids if i in done}
    todo = [c for c, i in zip(all_configs, ids, strict=True) if i not in records]
    meter = Progress(len(all_configs), len(records), progress)
    description = "nothing to run"
    t_run = time.perf_counter()
    try:
        if todo:
            with open_executor(executor, workers, connect_timeout_s) as opened:
                description = opened.description
                size = batch_size(len(todo), opened.slots, batch)
                batches = [todo[i:i + size] for i in range(0, len(todo), size)]
                if progress is not None:
                    progress(f"tune {target.name}: {len(all_configs)} configurations "
                             f"({len(records)} already finished), {len(batches)} task(s) of "
                             f"up to {size} on {description}")
                _run_batches(opened, target, batches, store, records, meter, on_batch)
    finally:
        store.close()
    t_ranked = time.perf_counter()
    ordered = [records[i] for i in ids]
    result = _summarise(target, ordered, names, limit_map, out)
    result.configurations = len(all_configs)
    result.simulated = len(todo)
    result.reused = len(all_configs) - len(todo)
    result.executor = description
    result.timings = {"simulate_s": t_ranked - t_run, "write_s": time.perf_counter() - t_ranked}
    result.wall_s = time.perf_counter() - started
    return result


def _run_batches(opened: Any, target: Any, batches: list[list[dict[str, Any]]],
                 store: ResultStore, records: dict[str, dict[str, Any]], meter: Progress,
                 on_batch: Callable[[int], None] | None) -> None:
    """Keep about two batches per worker slot in flight (the rest wait here, not in the
    scheduler: a Ctrl-C then has little to cancel), store each batch as it finishes."""
    window = max(2, 2 * opened.slots)
    queue = iter(batches)
    pending: set[Any] = set()
    try:
        for b in queue:
            pending.add(opened.executor.submit(run_batch, target, b))
            if len(pending) >= window:
                break
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                got = fut.result()
                store.append(got)
                for rec in got:
                    records[rec["id"]] = rec
                meter.advance(len(got))
                if on_batch is not None:
                    on_batch(meter.done)
            for b in queue:
                pending.add(opened.executor.submit(run_batch, target, b))
                if len(pending) >= window:
                    break
    except BaseException:
        opened.stop()
        raise


def _summarise(target: Any, records: list[dict[str, Any]], names: list[str],
               limits: dict[str, float], out: Path) -> TuneResult:
    from kvpressure.tune.figures import curves_figure, pareto_figure

    baseline = target.baseline_settings()
    table = rank(records, names, limits, baseline)
    levels = levels_frame(records, target.level_name, limits)
    invalid = invalid_frame(records, names)
    latency = next(iter(limits), "ttft_p95_s")
    front = pareto_front(levels, latency)
    by_id = {r["id"]: r for r in records}
    advice = recommend(table, by_id, limits, target.level_name)
    advice["target"] = {"kind": target.kind, "name": target.name,
                        "level": target.level_name, "levels": target.levels,
                        "seed": target.seed}
    advice["limits_text"] = format_limits(limits)
    advice["invalid_configurations"] = len(invalid)
    out.mkdir(parents=True, exist_ok=True)
    for frame, name in ((table, "tune.csv"), (levels, "levels.csv"), (invalid, "invalid.csv"),
                        (front, "pareto.csv")):
        frame.to_csv(out / name, index=False, lineterminator="\n")
    (out / "recommendation.json").write_text(
        json.dumps(advice, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    highlight = {"baseline": "baseline"}
    if advice["recommended"]:
        highlight["recommended"] = advice["recommended"]["id"]
    if advice["runner_up"]:
        highlight["runner-up"] = advice["runner_up"]["id"]
    if not levels.empty:
        pareto_figure(levels, front, latency, limits, highlight, out / "pareto.png")
        curves_figure(levels, target.level_name, limits, highlight, out / "recommended.png")
    (out / "tune.md").write_text(_markdown(target, table, invalid, advice, len(records)),
                                 encoding="utf-8")
    return TuneResult(out, table, levels, invalid, front, advice, limits, len(records), 0, 0,
                      0.0, "")


def _markdown(target: Any, table: pd.DataFrame, invalid: pd.DataFrame, advice: dict[str, Any],
              n: int) -> str:
    lines = [f"# Tune: {target.name} ({target.kind})", "",
             f"{n} configurations (the baseline included) at {target.level_name} "
             f"{', '.join(f'{v:g}' for v in target.levels)}; limits: {advice['limits_text']}; "
             f"{len(table)} valid, {len(invalid)} refused as vLLM would refuse them.", "",
             "## Recommendation", "", advice["text"], "",
             "![recommended vs baseline](recommended.png)", "",
             "![Pareto front](pareto.png)", "", "## Best ten", ""]
    if not table.empty:
        cols = ["rank", "id", "within_limits_output_tok_s", "within_limits_level", "peak_output_tok_s",
                "peak_level"]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for _, r in table.head(10).iterrows():
            lines.append("| " + " | ".join(
                f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if not invalid.empty:
        lines += ["", "## Refused configurations", ""]
        for reason, group in invalid.groupby("reason", sort=True):
            lines.append(f"- {len(group)} x {reason} (e.g. {group['id'].iloc[0]})")
    return "\n".join(lines) + "\n"
