"""``kvpressure capacity``: the KV pool vLLM 0.33.0 would build, and how many sequences fit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvpressure.errors import EXIT_WOULD_NOT_START, InputError
from kvpressure.profiles import GiB, dtype_bytes, safe_concurrency, size_kv_pool
from kvpressure.profiles.fields import parse_size
from kvpressure.profiles.kvpool import DEFAULT_GPU_MEMORY_UTILIZATION, KVPoolError, KVPoolSizing
from kvpressure.profiles.startup_log import (
    ROUNDING_BYTES,
    StartupLog,
    blocks_from_tokens,
    read_startup_log,
)

MEASURED = (  # flag, size_kv_pool argument, what vLLM logs it as
    ("--weights", "weights_bytes", "Model loading took / model weights take"),
    ("--non-torch", "non_torch_bytes", "non_torch_memory"),
    ("--activation-peak", "activation_bytes", "PyTorch activation peak memory / peak activation"),
    ("--cudagraph", "cudagraph_bytes", "CUDA graph memory"),
    ("--total-memory", "total_memory_bytes", "total_gpu_memory"),
)


DEFAULT_AVG_SEQ_LENS = (1024, 2048, 4096, 8192)
REFUSED = EXIT_WOULD_NOT_START
"""Exit code when vLLM would refuse to start for want of KV memory (0 blocks are shown)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", required=True,
                        help="built-in hardware profile name (see `kvpressure profiles`) or YAML")
    parser.add_argument("--model", required=True,
                        help="built-in model profile name, profile YAML, or HF config.json")
    parser.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=None,
                        help="tensor-parallel size (default 1, or the log's)")
    parser.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=int, default=None,
                        help="pipeline-parallel size (default 1, or the log's)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        default=DEFAULT_GPU_MEMORY_UTILIZATION,
                        help=f"fraction of device memory vLLM may use "
                             f"(default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM 0.33.0)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="default: the model's max_position_embeddings; -1 = vLLM's auto "
                             "(shrink to what fits)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="default: vLLM's device-tier default for `vllm serve`")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="default: vLLM's device-tier default for `vllm serve`")
    parser.add_argument("--block-size", type=int, default=None,
                        help="default: the platform's (16 CUDA, 128 Ascend)")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="auto (= model dtype), fp8, bfloat16, ... (default auto)")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--kv-cache-memory-bytes", default=None, metavar="SIZE",
                        help="KV memory per rank (40GiB, 40GB, or whole bytes); skips the profiling "
                             "estimate")
    for flag, _, logged in MEASURED:
        parser.add_argument(flag, default=None, metavar="SIZE",
                            help=f"measured per-rank figure replacing the estimate "
                                 f"(vLLM logs it as '{logged}'): 14.96GiB, 16GB, or whole bytes "
                             "(a bare 14.96 is refused: the unit decides)")
    parser.add_argument("--from-log", default=None, metavar="STARTUP.log",
                        help="a vLLM startup log (V1 or V0): its measured figures replace the "
                             "estimates, and the log's numbers are shown next to the kit's")
    parser.add_argument("--avg-seq-len", type=int, nargs="+", default=None, metavar="TOKENS",
                        help="average prompt + output lengths for the safe-concurrency table "
                             f"(default {' '.join(map(str, DEFAULT_AVG_SEQ_LENS))})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.epilog = ("Exit code 3 when vLLM would refuse to start: no memory left for KV cache "
                     "blocks (the pool shown at 0 blocks), weights larger than the memory, or "
                     "a max_model_len no pool holds.")


# The sizing's parameter names as the options that set them, for refusals.
OPTIONS = {"tensor_parallel_size": "--tp", "pipeline_parallel_size": "--pp",
           "gpu_memory_utilization": "--gpu-memory-utilization",
           "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
           "max_num_seqs": "--max-num-seqs", "block_size": "--block-size",
           "num_gpu_blocks_override": "--num-gpu-blocks-override",
           "kv_cache_memory_bytes": "--kv-cache-memory-bytes", "avg_seq_len": "--avg-seq-len",
           **{arg: flag for flag, arg, _ in MEASURED}}


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KVPoolError as exc:
        # weights that do not fit, or a max_model_len no pool holds: vLLM stops at startup
        sys.stderr.write(f"vLLM would not start: {exc}\n")
        return REFUSED
    except InputError as exc:
        name, sep, rest = str(exc).partition(":")
        if sep and name in OPTIONS:
            raise InputError(f"{OPTIONS[name]}:{rest}") from None
        raise


def _run(args: argparse.Namespace) -> int:
    kv_dtype = None if args.kv_cache_dtype == "auto" else dtype_bytes(
        args.kv_cache_dtype, "--kv-cache-dtype"
    )
    try:
        log = read_startup_log(args.from_log) if args.from_log else None
    except InputError as exc:
        raise InputError(f"--from-log {exc}") from None
    tp = args.tp if args.tp is not None else (log and log.tensor_parallel_size) or 1
    pp = args.pp if args.pp is not None else (log and log.pipeline_parallel_size) or 1
    max_len = args.max_model_len if args.max_model_len is not None else (
        log.max_model_len if log else None)
    util = args.gpu_memory_utilization
    if log and log.gpu_memory_utilization is not None and \
            args.gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION:
        util = log.gpu_memory_utilization
    common: dict[str, Any] = dict(
        tp=tp, pp=pp, gpu_memory_utilization=util, max_model_len=max_len,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        block_size=args.block_size, kv_cache_dtype_bytes=kv_dtype,
    )
    measured: dict[str, Any] = {arg: parse_size(getattr(args, flag[2:].replace("-", "_")), flag)
                for flag, arg, _ in MEASURED
                if getattr(args, flag[2:].replace("-", "_")) is not None}
    kv_bytes = (parse_size(args.kv_cache_memory_bytes, "--kv-cache-memory-bytes")
                if args.kv_cache_memory_bytes is not None else None)
    comparison = None
    if log is not None:
        estimate = size_kv_pool(args.hardware, args.model, **common)
        sizing, comparison = compare_with_log(log, estimate, args.hardware, args.model, common)
    else:
        sizing = size_kv_pool(
            args.hardware, args.model, **common,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            kv_cache_memory_bytes=kv_bytes, **measured,
        )
    for n in args.avg_seq_len or []:
        if not 1 <= n <= sizing.max_model_len:  # no sequence is longer than max_model_len
            raise InputError(f"--avg-seq-len {n}: must be from 1 to max_model_len "
                             f"({sizing.max_model_len:,} tokens)")
    lens = args.avg_seq_len or [n for n in DEFAULT_AVG_SEQ_LENS if n <= sizing.max_model_len]
    rows = [
        {
            "avg_seq_len": n,
            "safe_concurrency": safe_concurrency(sizing, n),
            "safe_concurrency_half_filled_tail": safe_concurrency(sizing, n, half_filled_tail=True),
        }
        for n in (lens or [sizing.max_model_len])
    ]
    if args.json:
        out = sizing.to_dict()
        out["safe_concurrency"] = rows
        if comparison is not None:
            out["from_log"] = comparison
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_sizing(sizing, rows))
        if comparison is not None:
            sys.stdout.write(format_comparison(comparison))
    for warning in sizing.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    if sizing.refusal:
        # a valid answer, not the user's error (2) nor a bug (1): this setup does not start
        sys.stderr.write(f"vLLM would not start: {sizing.refusal}\n")
        return REFUSED
    return 0


def compare_with_log(log: StartupLog, estimate: KVPoolSizing, hardware: str, model: str,
                     common: dict) -> tuple[KVPoolSizing, dict]:
    """The pool from the log's own measured figures, and a field-by-field comparison of the
    log, that reproduction and the full estimate (profiles only)."""
    if log.available_kv_gib is not None:
        kv_bytes = int(round(log.available_kv_gib * GiB))
        reproduced = size_kv_pool(hardware, model, **common, kv_cache_memory_bytes=kv_bytes)
        bpb = reproduced.block_bytes
        lo = max(0, kv_bytes - ROUNDING_BYTES) // bpb
        hi = (kv_bytes + ROUNDING_BYTES) // bpb
    else:
        reproduced, lo, hi = estimate, None, None
    log_blocks = log.num_gpu_blocks
    if log_blocks is None and log.kv_cache_size_tokens is not None and log.max_model_len:
        log_blocks = blocks_from_tokens(log.kv_cache_size_tokens, reproduced.max_model_len,
                                        reproduced.blocks_per_max_len_request)
    blocks = reproduced.num_gpu_blocks
    if lo is not None and hi is not None and log_blocks is not None and lo <= log_blocks <= hi:
        # the log rounds to 0.01 GiB: the count inside that interval it names is the one
        blocks = log_blocks
        reproduced = size_kv_pool(hardware, model, **common,
                                  kv_cache_memory_bytes=kv_bytes if kv_bytes else None,
                                  num_gpu_blocks_override=blocks)
    g = GiB

    def gib(x: int | None) -> float | None:
        return None if x is None else round(x / g, 2)

    fields = [
        ("total memory (GiB)", log.total_memory_gib, None, gib(estimate.total_memory_bytes)),
        ("requested (GiB)", log.requested_gib, None, gib(estimate.requested_bytes)),
        ("weights (GiB)", log.weights_gib, None, gib(estimate.weights_bytes)),
        ("non-torch (GiB)", log.non_torch_gib, None, gib(estimate.non_torch_bytes)),
        ("activation peak (GiB)", log.activation_peak_gib, None,
         gib(estimate.activation_peak_bytes)),
        ("graph pool (GiB)", log.cudagraph_gib, None, None),
        ("graph-pool estimate (GiB)", log.cudagraph_estimate_gib, None,
         gib(estimate.cudagraph_bytes)),
        ("available KV memory (GiB)", log.available_kv_gib, gib(reproduced.available_kv_bytes),
         gib(estimate.available_kv_bytes)),
        ("num_gpu_blocks", log_blocks, blocks, estimate.num_gpu_blocks),
        ("KV cache size (tokens)", log.kv_cache_size_tokens, reproduced.kv_cache_size_tokens,
         estimate.kv_cache_size_tokens),
        ("max concurrency", log.max_concurrency, round(reproduced.max_concurrency, 2),
         round(estimate.max_concurrency, 2)),
    ]
    rows = [{"field": f, "log": a, "from_log": b, "estimate": c} for f, a, b, c in fields]
    exact = log_blocks is not None and blocks == log_blocks
    # the pool vLLM 0.33.0 would build from the same measurements: releases before 0.21 did
    # not take the graph-pool estimate out of the KV budget
    blocks_033 = log_blocks
    if log.available_kv_gib is not None and not log.subtracts_graph_estimate() \
            and log.cudagraph_estimate_gib is not None:
        blocks_033 = int(round((log.available_kv_gib - log.cudagraph_estimate_gib) * GiB)) \
            // reproduced.block_bytes
        rows.append({"field": "num_gpu_blocks under 0.33.0 rules", "log": blocks_033,
                     "from_log": None, "estimate": estimate.num_gpu_blocks})
    error = (None if not blocks_033 else
             round(estimate.num_gpu_blocks / blocks_033 - 1, 4))
    return reproduced, {
        "log": log.to_dict(), "rows": rows, "blocks_interval": [lo, hi],
        "reproduces_blocks": exact, "blocks_vllm_033": blocks_033, "estimate_error": error,
    }


def format_comparison(c: dict) -> str:
    def cell(v: object) -> str:
        if v is None:
            return "-"
        return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"

    lines = ["", f"Startup log {c['log']['path']} ({c['log']['format']} format) next to the kit",
             f"  {'field':<28s} {'log':>12s} {'from log':>12s} {'estimate':>12s}"]
    for r in c["rows"]:
        lines.append(f"  {r['field']:<28s} {cell(r['log']):>12s} {cell(r['from_log']):>12s} "
                     f"{cell(r['estimate']):>12s}")
    lo, hi = c["blocks_interval"]
    if lo is not None:
        lines.append(f"  the log's 0.01 GiB rounding allows {lo:,}-{hi:,} blocks")
    lines.append("  blocks reproduced from the log's figures: "
                 + ("yes" if c["reproduces_blocks"] else "no"))
    if c["estimate_error"] is not None:
        lines.append(f"  full estimate vs the blocks vLLM 0.33.0 builds from the log's "
                     f"measurements: {c['estimate_error']:+.1%}")
    return "\n".join(lines) + "\n"


def format_sizing(s: KVPoolSizing, rows: list[dict]) -> str:
    lines = [
        f"KV pool: {s.model} on {s.hardware}, TP {s.tensor_parallel_size}, "
        f"PP {s.pipeline_parallel_size}, "
        f"gpu_memory_utilization {s.gpu_memory_utilization:g}",
        f"  max_model_len {s.max_model_len}, max_num_batched_tokens {s.max_num_batched_tokens}, "
        f"max_num_seqs {s.max_num_seqs}, block_size {s.block_size}",
        "",
        "Memory per card                       GiB   share",
    ]
    for row in s.memory_breakdown():
        lines.append(f"  {row['component']:<33s} {row['GiB']:8.2f} {row['share_of_card']:6.1%}")
    if s.estimated:
        lines.append(f"  (estimated, not measured: {', '.join(s.estimated)})")
    if s.pipeline_parallel_size > 1:
        lines.append(f"  (pipeline stage {s.deciding_stage} of {s.pipeline_parallel_size} has "
                     "the fewest blocks and decides the pool)")
    if len(s.kv_groups) > 1 or any(g["kind"] != "full" for g in s.kv_groups):
        lines.append("")
        lines.append("KV-cache groups (vLLM's hybrid manager)")
        for g in s.kv_groups:
            window = f" window {g['window']}" if g["window"] else ""
            lines.append(f"  {g['kind']}{window}: {g['num_layers']} layers, block_size "
                         f"{g['block_size']}, {g['blocks_per_request']} blocks per "
                         f"max_model_len request")
    lines += [
        "",
        f"KV bytes per token per rank   {s.kv_bytes_per_token:,} "
        f"({s.kv_heads_per_rank} KV head(s) per rank)",
        f"Block bytes (all layers)      {s.block_bytes:,} ({s.block_bytes / 2**20:.2f} MiB)",
        f"num_gpu_blocks                {s.num_gpu_blocks:,} (1 null block, "
        f"{s.usable_blocks:,} usable)",
        f"KV cache size                 {s.kv_cache_size_tokens:,} tokens "
        f"({s.kv_pool_bytes / GiB:.2f} GiB)",
        f"Max concurrency at {s.max_model_len:,} tokens  {s.max_concurrency:.2f}x",
        "",
        "Sequences that fit at once (prompt + output tokens each)",
        "  avg_seq_len   whole blocks   half-filled last block",
    ]
    for r in rows:
        lines.append(
            f"  {r['avg_seq_len']:>11,}   {r['safe_concurrency']:>12,}   "
            f"{r['safe_concurrency_half_filled_tail']:>22,}"
        )
    return "\n".join(lines) + "\n"
