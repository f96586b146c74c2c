"""``kvpressure capacity``: the KV pool vLLM 0.33.0 would build, and how many sequences fit."""

from __future__ import annotations

import argparse
import json
import sys

from kvpressure.profiles import GiB, dtype_bytes, safe_concurrency, size_kv_pool
from kvpressure.profiles.kvpool import DEFAULT_GPU_MEMORY_UTILIZATION, KVPoolSizing

DEFAULT_AVG_SEQ_LENS = (1024, 2048, 4096, 8192)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", required=True,
                        help="built-in hardware profile name (see `kvpressure profiles`) or YAML")
    parser.add_argument("--model", required=True,
                        help="built-in model profile name, profile YAML, or HF config.json")
    parser.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                        help="tensor-parallel size (default 1)")
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
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="KV memory per rank; skips the profiling estimate")
    parser.add_argument("--avg-seq-len", type=int, nargs="+", default=None, metavar="TOKENS",
                        help="average prompt + output lengths for the safe-concurrency table "
                             f"(default {' '.join(map(str, DEFAULT_AVG_SEQ_LENS))})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    kv_dtype = None if args.kv_cache_dtype == "auto" else dtype_bytes(
        args.kv_cache_dtype, "--kv-cache-dtype"
    )
    sizing = size_kv_pool(
        args.hardware,
        args.model,
        tp=args.tp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        kv_cache_dtype_bytes=kv_dtype,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
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
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_sizing(sizing, rows))
    return 0


def format_sizing(s: KVPoolSizing, rows: list[dict]) -> str:
    lines = [
        f"KV pool: {s.model} on {s.hardware}, TP {s.tensor_parallel_size}, "
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
