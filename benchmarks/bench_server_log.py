"""Reading a day of a busy vLLM server's log, against reading its lines and nothing else.

    python benchmarks/bench_server_log.py [--hours 24] [--requests 25]

Generates ``benchmarks/out/day.server.log`` (plain) and ``.log.gz``: a V1 0.33 server's start-up
lines, then every 10 s one stats line and ``--requests`` requests' worth of request and access
lines (what a busy server prints between two stats lines; seeded, so the same file every time).
Measured in this process, best of three:

* ``lines``: iterating over the file's lines (the floor for any reader);
* ``ingest``: ``ingest()`` of the log into the canonical series;
* the same two for the gzip file.

Reported as ratios to ``lines``; results go to stdout and ``benchmarks/out/bench_server_log.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import random
import time
from pathlib import Path

from kvpressure.ingestion.api import ingest
from kvpressure.ingestion.ingest_options import IngestOptions
from kvpressure.ingestion.text_files import open_text

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
START = dt.datetime(2026, 12, 1, 0, 0, 0)


def generate(path: Path, hours: float, requests: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    api = "(APIServer pid=4242)"
    lines = [
        f"{api} INFO 12-01 00:00:00 [utils.py:253] non-default args: {{'model': '/models/m', "
        "'max_num_seqs': 64, 'block_size': 16}",
        "(EngineCore_DP0 pid=4307) INFO 12-01 00:00:05 [kv_cache_utils.py:1148] GPU KV cache "
        "size: 16,384 tokens, Maximum concurrency for 8,192 tokens per request: 2.00x",
    ]
    for i in range(int(hours * 360)):
        stamp = (START + dt.timedelta(seconds=10 * (i + 1))).strftime("%m-%d %H:%M:%S")
        for r in range(requests):
            lines.append(f"{api} INFO {stamp} [logger.py:41] Received request cmpl-{i}-{r}: "
                         "params: SamplingParams(n=1, temperature=0.0, max_tokens=256), "
                         f"prompt_token_ids: [{rng.randrange(30000)}, {rng.randrange(30000)}]")
            lines.append(f'{api} INFO:     127.0.0.1:{40000 + r} - "POST /v1/completions '
                         'HTTP/1.1" 200 OK')
        lines.append(
            f"{api} INFO {stamp} [loggers.py:259] Engine 000: Avg prompt throughput: "
            f"{rng.uniform(500, 1500):.1f} tokens/s, Avg generation throughput: "
            f"{rng.uniform(100, 400):.1f} tokens/s, Running: {rng.randrange(10, 30)} reqs, "
            f"Waiting: {rng.randrange(0, 40)} reqs, GPU KV cache usage: "
            f"{rng.uniform(80, 100):.1f}%")
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    path.with_suffix(".log.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    return len(lines)


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _lines(path: Path) -> None:
    with open_text(path) as fh:
        for _line in fh:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--requests", type=int, default=25)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    plain = OUT / "day.server.log"
    n = generate(plain, args.hours, args.requests)
    packed = plain.with_suffix(".log.gz")
    result: dict[str, object] = {"lines": n, "hours": args.hours, "requests": args.requests}
    for name, path in (("plain", plain), ("gzip", packed)):
        floor = _best(lambda p=path: _lines(p))
        read = _best(lambda p=path: ingest([p], run="day",
                                           options=IngestOptions(log_year=2026,
                                                                 log_timezone="UTC")))
        result[name] = {"lines_s": floor, "ingest_s": read, "ingest_over_lines": read / floor}
        print(f"{name}: {n} lines; ingest {read / floor:.1f}x iterating over the lines "
              f"({read:.2f} s vs {floor:.3f} s)")
    (OUT / "bench_server_log.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
