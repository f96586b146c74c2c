"""``vllm bench sweep serve`` results -> ``runs`` rows.

The sweep runs ``vllm bench serve --save-result`` once per combination of server settings
(``--serve-params``) and bench settings (``--bench-params``) and run number, and writes:

* ``<combination>/run=N.json``: that run's result, plus ``run_number`` and the combination's
  settings (read as a ``vllm bench serve`` result);
* ``<combination>/summary.json``: a JSON list of those objects;
* ``<experiment>/summary.csv``: every run of every combination, one row each (pandas' index as
  the first, unnamed column), the settings as columns.

The runs carry ``--percentile-metrics ttft,tpot,itl,e2el`` and the default percentile (99):
p95 columns stay empty and ITL p99 stands in where p95 is asked for. Settings that vary
between rows and are not bench result fields (``max_num_seqs``, ``max_num_batched_tokens``...)
name the curve each row belongs to (``variant``: ``max_num_seqs=128``), so a server-setting
sweep gives one curve per setting; repeated runs of a level are repeats.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from kvpressure.errors import InputError
from kvpressure.ingestion.bench import bench_row
from kvpressure.ingestion.text_files import parse_json
from kvpressure.user_files import read_user_text

FORMAT = "vllm_sweep"
# Fields of a vllm bench serve result (the rest of a sweep row is the combination's settings).
RESULT_FIELDS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "rtfx", "input_lens", "output_lens", "ttfts", "itls",
    "latencies", "start_times", "queue_times", "generated_texts", "errors",
    "total_input_sequences", "input_sequence_throughput", "ramp_up_strategy",
    "ramp_up_start_rps", "ramp_up_end_rps", "rps_change_events", "server_queue_times",
    "server_ttfts", "run_number", "_benchmark_name",
}
_STAT_PREFIXES = ("mean_", "median_", "std_", "p")
_MARKERS = {"duration", "completed", "output_throughput", "max_concurrency", "run_number"}


def _is_result_field(name: str) -> bool:
    if name in RESULT_FIELDS or name.startswith(("spec_decode_", "diffusion_", "probe_")):
        return True
    return name.endswith("_ms") and name.startswith(_STAT_PREFIXES)


def is_export(obj: Any) -> bool:
    """A sweep's ``summary.json``: a list of result objects that carry ``run_number``."""
    return (isinstance(obj, list) and bool(obj) and all(isinstance(o, dict) for o in obj)
            and all(len(_MARKERS & o.keys()) >= 3 for o in obj))


def is_csv(rows: list[list[str]]) -> bool:
    """A sweep's ``summary.csv`` header: bench result columns and ``run_number``."""
    header = {c.strip() for c in rows[0]}
    return "run_number" in header and len(_MARKERS & header) >= 3


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    text = read_user_text(path, "results file")
    if text.lstrip().startswith("["):
        objs = parse_json(text, path)
        return [(f"{path}: item {k + 1}", o) for k, o in enumerate(objs)]
    reader = csv.DictReader(io.StringIO(text))
    out = []
    for lineno, rec in enumerate(reader, start=2):
        rec = {k.strip(): v for k, v in rec.items() if k is not None and k.strip()}
        out.append((f"{path}: line {lineno}", {k: _cell(v) for k, v in rec.items()}))
    return out


def _cell(text: str | None) -> Any:
    """A CSV cell as the JSON value it was written from (numbers, None for empty)."""
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def read(path: Path, run: str, notes: list[str]) -> list[dict[str, Any]]:
    """The runs rows of a sweep's ``summary.csv`` or ``summary.json``."""
    records = _records(path)
    if not records:
        raise InputError(f"{path}: a vllm bench sweep summary with no runs")
    settings = sorted({k for _, r in records for k in r if not _is_result_field(k)})
    varying = [k for k in settings
               if len({json.dumps(r.get(k), sort_keys=True, default=str)
                       for _, r in records}) > 1]
    rows = []
    percentile_note = False
    for k, (where, rec) in enumerate(records):
        row_notes: list[str] = []
        row = bench_row(rec, where, run, row_notes)
        # A sweep always passes --percentile-metrics with the default percentile (99): no p95 to
        # warn about per row; one note says so below.
        percentile_note |= any("not in the file" in n for n in row_notes)
        notes.extend(n for n in row_notes if "not in the file" not in n)
        if varying:
            row["variant"] = ",".join(f"{s.replace('-', '_')}={rec.get(s)}" for s in varying)
        row["source"] = f"{path}#{k + 1}"
        row["_where"] = where
        if rec.get("max_concurrency") is not None:
            row["_raw"] = {"concurrency": str(rec.get("max_concurrency"))}
        rows.append(row)
    if percentile_note:
        notes.append(f"{path}: the sweep's runs have p99 latencies only (vllm bench serve's "
                     "default percentile); p95 columns left empty, ITL p99 stands in for p95")
    if varying:
        notes.append(f"{path}: settings varied between runs, one curve each: "
                     f"{', '.join(varying)}")
    return rows
