"""The sweep of ``kvpressure collect``: warm-up, then one closed-loop load level after another,
with the server's ``/metrics`` recorded the whole time.

The run folder (``--out``) is written as the sweep goes, so whatever stops it keeps everything
done so far:

```
engine.json           the server's model and KV-cache geometry, the engine arguments and where
                      each came from
levels.json           the plan, each level's window (start, end), status and figures, the
                      warm-up and every cool-down (idle gaps, recorded as such)
metrics.prom.jsonl    the scrape log, one line per scrape, flushed as it arrives
bench/c<C>.json       one ``vllm bench serve`` result per level (complete or marked incomplete)
prometheus/           the same series read back through a Prometheus server (--prometheus)
report/               the investigation (``kvpressure report`` on bench/ + the scrape log)
```

A level's window is marked by a scrape right before it starts and one right after it ends, so
counters cut at the window count exactly that level's work. A level that does not run to its
end (the server stops answering, most requests fail, the level timeout, Ctrl-C) is written with
``complete: false`` and its reason, and ends the sweep: the report is made from the complete
levels and names the others. A level whose TTFT p95 exceeds ``max_ttft_s`` is kept, and ends
the sweep (the server is saturated; higher levels would only take longer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

from kvpressure.errors import InputError, refuse_unknown
from kvpressure.ingestion.collect_folder import (
    BENCH_DIR,
    ENGINE_JSON,
    LEVELS_JSON,
    SCRAPE_LOG,
    SERVER_LOG_COPY,
    read_collect_folder,
)
from kvpressure.ingestion.live_scrape import ACCEPT, Scraper, check_url
from kvpressure.ingestion.names import PREEMPTIONS, RUNNING, WAITING
from kvpressure.live.client import LoopResult, RequestOutcome, closed_loop, open_loop
from kvpressure.live.load import (
    ARRIVALS,
    LoadLevel,
    closed_level,
    dataset_prompt,
    rate_level,
    read_dataset,
    read_trace,
    send_times,
    trace_prompt,
)
from kvpressure.live.progress import LevelProgress
from kvpressure.live.prompts import DEFAULT_TOKEN_IDS, RequestSource
from kvpressure.live.results import bench_result, error_summary, write_result
from kvpressure.live.server import ServerInfo, metric_total, probe

PROMETHEUS_DIR = "prometheus"
REPORT_DIR = "report"
WARMUP_STREAM = 0  # request streams: 0 the warm-up, the concurrency for each level
RATE_STREAM = 1_000_000  # the streams of rate levels: this plus the level's index

# Errors that mean nothing answers any more (as opposed to a server answering 500 or 429).
_GONE = ("ConnectError", "RemoteProtocolError", "ReadError", "WriteError", "ConnectTimeout")


@dataclass
class CollectOptions:
    url: str
    out: Path
    levels: list[int]
    input_len: int = 512
    output_len: int = 256
    range_ratio: float = 0.0
    prompts_per_level: int | None = None  # None with no duration: 8 per client, at least 16
    duration_per_level_s: float | None = None
    warmup: int = 4
    cooldown_s: float = 5.0
    level_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    max_ttft_s: float | None = 60.0  # a level past this TTFT p95 ends the sweep (None: never)
    scrape_interval_s: float = 1.0
    seed: int = 0
    token_ids: tuple[int, int] = DEFAULT_TOKEN_IDS
    load_engine: str = "auto"  # auto | builtin | vllm-bench
    vllm: str | None = None
    tokenizer: str | None = None
    model: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    prometheus: str | None = None
    server_log: Path | None = None  # the server's log: its start-up facts, into engine.json
    request_rates: list[float] | None = None  # rate levels (requests/s) instead of `levels`
    max_concurrency: int | None = None  # the cap on requests in flight of rate levels
    burstiness: float = 1.0  # gamma shape of the gaps between sends (1: Poisson)
    arrivals: str = "poisson"  # poisson (gamma gaps of shape burstiness) | constant
    dataset: Path | None = None  # prompts from a file (JSONL or ShareGPT JSON)
    trace: Path | None = None  # one level: a Mooncake-style trace replayed at its times
    bench_args: list[str] = field(default_factory=list)  # passed to vllm bench serve

    def plan(self) -> list[LoadLevel]:
        """The levels in the order they run."""
        if self.trace is not None:
            return [LoadLevel("trace", self.max_concurrency, None, trace=True)]
        if self.request_rates:
            return [rate_level(r, self.max_concurrency) for r in self.request_rates]
        return [closed_level(c) for c in self.levels]

    def check(self) -> None:
        if self.server_log is not None and not Path(self.server_log).is_file():
            raise InputError(f"--server-log {self.server_log}: no such file")
        given = [n for n, v in (("--levels", self.levels), ("--request-rate", self.request_rates),
                                ("--trace", self.trace)) if v]
        if len(given) > 1:
            raise InputError(f"{' and '.join(given)}: give one kind of level (concurrencies, "
                             "request rates or a trace)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise InputError(f"--max-concurrency: must be >= 1, got {self.max_concurrency}")
        if not (self.burstiness > 0 and not math.isnan(self.burstiness)):
            raise InputError(f"--burstiness: must be > 0, got {self.burstiness}")
        if self.arrivals not in ARRIVALS:
            raise InputError(f"--arrivals {self.arrivals!r}: {' or '.join(ARRIVALS)}")
        if self.trace is not None and self.dataset is not None:
            raise InputError("--trace and --dataset: a trace gives its own lengths; give one")
        if self.trace is not None:
            read_trace(self.trace)  # refused now, not after the warm-up
        if self.dataset is not None:
            read_dataset(self.dataset, self.output_len)
        if self.request_rates or self.trace is not None:
            return self._check_common()
        if not self.levels:
            raise InputError("--levels: give at least one concurrency, e.g. 4,8,16,32")
        bad = [c for c in self.levels if c < 1]
        if bad:
            raise InputError(f"--levels: every level must be >= 1, got {bad[0]}")
        if len(set(self.levels)) != len(self.levels):
            raise InputError("--levels: a level is listed twice")
        self._check_common()

    def _check_common(self) -> None:
        for name, value in (("--duration-per-level", self.duration_per_level_s),
                            ("--cooldown", self.cooldown_s),
                            ("--level-timeout", self.level_timeout_s),
                            ("--request-timeout", self.request_timeout_s),
                            ("--max-ttft", self.max_ttft_s),
                            ("--scrape-interval", self.scrape_interval_s)):
            if value is None:
                continue
            low_ok = value >= 0 if name == "--cooldown" else value > 0
            if not (math.isfinite(value) and low_ok):
                raise InputError(f"{name}: must be a finite number of seconds "
                                 f"{'>= 0' if name == '--cooldown' else '> 0'}, got {value}")
        if self.prompts_per_level is not None and self.prompts_per_level < 1:
            raise InputError(f"--prompts-per-level: must be >= 1, got {self.prompts_per_level}")
        if self.warmup < 0:
            raise InputError(f"--warmup: must be >= 0, got {self.warmup}")
        if self.load_engine not in ("auto", "builtin", "vllm-bench"):
            raise InputError(f"--load-engine {self.load_engine!r}: auto, builtin or vllm-bench")
        if self.prometheus:
            check_url(self.prometheus, "--prometheus")
        from kvpressure.simulation.experiment import ALIASES, ENGINE_ARGS

        # A typo found after an hour-long sweep would cost the report: refuse it now.
        refuse_unknown(self.engine_args, [*ENGINE_ARGS, *ALIASES], "--engine-args")
        from pydantic import ValidationError

        from kvpressure.simulation.experiment import EngineArgs

        try:  # the experiment's own strict types: max_num_seqs: true is no count
            EngineArgs.model_validate({ALIASES.get(k, k): v for k, v in self.engine_args.items()})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise InputError(f"--engine-args: {'.'.join(map(str, err['loc']))}: {err['msg']}, "
                             f"got {err.get('input')!r}") from None
        for name, value in (("--input-len", self.input_len), ("--output-len", self.output_len)):
            if value < 1:
                raise InputError(f"{name}: must be >= 1 tokens, got {value}")
        if not 0 <= self.range_ratio < 1:  # nan fails too
            raise InputError(f"--range-ratio: must be in [0, 1), got {self.range_ratio}")

    def prompts_for(self, concurrency: int) -> int | None:
        if self.duration_per_level_s is not None:
            return None
        return self.prompts_per_level or max(16, 8 * concurrency)

    def requests_at(self, level: LoadLevel) -> int | None:
        """How many requests a level sends (None: a closed loop for a duration)."""
        if level.closed:
            return self.prompts_for(int(level.concurrency or 1))
        rate = float(level.request_rate or 1.0)
        if self.duration_per_level_s is not None:
            return max(1, math.ceil(rate * self.duration_per_level_s))
        # about half a minute of load, as a closed loop's 8 requests per client
        return self.prompts_per_level or max(16, math.ceil(30 * rate))


@dataclass
class CollectOutcome:
    out: Path
    levels: list[dict[str, Any]]
    stopped: str | None
    interrupted: bool
    report: Path | None = None
    notes: list[str] = field(default_factory=list)
    server_log: Path | None = None
    """The copy of the server's log given to collect (``server.log`` in the run folder): the
    report reads it too (start-up facts, and the step trace an open loop's twin is fitted on
    when the server logs iteration details)."""

    @property
    def complete_levels(self) -> list[Any]:
        """The complete levels: concurrencies, or the names of rate levels and a trace."""
        return [lv.get("level", lv["concurrency"]) for lv in self.levels
                if lv["status"] == "complete"]

    @property
    def all_complete(self) -> bool:
        return all(lv["status"] == "complete" for lv in self.levels if lv["status"] != "not run")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def prepare_out(out: Path) -> Path:
    """An absent or empty folder; never one that holds anything (a previous sweep's data)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; give a folder for the run")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"--out {out}: already holds files (a previous collect?); choose a new "
                         "folder, nothing is ever overwritten")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create: {exc.strerror or exc}") from None
    return out


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


class _Sweep:
    """The state of one sweep, written to levels.json at every change."""

    def __init__(self, opts: CollectOptions, server: ServerInfo, engine: str,
                 stream: TextIO) -> None:
        self.opts = opts
        self.server = server
        self.engine = engine
        self.stream = stream
        self.out = Path(opts.out)
        self.interrupted = False
        self.stopped: str | None = None
        self.current: asyncio.Task | None = None
        self.cancel = threading.Event()  # for a vllm bench child
        self.scraper: Scraper | None = None
        self.doc: dict[str, Any] = {
            "url": server.base_url,
            "model": server.model,
            "load_engine": engine,
            "options": {k: str(v) if isinstance(v, Path) else v
                        for k, v in asdict(opts).items() if k != "engine_args"},
            "state": "running",
            "stopped": None,
            "scrape_log": SCRAPE_LOG,
            "warmup": None,
            "cooldowns": [],
            "levels": [_level_entry(lv) for lv in opts.plan()],
        }
        self.plan = {lv.name: lv for lv in opts.plan()}
        self.dataset: list[Any] | None = None  # the dataset's requests, tokenized
        self.dataset_used = 0  # requests of the dataset sent so far (levels take the next)
        self.trace = read_trace(opts.trace) if opts.trace is not None else None
        self.save()

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def save(self) -> None:
        self.doc["stopped"] = self.stopped
        _write_json(self.out / LEVELS_JSON, self.doc)

    def level(self, name: str) -> dict[str, Any]:
        return next(lv for lv in self.doc["levels"]
                    if lv.get("level", f"c{lv['concurrency']}") == name)

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
        for lv in self.doc["levels"]:
            if lv["status"] == "not run" and lv["reason"] is None:
                lv["reason"] = f"not run: {reason}"
        self.save()

    def interrupt(self) -> None:
        if self.interrupted:
            return
        self.interrupted = True
        self.say("\ninterrupted: keeping the completed levels and the scrape log; "
                 "the report runs on what exists (Ctrl-C again to skip it)")
        self.cancel.set()
        if self.current is not None:
            self.current.cancel()

    # ------------------------------------------------------------------ metrics at hand
    def latest(self, name: str) -> float | None:
        scraper = self.scraper
        text = scraper.last_text if scraper is not None else None
        return metric_total(text, name) if text else None

    async def fresh_scrape(self, limit_s: float = 10.0) -> None:
        """Ask the scraper for a scrape now and wait until it is in the log."""
        scraper = self.scraper
        if scraper is None:
            return
        asked = time.time()
        scraper.poke()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if scraper.last_t is not None and scraper.last_t >= asked:
                return
            if scraper.log.failures and scraper.log.failures[-1]["t"] >= asked:
                return
            await asyncio.sleep(0.02)

    async def engine_load(self, http: httpx.AsyncClient) -> float | None:
        """Requests running + waiting in the engine right now (None if /metrics fails)."""
        try:
            resp = await http.get(self.server.metrics_url, headers={"Accept": ACCEPT},
                                  timeout=5.0)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        running = metric_total(resp.text, RUNNING)
        waiting = metric_total(resp.text, WAITING)
        if running is None:
            return None
        return running + (waiting or 0.0)

    async def settle(self, http: httpx.AsyncClient, limit_s: float) -> bool:
        """Wait until the engine holds no request (its last step's counters are then in
        /metrics); False when it still does after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while True:
            if await self.engine_load(http) == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def cooldown(self, http: httpx.AsyncClient, after: str) -> None:
        """Let the engine drain (requests a cancelled client left behind finish or abort) and
        rest ``cooldown_s``; recorded as a cool-down, never as part of a level."""
        start = time.time()
        idle = await self.settle(http, 60.0)
        await asyncio.sleep(self.opts.cooldown_s)
        await self.fresh_scrape()
        entry = {"after": after, "start": start, "end": time.time(), "idle": idle}
        if not idle:
            entry["note"] = "the engine still held requests when the next level started"
        self.doc["cooldowns"].append(entry)
        self.save()

    async def load_dataset(self, http: httpx.AsyncClient) -> None:
        """The dataset's requests, text tokenized by the server (once, before the warm-up)."""
        from kvpressure.live.load import needs_tokenizer, tokenize

        o = self.opts
        if o.dataset is None:
            return
        requests = read_dataset(o.dataset, o.output_len)
        wanted = sum(o.requests_at(lv) or len(requests) for lv in o.plan())
        requests = requests[:wanted] if wanted < len(requests) else requests
        if needs_tokenizer(requests):
            self.say(f"dataset {o.dataset}: tokenizing {len(requests)} prompts with the "
                     "server's /tokenize")
            requests = await tokenize(http, self.server.base_url, self.server.model, requests)
        if wanted > len(requests):
            self.say(f"note: the levels send {wanted} requests and the dataset holds "
                     f"{len(requests)}: it is sent again from its start")
        self.dataset = requests
        self.doc["dataset"] = {"file": str(o.dataset), "requests": len(requests)}
        self.save()

    # ------------------------------------------------------------------ the warm-up
    async def warmup(self, http: httpx.AsyncClient) -> None:
        n = self.opts.warmup
        if n == 0:
            return
        first = self.opts.plan()[0]
        c = min(n, first.concurrency or n)
        source = self._source(WARMUP_STREAM)
        self.say(f"warm-up: {n} requests at concurrency {c} (not measured)")
        res = await closed_loop(http, self.server.completions_url, self.server.model, source, c,
                                num_requests=n, timeout_s=self.opts.level_timeout_s)
        errors = [o for o in res.outcomes if not o.success]
        self.doc["warmup"] = {"requests": n, "concurrency": c, "start": res.started,
                              "end": res.ended, "failed": len(errors)}
        self.save()
        if len(errors) == len(res.outcomes):
            raise InputError(f"URL {self.server.base_url}: every warm-up request failed "
                             f"({error_summary(errors)})")

    def _source(self, stream: int) -> RequestSource:
        o = self.opts
        return RequestSource(o.input_len, o.output_len, o.seed, stream, o.range_ratio,
                             o.token_ids)

    def _requests(self, level: LoadLevel, index: int, n: int | None
                  ) -> Callable[[int], tuple[list[int], int]]:
        """Request k of a level: a trace's, the dataset's next, or random ids of the lengths."""
        o = self.opts
        if self.trace is not None:
            trace = self.trace
            return lambda k: (trace_prompt(trace[k], k, o.seed, o.token_ids),
                              trace[k].output_len)
        if self.dataset is not None:
            data, start = self.dataset, self.dataset_used
            # The levels take consecutive requests of the dataset (no prompt is sent twice
            # while the dataset lasts; the prefix cache would serve a repeat).
            self.dataset_used += n or len(data)
            return lambda k: (dataset_prompt(data[(start + k) % len(data)], start + k, o.seed,
                                             o.token_ids), data[(start + k) % len(data)].output_len)
        if level.closed:
            return self._source(int(level.concurrency or 1))
        return self._source(RATE_STREAM + index)

    def _send_at(self, level: LoadLevel, index: int, n: int) -> list[float]:
        o = self.opts
        if self.trace is not None:
            return [r.t_s for r in self.trace]
        return send_times(n, float(level.request_rate or 1.0), burstiness=o.burstiness,
                          arrivals=o.arrivals, seed=o.seed, stream=RATE_STREAM + index)

    # ------------------------------------------------------------------ one level
    async def run_level(self, http: httpx.AsyncClient, level: LoadLevel, index: int = 0
                        ) -> None:
        o = self.opts
        lv = self.level(level.name)
        c = level.concurrency
        n = len(self.trace) if self.trace is not None else o.requests_at(level)
        request_at = self._requests(level, index, n)
        progress = LevelProgress(c or 0, n, o.duration_per_level_s if level.closed else None,
                                 stream=self.stream, engine=self.engine,
                                 label=None if level.closed else level.label)
        base_preempt = self.latest(PREEMPTIONS)
        lv.update(status="running", start=time.time())
        self.save()
        in_row = {"failed": 0}
        seen: list[RequestOutcome] = []  # kept when the level is cancelled mid-way

        def on_outcome(outcome: RequestOutcome) -> None:
            seen.append(outcome)
            progress.done += 1
            if outcome.success:
                progress.tokens += outcome.output_len
                in_row["failed"] = 0
            else:
                progress.failed += 1
                in_row["failed"] += 1

        def should_stop() -> str | None:
            # A server that is gone (or refuses everything) fails request after request at
            # once: stop the level instead of spinning until its end.
            if in_row["failed"] >= max(3, c or 8):
                return f"{in_row['failed']} requests failed in a row"
            return None

        async def ticker() -> None:
            while True:
                now = self.latest(PREEMPTIONS)
                if now is not None and base_preempt is not None:
                    progress.preemptions = now - base_preempt
                progress.running, progress.waiting = self.latest(RUNNING), self.latest(WAITING)
                progress.draw()
                await asyncio.sleep(0.5)

        tick = asyncio.create_task(ticker())
        started = time.time()
        result: LoopResult | None = None
        bench: dict[str, Any] | None = None
        reason: str | None = None
        try:
            if self.engine == "builtin" and level.closed:
                self.current = asyncio.create_task(closed_loop(
                    http, self.server.completions_url, self.server.model, request_at, int(c or 1),
                    num_requests=n, duration_s=o.duration_per_level_s,
                    timeout_s=o.level_timeout_s, on_outcome=on_outcome,
                    should_stop=should_stop))
                result = await self.current
            elif self.engine == "builtin":
                assert n is not None
                self.current = asyncio.create_task(open_loop(
                    http, self.server.completions_url, self.server.model, request_at,
                    self._send_at(level, index, n), c, timeout_s=o.level_timeout_s,
                    on_outcome=on_outcome, should_stop=should_stop))
                result = await self.current
            else:
                bench, reason = await self._vllm_bench_level(
                    level, n or max(16, 8 * int(c or 1)))
        except asyncio.CancelledError:
            reason = "interrupted (Ctrl-C)"
        finally:
            self.current = None
            tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tick
        ended = time.time() if result is None else result.ended
        # The scrape that closes the window waits for the engine to finish its last step, so
        # the window's counters hold all of the level's work (a gone server: no wait).
        if not self.interrupted:
            await self.settle(http, 3.0)
        await self.fresh_scrape()
        if bench is not None:
            progress.done = int(bench.get("completed") or 0) + int(bench.get("failed") or 0)
            progress.failed = int(bench.get("failed") or 0)
            progress.tokens = int(bench.get("total_output_tokens") or 0)
            self._record(level, bench, True, None, progress)
            return
        outcomes = result.outcomes if result is not None else seen
        if result is not None and result.stopped and reason is None:
            reason = result.stopped
        if self.interrupted and reason is None:
            reason = "interrupted (Ctrl-C)"
        failed = [x for x in outcomes if not x.success]
        if reason is None and outcomes and len(failed) * 2 > len(outcomes):
            reason = f"most requests failed ({len(failed)} of {len(outcomes)})"
        if reason is not None and failed:
            gone = any(x.error.startswith(_GONE) for x in failed)
            if gone and not await self._answers(http):
                reason = f"the server stopped answering ({error_summary(failed, 1)})"
            else:
                reason = f"{reason}: {error_summary(failed)}"
        complete = reason is None
        res = bench_result(outcomes, concurrency=c, model=self.server.model,
                           tokenizer=o.tokenizer or self.server.model_root or self.server.model,
                           started=result.started if result is not None else started,
                           ended=ended, complete=complete, reason=reason,
                           request_rate=level.request_rate,
                           burstiness=(math.inf if o.arrivals == "constant" else o.burstiness)
                           if level.request_rate is not None else 1.0)
        if self.trace is not None:
            res["kvpressure_trace"] = {"file": str(o.trace), "send_at_s": [
                r.t_s for r in self.trace[:len(outcomes)]]}
        self._record(level, res, complete, reason, progress)

    async def _answers(self, http: httpx.AsyncClient) -> bool:
        try:
            resp = await http.get(self.server.base_url + "/v1/models", timeout=5.0)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def _vllm_bench_level(self, level: LoadLevel, n: int
                                ) -> tuple[dict[str, Any] | None, str | None]:
        """The level run by vllm bench serve (in a thread): (result, None) or (None, why)."""
        from kvpressure.live.vllm_bench import run_level

        o = self.opts
        c = level.concurrency
        tokenizer = o.tokenizer or self.server.model_root or self.server.model
        self.cancel.clear()
        rate = level.request_rate
        seed = o.seed + (int(c or 0) if rate is None else RATE_STREAM + self._index(level))
        run = await asyncio.get_running_loop().run_in_executor(None, lambda: run_level(
            o.vllm or "vllm", base_url=self.server.base_url, model=self.server.model,
            tokenizer=tokenizer, concurrency=c, num_prompts=n, input_len=o.input_len,
            output_len=o.output_len, range_ratio=o.range_ratio, seed=seed,
            work_dir=self.out / BENCH_DIR / "vllm-bench", timeout_s=o.level_timeout_s,
            cancel=self.cancel, request_rate=rate,
            burstiness=o.burstiness if o.arrivals == "poisson" else None,
            extra_args=o.bench_args, name=level.name))
        return run.result, run.reason

    def _index(self, level: LoadLevel) -> int:
        return [lv.name for lv in self.opts.plan()].index(level.name)

    def _record(self, level: LoadLevel, res: dict[str, Any], complete: bool,
                reason: str | None, progress: LevelProgress | None) -> None:
        o = self.opts
        c = level.label
        path = write_result(res, self.out / BENCH_DIR / f"{level.name}.json")
        ttfts = [t for t, e in zip(res.get("ttfts", []), res.get("errors", []), strict=False)
                 if not e]
        ttft_p95 = res.get("p95_ttft_ms")
        ttft_p95 = ttft_p95 / 1000.0 if isinstance(ttft_p95, int | float) else _percentile(
            ttfts, 95)
        lv = self.level(level.name)
        lv.update(
            status="complete" if complete else "incomplete", reason=reason,
            start=res["kvpressure_window"]["start"], end=res["kvpressure_window"]["end"],
            requests=res.get("num_prompts"), completed=res.get("completed"),
            failed=res.get("failed"), output_throughput=res.get("output_throughput"),
            total_output_tokens=res.get("total_output_tokens"),
            ttft_p95_s=ttft_p95 if res.get("completed") else None,
            result=str(path.relative_to(self.out)),
        )
        now = self.latest(PREEMPTIONS)
        saturated = (complete and o.max_ttft_s is not None and lv["ttft_p95_s"] is not None
                     and lv["ttft_p95_s"] > o.max_ttft_s)
        lv["saturated"] = bool(saturated)
        verdict = ("complete" if complete else f"INCOMPLETE: {reason}")
        if saturated:
            verdict += f"; saturated (TTFT p95 {lv['ttft_p95_s']:.2f} s > --max-ttft " \
                       f"{o.max_ttft_s:g} s)"
        if progress is not None:
            progress.finish(verdict)
        else:
            tput = res.get("output_throughput") or 0.0
            self.say(f"{c:<6} {res.get('completed')} req  {tput:7.1f} tok/s  "
                     f"preemptions so far {now if now is not None else '?'}  -> {verdict}")
        self.save()
        if not complete:
            self.stop(f"level {c} incomplete: {reason}")
        elif saturated:
            self.stop(f"level {c} saturated: TTFT p95 {lv['ttft_p95_s']:.2f} s over "
                      f"--max-ttft {o.max_ttft_s:g} s")

    # ------------------------------------------------------------------ the whole sweep
    async def drive(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.interrupt)
        plan = self.opts.plan()
        # An open loop has no cap on requests in flight: nor has its connection pool.
        most = (None if any(lv.concurrency is None for lv in plan)
                else max(int(lv.concurrency or 1) for lv in plan) + 8)
        limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
        timeout = httpx.Timeout(self.opts.request_timeout_s, connect=10.0)
        try:
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
                try:
                    await self.load_dataset(http)
                    await self.warmup(http)
                    await self.cooldown(http, "warm-up")
                    for k, level in enumerate(plan):
                        if self.interrupted or self.stopped:
                            break
                        await self.run_level(http, level, k)
                        if self.interrupted or self.stopped:
                            break
                        if k + 1 < len(plan):
                            await self.cooldown(http, level.name)
                except asyncio.CancelledError:
                    if not self.interrupted:
                        raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        if self.interrupted:
            self.stop("interrupted (Ctrl-C)")


def _level_entry(level: LoadLevel) -> dict[str, Any]:
    """A level's entry in levels.json before it runs (a closed loop's as it always was)."""
    if level.closed:
        return {"concurrency": level.concurrency, "status": "not run", "reason": None}
    return {"level": level.name, "concurrency": level.concurrency,
            "request_rate": level.request_rate, "status": "not run", "reason": None}


def choose_engine(opts: CollectOptions) -> str:
    """``builtin`` or ``vllm-bench`` (auto: vllm bench serve when installed and the sweep is in
    prompts per level, which is what it runs)."""
    from kvpressure.live.vllm_bench import find_vllm

    if opts.load_engine == "builtin":
        return "builtin"
    if opts.dataset is not None or opts.trace is not None:
        if opts.load_engine == "vllm-bench":
            raise InputError("--load-engine vllm-bench: --dataset and --trace run on the "
                             "builtin client (it sends each request's exact lengths and times)")
        return "builtin"
    if opts.arrivals == "constant" and opts.request_rates:
        if opts.load_engine == "vllm-bench":
            raise InputError("--load-engine vllm-bench: --arrivals constant runs on the builtin "
                             "client (vllm bench serve draws gamma gaps: --burstiness)")
        return "builtin"
    vllm = find_vllm(opts.vllm)
    if opts.load_engine == "vllm-bench":
        if vllm is None:
            raise InputError("--load-engine vllm-bench: no `vllm` executable on PATH "
                             "(give --vllm PATH, or --load-engine builtin)")
        if opts.duration_per_level_s is not None:
            raise InputError("--load-engine vllm-bench runs a number of prompts per level; "
                             "give --prompts-per-level instead of --duration-per-level")
        opts.vllm = vllm
        return "vllm-bench"
    if vllm is not None and opts.duration_per_level_s is None:
        opts.vllm = vllm
        return "vllm-bench"
    return "builtin"


def _fetch_prometheus(sweep: _Sweep, t0: float, t1: float) -> dict[str, Any]:
    """The sweep's range read back through the Prometheus server into ``prometheus/``."""
    from kvpressure.ingestion.api import ingest
    from kvpressure.ingestion.ingest_options import IngestOptions

    url = sweep.opts.prometheus or ""
    # Up to the Prometheus server's first scrape after the sweep, so its series end, like the
    # scrape log, on the server at rest.
    t1 = max(t1, _wait_for_prometheus(url, t1))
    try:
        res = ingest([url], run="prometheus",
                     options=IngestOptions(start=t0, end=t1, timeout=30.0))
    except InputError as exc:
        return {"url": url, "error": str(exc)}
    folder = sweep.out / PROMETHEUS_DIR
    res.write(folder)
    return {"url": url, "start": t0, "end": t1, "folder": PROMETHEUS_DIR,
            "series_rows": int(len(res.series)), "warnings": res.report.warnings}


def _wait_for_prometheus(url: str, t: float, limit_s: float = 30.0) -> float:
    """The time of the Prometheus server's first scrape at or after ``t`` (waiting up to
    ``limit_s`` for it); ``t`` when it does not come."""
    deadline = time.monotonic() + limit_s
    with httpx.Client(timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                resp = http.get(url.rstrip("/") + "/api/v1/query",
                                params={"query": "max(timestamp(up))"})
                result = resp.json()["data"]["result"]
                if result and float(result[0]["value"][1]) >= t:
                    return float(result[0]["value"][1]) + 0.001
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                pass
            time.sleep(0.5)
    return t


def run_collect(opts: CollectOptions, *, stream: TextIO | None = None,
                on_scrape: Callable[[float, str], None] | None = None) -> CollectOutcome:
    """The sweep, with the scrape log recorded through all of it (the report is separate:
    :func:`report_on`)."""
    stream = stream or sys.stderr
    opts.check()
    engine = choose_engine(opts)
    server = probe(opts.url, model=opts.model)
    out = prepare_out(opts.out)
    args, origin, notes = server.engine_args(opts.engine_args)
    from kvpressure import __version__

    started = {}
    if opts.server_log is not None:
        from kvpressure.ingestion.server_log import startup_facts

        started = startup_facts(opts.server_log)
    _write_json(out / ENGINE_JSON, {
        "server": {**server.to_dict(), **started}, "engine_args": args,
        "engine_args_from": origin,
        # the load tool: the kit's own closed-loop client or vllm bench serve
        "client": {"name": "vllm bench serve" if engine == "vllm-bench" else "builtin client",
                   "kvpressure": __version__},
        "notes": notes,
        "not_exported": sorted({"max_num_seqs", "max_num_batched_tokens"} - set(args)),
    })
    for note in notes:
        print(f"note: {note}", file=stream)
    sweep = _Sweep(opts, server, engine, stream)
    print(f"{server.model} at {server.base_url}: {server.cache_config.get('num_gpu_blocks', '?')} "
          f"KV blocks of {server.cache_config.get('block_size', '?')} tokens; levels "
          f"{', '.join(lv.label for lv in opts.plan())} ({engine} load); recording /metrics every "
          f"{opts.scrape_interval_s:g} s into {out / SCRAPE_LOG}", file=stream, flush=True)
    scraper = Scraper(server.metrics_url, out / SCRAPE_LOG, interval_s=opts.scrape_interval_s,
                      timeout_s=max(1.0, min(10.0, 4 * opts.scrape_interval_s)),
                      on_scrape=on_scrape)
    sweep.scraper = scraper
    failure: list[BaseException] = []

    def scrape_forever() -> None:
        try:
            scraper.run()
        except BaseException as exc:  # kept for the main thread: the sweep must not hide it
            failure.append(exc)

    thread = threading.Thread(target=scrape_forever, name="kvpressure-scraper", daemon=True)
    thread.start()
    t_first = time.time()
    try:
        asyncio.run(sweep.drive())
    except KeyboardInterrupt:
        sweep.interrupt()
        sweep.stop("interrupted (Ctrl-C)")
    finally:
        scraper.poke()
        time.sleep(0.1)
        scraper.stop()
        thread.join(timeout=15)
        sweep.doc["state"] = ("interrupted" if sweep.interrupted else
                              "stopped" if sweep.stopped else "complete")
        sweep.doc["scrapes"] = scraper.log.scrapes
        sweep.doc["scrape_gaps"] = len(scraper.log.failures)
        sweep.save()
    t_last = time.time()
    late: list[str] = []
    if failure:
        late.append(f"the scraper stopped: {failure[0]}")
    if opts.prometheus and not sweep.interrupted:
        sweep.doc["prometheus"] = _fetch_prometheus(sweep, t_first, t_last)
        sweep.save()
    server_log = None
    if opts.server_log is not None and Path(opts.server_log).is_file():
        server_log = out / SERVER_LOG_COPY
        shutil.copyfile(opts.server_log, server_log)
    return CollectOutcome(out, sweep.doc["levels"], sweep.stopped, sweep.interrupted,
                          notes=late, server_log=server_log)


def report_on(outcome: CollectOutcome, *, jobs: int = 2,
              params: dict[str, Any] | None = None) -> Path | None:
    """``kvpressure report`` on the complete levels and the scrape log, into ``report/``."""
    from kvpressure.investigation.report import make_report

    out = outcome.out
    if not outcome.complete_levels:
        return None
    folder = read_collect_folder(out, None if outcome.server_log is None
                                 else Path(outcome.server_log))
    merged = {"engine_args": folder.engine_args, "model_name": folder.model_name,
              **(params or {})}
    result = make_report(out / REPORT_DIR, sources=folder.sources, params=merged, jobs=jobs)
    outcome.report = result.index_path
    return result.index_path
