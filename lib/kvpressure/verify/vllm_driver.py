"""Runs step-level workloads through the scheduler of an installed vLLM (run by that vLLM's
own interpreter, not the kit's: it imports only the standard library and ``vllm``).

    python vllm_driver.py JOB.json

``JOB.json`` (written by ``kvpressure.verify.run``) holds ``{"workloads": [...]}``; each workload
has the settings in force (defaults already filled by the kit), the requests in submission
order, the loop mode and the paths of the ``steps.csv`` / ``requests.csv`` to write. One
interpreter serves every workload, because importing vLLM costs far more than driving it.

What is driven is vLLM's own ``Scheduler`` (with its ``KVCacheManager`` and block pool) on the
CPU, in the synchronous engine loop: arrivals, ``schedule()``, a fake model output (one token
for every request whose chunk reaches the end of its known tokens, none for a partial chunk),
``update_from_output()``. No model runs; the model config is a one-layer ``config.json`` that
only gives ``max_model_len`` a home. The loop rules are those of ``docs/scheduler.md`` (the
``LOOP-*`` rules) and the table formats those of ``docs/interfaces.md``.

On stdout: one JSON line per workload (``{"name", "ok", "steps", "wall_s"}`` or an
``error``), then ``{"vllm_version": ...}``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import deque
from typing import Any

VOCAB = 30000
# Scheduler arguments passed on, with vLLM 0.33.0's defaults (a release without one of them
# can still run a workload that leaves it at the default).
_SCHEDULER_ARGS = {
    "max_num_seqs": None, "max_num_batched_tokens": None, "enable_chunked_prefill": True,
    "policy": "fcfs", "long_prefill_token_threshold": 0, "scheduler_reserve_full_isl": True,
    "watermark": 0.0, "max_num_active_seqs": None,
}
STEP_COLUMNS = (
    "step", "arrivals", "num_running", "num_scheduled_reqs", "num_waiting", "num_waiting_new",
    "num_waiting_preempted", "num_waiting_deferred", "kv_usage", "num_scheduled_tokens",
    "num_prefill_tokens", "num_decode_tokens", "admitted_new", "resumed", "recomputed_tokens",
    "preemptions", "finished", "num_running_after", "num_waiting_after", "kv_usage_after",
    "prefix_cache_queries", "prefix_cache_hits",
)
REQUEST_COLUMNS = (
    "id", "prompt_len", "output_len", "priority", "prefix_group", "submit_step",
    "first_sched_step", "first_token_step", "finish_step", "preemptions", "recomputed_tokens",
    "scheduled_tokens", "prefix_hit_tokens_at_admission",
)


def _tokens(label: str, n: int) -> list[int]:
    # Tokens from a stream seeded by a label: distinct prompts share no full block by chance.
    rng = random.Random(hashlib.sha256(label.encode()).digest())
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def _output_token(rid: str, k: int) -> int:
    # A fixed function of (request, k), different across requests (docs/scheduler.md#loop-tokens).
    digest = hashlib.sha256(f"out:{rid}:{k}".encode()).digest()
    return 1 + int.from_bytes(digest[:4], "little") % (VOCAB - 1)


def _prompt(w: dict, r: dict) -> list[int]:
    seed = w.get("seed") or 0
    tokens = _tokens(f"{seed}:prompt:{r['id']}", r["prompt_len"])
    if r.get("prefix_group") is not None and r.get("prefix_len", 0) > 0:
        shared = _tokens(f"{seed}:group:{r['prefix_group']}", r["prefix_len"])
        tokens[: r["prefix_len"]] = shared
    return tokens


class _Model:
    """A model directory with a config.json only: vLLM's ModelConfig needs a place to read
    the architecture and the maximum length from; nothing is loaded from it."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvpressure-verify-")

    def path(self, max_model_len: int) -> str:
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": VOCAB + 1,
                  "max_position_embeddings": max_model_len, "torch_dtype": "float32"}
        d = os.path.join(self.dir, str(max_model_len))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        return d


def _build_scheduler(s: dict, model: _Model):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    mml = s["max_model_len"]
    model_config = ModelConfig(model=model.path(mml), skip_tokenizer_init=True,
                               max_model_len=mml, dtype="float32")
    args = {key: s.get(key) for key in _SCHEDULER_ARGS}
    # Another release may lack an argument: harmless while the workload keeps vLLM 0.33.0's
    # default for it (the behaviour is then the release's own), refused otherwise.
    known = {f.name for f in dataclasses.fields(SchedulerConfig)}
    for key in [k for k in args if k not in known]:
        if args[key] != _SCHEDULER_ARGS[key]:
            raise RuntimeError(f"this vLLM's SchedulerConfig has no {key!r}; the workload sets "
                               f"it to {args[key]!r}")
        del args[key]
    sched_config = SchedulerConfig(max_model_len=mml, is_encoder_decoder=False,
                                   async_scheduling=False, **args)
    cache_config = CacheConfig(block_size=s["block_size"],
                               enable_prefix_caching=s["enable_prefix_caching"])
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=sched_config)
    # The platform may retune defaults while the config is built; the workload's settings
    # are the ones under test, so they are put back where the scheduler reads them.
    sc = vllm_config.scheduler_config
    for key, value in args.items():
        setattr(sc, key, value)
    if hasattr(sc, "max_num_scheduled_tokens"):
        sc.max_num_scheduled_tokens = None
    vllm_config.cache_config.enable_prefix_caching = s["enable_prefix_caching"]
    vllm_config.cache_config.block_size = s["block_size"]
    vllm_config.cache_config.num_gpu_blocks = s["num_gpu_blocks"]
    vllm_config.model_config.max_model_len = mml
    spec = FullAttentionSpec(block_size=s["block_size"], num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=s["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=s["block_size"], log_stats=True)


class _Tracked:
    """What the tables report about one request, beyond vLLM's own counters."""

    __slots__ = ("spec", "request", "submit_step", "first_sched_step", "first_token_step",
                 "finish_step", "hwm", "recomputed", "scheduled", "hit_at_admission")

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        # vLLM's Request, set when it is submitted (this module runs on vLLM's types alone)
        self.request: Any = None
        self.submit_step = self.first_sched_step = self.first_token_step = -1
        self.finish_step = -1
        self.hwm = self.recomputed = self.scheduled = self.hit_at_admission = 0


def run_workload(w: dict, model: _Model) -> int:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    s = w["settings"]
    sched = _build_scheduler(s, model)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(s["block_size"], sha256)
    tracked = [_Tracked(r) for r in w["requests"]]
    by_id = {t.spec["id"]: t for t in tracked}
    closed = w["mode"] == "closed"
    concurrency = w.get("concurrency") or 0
    # Clients that come back late (docs/scheduler.md#loop-closed-return): the step before
    # which each idle client submits, oldest first.
    return_steps = w.get("return_steps") or 0
    returns = None
    if closed and (return_steps or w.get("first_alone")):
        returns = deque([0] + [1 if w.get("first_alone") else 0] * (concurrency - 1))
    # Open loop: submission order is (arrival_step, list order), docs/scheduler.md#loop-open.
    order = tracked if closed else sorted(tracked, key=lambda t: t.spec.get("arrival_step", 0))
    next_idx = 0
    submitted = 0
    unfinished = 0
    step = 0
    rows: list[tuple] = []
    idle = 0

    def submit(t: _Tracked) -> None:
        nonlocal submitted, unfinished
        sp = SamplingParams(max_tokens=t.spec["output_len"], ignore_eos=True)
        t.request = Request(t.spec["id"], _prompt(w, t.spec), sp, None,
                            arrival_time=float(submitted), priority=t.spec.get("priority", 0),
                            block_hasher=hasher)
        t.submit_step = step
        submitted += 1
        unfinished += 1
        sched.add_request(t.request)

    while True:
        arrivals = 0
        if returns is not None:
            while next_idx < len(order) and returns and returns[0] <= step:
                returns.popleft()
                submit(order[next_idx])
                next_idx += 1
                arrivals += 1
        elif closed:
            while next_idx < len(order) and unfinished < concurrency:
                submit(order[next_idx])
                next_idx += 1
                arrivals += 1
        else:
            while next_idx < len(order) and order[next_idx].spec.get("arrival_step", 0) <= step:
                submit(order[next_idx])
                next_idx += 1
                arrivals += 1
        if next_idx >= len(order) and unfinished == 0:
            # The reference runs end with the last finish: no empty step after it.
            break
        if not sched.has_requests():
            if returns and next_idx < len(order):
                # Nothing in the engine until the next client comes back.
                step = max(step, returns[0])
                continue
            if not closed:
                # Nothing in the engine and the next arrival lies ahead: jump
                # (docs/scheduler.md#loop-open).
                step = order[next_idx].spec.get("arrival_step", 0)
                continue
        # Before schedule(): what only the state before the step can tell.
        was_decoding = {r.request_id for r in sched.running if not r.is_prefill_chunk}
        was_running = {r.request_id for r in sched.running}
        waiting_status = {r.request_id: r.status for r in _waiting(sched)}
        out = sched.schedule()
        stats = sched.kv_cache_manager.make_prefix_cache_stats()
        num_running, num_waiting = sched.get_request_counts()
        waiting_now = list(_waiting(sched))
        n_wait_new = sum(1 for r in waiting_now if r.status == RequestStatus.WAITING)
        n_wait_pre = sum(1 for r in waiting_now if r.status == RequestStatus.PREEMPTED)
        kv_usage = sched.kv_cache_manager.usage
        total = prefill = decode = recomputed = admitted_new = resumed = 0
        sampled: list[list[int]] = []
        req_ids = list(out.num_scheduled_tokens)
        for rid in req_ids:
            n = out.num_scheduled_tokens[rid]
            t = by_id[rid]
            req = t.request
            end = req.num_computed_tokens
            start = end - n
            total += n
            if rid in was_decoding and n == 1:
                decode += 1
            else:
                prefill += n
            if rid in waiting_status:
                if waiting_status[rid] == RequestStatus.PREEMPTED:
                    resumed += 1
                else:
                    admitted_new += 1
                    t.first_sched_step = step
                    t.hit_at_admission = start
            if t.hwm > start:
                r = min(end, t.hwm) - start
                recomputed += r
                t.recomputed += r
            t.hwm = max(t.hwm, end)
            t.scheduled += n
            if end >= req.num_tokens:
                sampled.append([_output_token(rid, req.num_output_tokens)])
                if req.num_output_tokens == 0:
                    t.first_token_step = step
            else:
                sampled.append([])
        preemptions = sum(by_id[rid].request.status == RequestStatus.PREEMPTED
                          for rid in was_running)
        queries = hits = 0
        if stats is not None:
            queries = stats.queries + getattr(stats, "preempted_queries", 0)
            hits = stats.hits + getattr(stats, "preempted_hits", 0)
        mro = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        sched.update_from_output(out, mro)
        finished = 0
        for rid in req_ids:
            t = by_id[rid]
            if t.finish_step < 0 and t.request.is_finished():
                t.finish_step = step
                finished += 1
                unfinished -= 1
                if returns is not None:
                    returns.append(step + 1 + return_steps)
        run_after, wait_after = sched.get_request_counts()
        rows.append((step, arrivals, num_running, len(req_ids), num_waiting, n_wait_new,
                     n_wait_pre, len(sched.deferred_waiting), kv_usage, total, prefill, decode,
                     admitted_new, resumed, recomputed, preemptions, finished, run_after,
                     wait_after, sched.kv_cache_manager.usage, queries, hits))
        idle = idle + 1 if total == 0 else 0
        if idle > 2 and unfinished:
            raise RuntimeError(f"no progress for {idle} steps at step {step} "
                               f"({unfinished} requests unfinished)")
        step += 1

    _write_steps(w["steps_csv"], rows)
    _write_requests(w["requests_csv"], tracked)
    return len(rows)


def _waiting(sched):
    queues = [sched.waiting]
    if getattr(sched, "kv_holding_waiting", None) is not None:
        queues.append(sched.kv_holding_waiting)
    for q in queues:
        yield from list(q)


def _write_steps(path: str, rows: list[tuple]) -> None:
    fmt = ",".join("%.6f" if c in ("kv_usage", "kv_usage_after") else "%d"
                   for c in STEP_COLUMNS) + "\n"
    with open(path, "w") as f:
        f.write(",".join(STEP_COLUMNS) + "\n")
        for row in rows:
            f.write(fmt % row)


def _write_requests(path: str, tracked: list[_Tracked]) -> None:
    with open(path, "w") as f:
        f.write(",".join(REQUEST_COLUMNS) + "\n")
        for t in tracked:
            r = t.spec
            req = t.request
            row = (r["id"], r["prompt_len"], r["output_len"], r.get("priority", 0),
                   r.get("prefix_group") or "", t.submit_step, t.first_sched_step,
                   t.first_token_step, t.finish_step,
                   req.num_preemptions if req is not None else 0, t.recomputed, t.scheduled,
                   t.hit_at_admission)
            f.write(",".join(str(v) for v in row) + "\n")


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        job = json.load(f)
    import vllm

    model = _Model()
    try:
        _run_all(job, model)
    finally:
        shutil.rmtree(model.dir, ignore_errors=True)
    print(json.dumps({"vllm_version": getattr(vllm, "__version__", "unknown")}), flush=True)
    return 0


def _run_all(job: dict, model: _Model) -> None:
    for w in job["workloads"]:
        t0 = time.perf_counter()
        try:
            steps = run_workload(w, model)
            line = {"name": w["name"], "ok": True, "steps": steps}
        except Exception as exc:  # reported per workload; the others still run
            line = {"name": w["name"], "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=6)}
        line["wall_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
