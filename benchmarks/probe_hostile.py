"""Hostile-but-realistic inputs through the real command line, each outcome classified.

Every case runs ``kvpressure COMMAND ...`` of a checkout (``--root``, default this one) as a
process of its own, in a fresh folder, with ``HOME`` pointing at a fake home that holds a user's
files, and a timeout. An outcome is one of:

clean refusal       exit 2, no traceback, the message names the bad input (file, key, option)
documented exit    the code the README documents (3: vLLM would not start; 5: a level
                    ended early)
accepted            exit 0 on valid input (a control), its output checked where it can be
unnamed refusal     exit 2 whose message names none of what was wrong
traceback           a Python traceback on screen
exit 1              the kit's own bug
hang                still running at the timeout (killed)
silently accepted   exit 0 on input that should be refused
silently wrong      exit 0 on valid input, but the output contradicts the input
data lost           a user's file or folder removed or changed
unescaped HTML      a script payload from the user's text reaches index.html as markup
wrong exit code     any other code (2 where 3 is documented, 3 where 2 is, a signal)
valid input refused exit 2 on a valid input
unsupported         the checkout has no such command or option (an older CLI)

The fixtures come from this script's checkout, so two checkouts run the same catalogue:

    .venv/bin/python benchmarks/probe_hostile.py                       # this checkout
    .venv/bin/python benchmarks/probe_hostile.py --root ../other --label before
    .venv/bin/python benchmarks/probe_hostile.py --compare benchmarks/out/probe_hostile_before.json \
        benchmarks/out/probe_hostile_after.json

It prints the counts per command and per outcome and every case that is not clean, and writes
``benchmarks/out/probe_hostile_<label>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the checkout the fixtures come from
TESTS = HERE / "tests" / "data"
DATA = HERE / "data"
CLEAN = ("clean refusal", "documented exit", "accepted")


# --------------------------------------------------------------------------- cases
@dataclass
class Case:
    id: str
    argv: list[str]  # after ``kvpressure``; {repo}, {home}, {url} are filled in at run time
    expect: str = "refuse"  # refuse | exit3 | exit5 (a documented code) | accept
    names: tuple[str, ...] = ()  # every one appears in the error message (case-insensitive)
    files: dict[str, bytes | str] = field(default_factory=dict)  # written into the case folder
    pre: list[list[str]] = field(default_factory=list)  # commands run first (must exit 0)
    dirs: tuple[str, ...] = ()  # folders made after ``pre``
    protect: tuple[str, ...] = ()  # paths whose content must survive the run
    html: str | None = None  # index.html to search for payloads (accept cases)
    verify: Callable[[Path], str | None] | None = None  # a problem with the output, or None
    timeout: float = 60.0
    warns: bool = False  # an accepted input must be warned about on stderr

    @property
    def command(self) -> str:
        return self.argv[0]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


CI_SMALL = _text(DATA / "experiments" / "ci_small.yaml")
L40S = _text(DATA / "hardware" / "l40s.yaml")
LLAMA = _text(DATA / "models" / "llama-3.1-8b.yaml")
HF_LLAMA = _text(TESTS / "hf_config" / "llama-3.1-8b.json")
BENCH = _text(TESTS / "bench" / "vllm033_c32.json")
DUMP = _text(TESTS / "real" / "vllm_0.32_cpu_loaded.prom")
DUMP_IDLE = _text(TESTS / "real" / "vllm_0.32_cpu_idle.prom")
STARTUP_LOG = _text(TESTS / "startup_logs" / "vllm033_llama31_8b_h100.log")
SERVER_LOG = _text(TESTS / "logs" / "v1_kv_bound.log")
DEEP = "[" * 200_000 + "]" * 200_000
DEEP_YAML_MAP = "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v: 1\n"
LAUGHS = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
          + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                    for p, c in zip("abcdefgh", "bcdefghi", strict=True)))
PAYLOADS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(2)>',
            "<svg onload=alert(3)>", "<img src=x onerror=alert(4)>")
RAW_MARKUP = ("<script>alert", "<img src=x", "<svg onload")

TINY_SCENARIO = {
    "name": "tiny",
    "settings": {"num_gpu_blocks": 64, "block_size": 16, "max_num_seqs": 4},
    "prefix_groups": {"sys": {"length": 32}},
    "requests": [{"id": "a", "prompt_len": 40, "output_len": 4},
                 {"id": "b", "prompt_len": 50, "output_len": 4, "arrival_step": 1}],
}


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _line(text: str, key: str, new: str) -> str:
    out, n = re.subn(rf"(?m)^{re.escape(key)}: .*$", new, text, count=1)
    assert n == 1, key
    return out


def _scenario(**changes) -> str:
    data = json.loads(json.dumps(TINY_SCENARIO))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return json.dumps(data, indent=1)


def _scrape_log(texts: list[str], t0: float = 1_700_000_000.0, step: float = 5.0) -> str:
    return "".join(json.dumps({"t": t0 + step * i, "text": t}) + "\n" for i, t in enumerate(texts))


def _set_counter(text: str, metric: str, value: float) -> str:
    out, n = re.subn(rf"(?m)^({re.escape(metric)}(?:\{{[^}}]*\}})?) \S+$",
                     lambda m: f"{m.group(1)} {value}", text)
    assert n, metric
    return out


def _vllm_only(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines()
                   if line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:")))


# A twin's run folder: a real sweep saved by vllm bench serve, ingested first.
TWIN_PRE = [["ingest", str(TESTS / "twin_saved" / "pool64_firstchunk" / "bench"),
             str(TESTS / "twin_saved" / "pool64_firstchunk" / "metrics.prom.jsonl.gz"),
             "--out", "run"]]


def _runs_col(name: str, expected: float) -> Callable[[Path], str | None]:
    def check(case_dir: Path) -> str | None:
        path = case_dir / "o" / "runs.csv"
        if not path.exists():
            return "no runs.csv"
        rows = list(csv.DictReader(path.open(encoding="utf-8")))
        got = [r.get(name) for r in rows]
        try:
            if rows and all(abs(float(g) - expected) < 1e-6 for g in got):
                return None
        except (TypeError, ValueError):
            pass
        return f"runs.csv {name} = {got}, the input says {expected:g}"
    return check


def _runs_nonnegative(case_dir: Path) -> str | None:
    path = case_dir / "o" / "runs.csv"
    if not path.exists():
        return "no runs.csv"
    for row in csv.DictReader(path.open(encoding="utf-8")):
        for key in ("preemptions", "generation_tokens", "prompt_tokens", "num_requests"):
            with contextlib.suppress(TypeError, ValueError):
                if float(row.get(key) or 0) < 0:
                    return f"runs.csv {key} = {row[key]} after a counter reset"
    return None


def experiment_cases() -> list[Case]:
    """Experiment YAML: every reader's mistake, simulated (and a few swept)."""
    edits: list[tuple[str, str, tuple[str, ...]]] = [
        # (id, text, names)
        ("malformed-unclosed-flow", _sub(CI_SMALL, "concurrency: [4, 8, 16, 24, 32, 48]",
                                          "concurrency: [4, 8, 16"), ("exp.yaml", "line")),
        ("malformed-tab-indent", _sub(CI_SMALL, "  num_requests: 64", "\tnum_requests: 64"),
         ("exp.yaml", "line")),
        ("malformed-bad-indent", _sub(CI_SMALL, "  seed: 7", "     seed: 7"), ("exp.yaml",)),
        ("malformed-colon-in-value", _sub(CI_SMALL, "name: ci_small", "name: a: b"),
         ("exp.yaml",)),
        ("cut-in-the-middle", CI_SMALL[:len(CI_SMALL) // 2], ("exp.yaml",)),
        ("empty-file", "", ("exp.yaml",)),
        ("comments-only", "# nothing here\n", ("exp.yaml",)),
        ("top-level-list", "- name: x\n- hardware: l40s\n", ("exp.yaml",)),
        ("top-level-scalar", "just a sentence\n", ("exp.yaml",)),
        ("duplicate-workload", CI_SMALL + "workload:\n  num_requests: 8\n  input_len: 100\n"
         "  output_len: 10\n  concurrency: [2]\n", ("exp.yaml", "workload", "twice")),
        ("duplicate-engine-key", _sub(CI_SMALL, "engine:\n",
                                      "engine:\n  max_num_seqs: 8\n  max_num_seqs: 16\n"),
         ("exp.yaml", "max_num_seqs", "twice")),
        ("duplicate-name", "name: other\n" + CI_SMALL, ("exp.yaml", "name", "twice")),
        ("duplicate-seed", _sub(CI_SMALL, "  seed: 7\n", "  seed: 7\n  seed: 8\n"),
         ("exp.yaml", "seed", "twice")),
        ("deep-list-200000", "name: " + DEEP + "\n", ("exp.yaml", "nested")),
        ("deep-map-100", CI_SMALL + "notes:\n" + "".join(
            "  " * (i + 1) + f"k{i}:\n" for i in range(100)) + "  " * 101 + "v: 1\n",
         ("exp.yaml", "nested")),
        ("billion-laughs", CI_SMALL + "description2:\n" + "".join(
            "  " + line + "\n" for line in LAUGHS.splitlines()), ("exp.yaml",)),
        ("python-tag", _sub(CI_SMALL, "name: ci_small",
                            "name: !!python/object/apply:os.system ['true']"), ("exp.yaml",)),
        ("bool-max-num-seqs", _sub(CI_SMALL, "engine:\n", "engine:\n  max_num_seqs: true\n"),
         ("exp.yaml", "max_num_seqs")),
        ("bool-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: true"),
         ("exp.yaml", "num_requests")),
        ("bool-seed", _sub(CI_SMALL, "seed: 7", "seed: true"), ("exp.yaml", "seed")),
        ("bool-tp", _sub(CI_SMALL, "tensor_parallel_size: 1", "tensor_parallel_size: true"),
         ("exp.yaml", "tensor_parallel_size")),
        ("bool-concurrency-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[4, true]"),
         ("exp.yaml", "concurrency")),
        ("bool-gpu-memory-utilization", _sub(CI_SMALL, "gpu_memory_utilization: 0.9",
                                             "gpu_memory_utilization: true"),
         ("exp.yaml", "gpu_memory_utilization")),
        ("bool-scrape-interval", _sub(CI_SMALL, "scrape_interval_s: 5", "scrape_interval_s: yes"),
         ("exp.yaml", "scrape_interval_s")),
        ("bool-max-model-len", _sub(CI_SMALL, "max_model_len: 16384", "max_model_len: on"),
         ("exp.yaml", "max_model_len")),
        ("string-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: sixty"),
         ("exp.yaml", "num_requests")),
        ("zero-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: 0"),
         ("exp.yaml", "num_requests")),
        ("negative-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: -5"),
         ("exp.yaml", "num_requests")),
        ("huge-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: 1e400"),
         ("exp.yaml", "num_requests")),
        ("inf-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: .inf"),
         ("exp.yaml", "num_requests")),
        ("float-num-requests", _sub(CI_SMALL, "num_requests: 64", "num_requests: 64.5"),
         ("exp.yaml", "num_requests")),
        ("empty-levels", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[]"),
         ("exp.yaml", "concurrency")),
        ("zero-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[0, 4]"),
         ("exp.yaml", "concurrency")),
        ("negative-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[-4, 32]"),
         ("exp.yaml", "concurrency")),
        ("fraction-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[2.5, 32]"),
         ("exp.yaml", "concurrency")),
        ("repeated-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[32, 32]"),
         ("exp.yaml", "concurrency")),
        ("nan-level", _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[.nan, 32]"),
         ("exp.yaml", "concurrency")),
        ("gpu-util-zero", _sub(CI_SMALL, "gpu_memory_utilization: 0.9",
                               "gpu_memory_utilization: 0"), ("exp.yaml", "gpu_memory_utilization")),
        ("gpu-util-above-one", _sub(CI_SMALL, "gpu_memory_utilization: 0.9",
                                    "gpu_memory_utilization: 1.5"),
         ("exp.yaml", "gpu_memory_utilization")),
        ("gpu-util-nan", _sub(CI_SMALL, "gpu_memory_utilization: 0.9",
                              "gpu_memory_utilization: .nan"), ("exp.yaml", "gpu_memory_utilization")),
        ("gpu-util-percent", _sub(CI_SMALL, "gpu_memory_utilization: 0.9",
                                  "gpu_memory_utilization: 90%"),
         ("exp.yaml", "gpu_memory_utilization")),
        ("max-model-len-zero", _sub(CI_SMALL, "max_model_len: 16384", "max_model_len: 0"),
         ("exp.yaml", "max_model_len")),
        ("max-model-len-negative", _sub(CI_SMALL, "max_model_len: 16384", "max_model_len: -1"),
         ("exp.yaml", "max_model_len")),
        ("max-model-len-with-unit", _sub(CI_SMALL, "max_model_len: 16384", "max_model_len: 16k"),
         ("exp.yaml", "max_model_len")),
        ("block-size-7", _sub(CI_SMALL, "engine:\n", "engine:\n  block_size: 7\n"),
         ("exp.yaml", "block_size")),
        ("block-size-zero", _sub(CI_SMALL, "engine:\n", "engine:\n  block_size: 0\n"),
         ("exp.yaml", "block_size")),
        ("max-num-seqs-zero", _sub(CI_SMALL, "engine:\n", "engine:\n  max_num_seqs: 0\n"),
         ("exp.yaml", "max_num_seqs")),
        ("max-num-seqs-negative", _sub(CI_SMALL, "engine:\n", "engine:\n  max_num_seqs: -8\n"),
         ("exp.yaml", "max_num_seqs")),
        ("batched-tokens-zero", _sub(CI_SMALL, "engine:\n",
                                     "engine:\n  max_num_batched_tokens: 0\n"),
         ("exp.yaml", "max_num_batched_tokens")),
        ("num-gpu-blocks-negative", _sub(CI_SMALL, "engine:\n", "engine:\n  num_gpu_blocks: -1\n"),
         ("exp.yaml", "num_gpu_blocks")),
        ("num-gpu-blocks-huge", _sub(CI_SMALL, "engine:\n",
                                     "engine:\n  num_gpu_blocks: 1000000000000\n"),
         ("exp.yaml", "num_gpu_blocks")),
        ("watermark-nan", _sub(CI_SMALL, "engine:\n", "engine:\n  watermark: .nan\n"),
         ("exp.yaml", "watermark")),
        ("watermark-above-one", _sub(CI_SMALL, "engine:\n", "engine:\n  watermark: 2\n"),
         ("exp.yaml", "watermark")),
        ("policy-unknown", _sub(CI_SMALL, "engine:\n", "engine:\n  policy: lifo\n"),
         ("exp.yaml", "policy")),
        ("misspelt-engine-key", _sub(CI_SMALL, "engine:\n", "engine:\n  max_num_seq: 20\n"),
         ("exp.yaml", "max_num_seq")),
        ("misspelt-top-key", _sub(CI_SMALL, "workload:", "wokrload:"), ("exp.yaml", "wokrload")),
        ("unknown-hardware", _sub(CI_SMALL, "hardware: l40s", "hardware: l40z"),
         ("l40z",)),
        ("unknown-model", _sub(CI_SMALL, "model: llama-3.1-8b", "model: llama-9"),
         ("llama-9",)),
        ("hardware-a-folder", _sub(CI_SMALL, "hardware: l40s", "hardware: ./"), ("hardware",)),
        ("tp-zero", _sub(CI_SMALL, "tensor_parallel_size: 1", "tensor_parallel_size: 0"),
         ("exp.yaml", "tensor_parallel_size")),
        ("tp-3-heads-do-not-divide", _sub(CI_SMALL, "tensor_parallel_size: 1",
                                          "tensor_parallel_size: 3"), ("tensor_parallel_size",)),
        ("tp-beyond-the-cards", _sub(CI_SMALL, "tensor_parallel_size: 1",
                                     "tensor_parallel_size: 64"), ("tensor_parallel_size",)),
        ("lognormal-negative-median", _sub(CI_SMALL, "median: 8000", "median: -1"),
         ("exp.yaml", "median")),
        ("lognormal-min-above-max", _sub(CI_SMALL, "min: 3000, max: 12000", "min: 13000, max: 12000"),
         ("exp.yaml", "input_len")),
        ("length-type-unknown", _sub(CI_SMALL, "type: lognormal", "type: lognormall"),
         ("exp.yaml", "lognormal")),
        ("uniform-low-above-high", _sub(CI_SMALL, "low: 300, high: 900", "low: 900, high: 300"),
         ("exp.yaml", "output_len")),
        ("uniform-nan", _sub(CI_SMALL, "low: 300", "low: .nan"), ("exp.yaml", "output_len")),
        ("prompt-beyond-max-model-len", _sub(CI_SMALL, "max_model_len: 16384", "max_model_len: 4096"),
         ("max_model_len",)),
        ("focus-not-a-level", _sub(CI_SMALL, "concurrency: 32", "concurrency: 5"),
         ("exp.yaml", "focus")),
        ("focus-variant-unknown", _sub(CI_SMALL, "focus:\n", "focus:\n  variant: max_num_seqs=3\n"),
         ("exp.yaml", "focus.variant")),
        ("comparison-parameter-unknown", _sub(CI_SMALL, "parameter: max_num_seqs",
                                              "parameter: max_num_seq"),
         ("exp.yaml", "max_num_seq")),
        ("comparison-values-empty", _sub(CI_SMALL, "values: [20]", "values: []"),
         ("exp.yaml", "values")),
        ("comparison-value-string", _sub(CI_SMALL, "values: [20]", "values: [twenty]"),
         ("exp.yaml", "values")),
        ("comparison-seeds-zero", _sub(CI_SMALL, "seeds: 3", "seeds: 0"), ("exp.yaml", "seeds")),
        ("comparison-seeds-huge", _sub(CI_SMALL, "seeds: 3", "seeds: 100000"),
         ("exp.yaml", "seeds")),
        ("remedy-value-nan", _sub(_sub(CI_SMALL, "values: [true]", "values: [.nan]"),
                                  "parameter: scheduler_reserve_full_isl", "parameter: watermark"),
         ("exp.yaml", "remedies")),
        ("remedy-value-wrong-type", _sub(CI_SMALL, "values: [true]", "values: [16]"),
         ("exp.yaml", "remedies")),
        ("remedies-not-a-list", _sub(CI_SMALL, "remedies:\n  - parameter: scheduler_reserve_full_isl"
                                     "\n    values: [true]", "remedies: scheduler_reserve_full_isl"),
         ("exp.yaml", "remedies")),
        ("cost-model-nan", CI_SMALL + "cost_model: {t0: .nan}\n", ("exp.yaml", "cost_model")),
        ("cost-model-unknown", CI_SMALL + "cost_model: {t00: 1}\n", ("exp.yaml", "t00")),
        ("scrape-interval-zero", _sub(CI_SMALL, "scrape_interval_s: 5", "scrape_interval_s: 0"),
         ("exp.yaml", "scrape_interval_s")),
        ("scrape-interval-negative", _sub(CI_SMALL, "scrape_interval_s: 5",
                                          "scrape_interval_s: -5"), ("exp.yaml", "scrape_interval_s")),
        ("name-empty", _sub(CI_SMALL, "name: ci_small", "name: ''"), ("exp.yaml", "name")),
        ("name-a-mapping", _sub(CI_SMALL, "name: ci_small", "name: {a: 1}"), ("exp.yaml", "name")),
        ("two-load-modes", _sub(CI_SMALL, "  concurrency: [4, 8, 16, 24, 32, 48]",
                                "  concurrency: [4, 8]\n  request_rates: [1, 2]"),
         ("exp.yaml", "concurrency")),
        ("rate-zero", _sub(_sub(CI_SMALL, "  concurrency: [4, 8, 16, 24, 32, 48]",
                                "  request_rates: [0, 2]"), "focus:\n  concurrency: 32", "focus: {}"),
         ("exp.yaml", "request_rates")),
        ("trace-missing", _sub(CI_SMALL, "  num_requests: 64\n",
                               "  num_requests: 64\n  trace: {path: nowhere.csv}\n"),
         ("nowhere.csv",)),
    ]
    cases = []
    for cid, text, names in edits:
        cases.append(Case(f"experiment/{cid}", ["simulate", "exp.yaml", "--out", "o",
                                                  "--no-metrics", "--concurrency", "4"],
                          names=names, files={"exp.yaml": text}))
    raw = CI_SMALL.encode()
    for cid, data in [
        ("latin1-description", raw.replace(b"Llama-3.1-8B on", b"Llama caf\xe9 on")),
        ("utf16", CI_SMALL.encode("utf-16")),
        ("binary", bytes(range(256)) * 8),
        ("gzip-cut", gzip.compress(raw)[:40]),
    ]:
        cases.append(Case(f"experiment/{cid}", ["simulate", "exp.yaml", "--out", "o",
                                                  "--no-metrics", "--concurrency", "4"],
                          names=("exp.yaml",), files={"exp.yaml": data}))
    # The same file through sweep: the reader is shared, but sweep is the command users run.
    for cid, text, names in [e for e in edits if e[0] in (
            "duplicate-engine-key", "bool-max-num-seqs", "deep-list-200000", "zero-level",
            "remedy-value-nan", "focus-variant-unknown", "unknown-hardware", "billion-laughs")]:
        cases.append(Case(f"experiment/sweep-{cid}", ["sweep", "exp.yaml", "--out", "o",
                                                        "--jobs", "1", "--concurrency", "4"],
                          names=names, files={"exp.yaml": text}))
    cases.append(Case("experiment/sweep-latin1", ["sweep", "exp.yaml", "--out", "o"],
                      names=("exp.yaml", "UTF-8"),
                      files={"exp.yaml": raw.replace(b"ci_small", b"caf\xe9", 1)}))
    # A trace whose rows are wrong.
    trace_exp = _sub(_sub(CI_SMALL, "  num_requests: 64\n", "  trace: {path: trace.csv}\n"),
                     "  input_len: {type: lognormal, median: 8000, p90: 11000, min: 3000, "
                     "max: 12000}\n  output_len: {type: uniform, low: 300, high: 900}\n", "")
    for cid, trace, names in [
        ("trace-latin1", "id,prompt_len,output_len\ncaf\xe9,100,10\n".encode("latin-1"),
         ("trace.csv", "UTF-8")),
        ("trace-negative-length", "id,prompt_len,output_len\na,-100,10\nb,100,10\n",
         ("trace.csv", "prompt_len")),
        ("trace-text-length", "id,prompt_len,output_len\na,many,10\n", ("trace.csv", "prompt_len")),
        ("trace-missing-column", "id,prompt_len\na,100\n", ("trace.csv", "output_len")),
        ("trace-empty", "", ("trace.csv",)),
        ("trace-ragged-row", "id,prompt_len,output_len\na,100,10,7,8\nb,100\n", ("trace.csv",)),
    ]:
        cases.append(Case(f"experiment/{cid}", ["simulate", "exp.yaml", "--out", "o",
                                                  "--no-metrics", "--concurrency", "4"],
                          names=names, files={"exp.yaml": trace_exp, "trace.csv": trace}))
    cases.append(Case("experiment/valid-control", ["simulate", "exp.yaml", "--out", "o",
                                                     "--no-metrics", "--concurrency", "4"],
                      expect="accept", files={"exp.yaml": CI_SMALL}))
    return cases


def scenario_cases() -> list[Case]:
    base = json.dumps(TINY_SCENARIO, indent=1)
    edits: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("malformed-trailing-comma", base.replace('"max_num_seqs": 4', '"max_num_seqs": 4,'),
         ("s.json", "line")),
        ("malformed-single-quotes", base.replace('"tiny"', "'tiny'"), ("s.json", "line")),
        ("cut", base[: len(base) // 2], ("s.json",)),
        ("empty", "", ("s.json",)),
        ("top-level-string", '"a scenario"', ("s.json",)),
        ("top-level-list-of-numbers", "[1, 2, 3]", ("s.json",)),
        ("duplicate-settings-key", base.replace('"max_num_seqs": 4',
                                                '"max_num_seqs": 4,\n "max_num_seqs": 8'),
         ("s.json", "max_num_seqs", "twice")),
        ("duplicate-top-key", base.replace('"name": "tiny"', '"name": "tiny", "name": "other"'),
         ("s.json", "name", "twice")),
        ("duplicate-request-key", base.replace('"prompt_len": 40', '"prompt_len": 40, '
                                               '"prompt_len": 4000'), ("s.json", "prompt_len")),
        ("deep-200000", DEEP, ("s.json", "nested")),
        ("deep-in-settings", base.replace('"max_num_seqs": 4', '"max_num_seqs": 4, "x": '
                                          + "[" * 5000 + "]" * 5000), ("s.json", "nested")),
        ("nan-literal", base.replace('"prompt_len": 40', '"prompt_len": NaN'),
         ("s.json", "prompt_len")),
        ("infinity-literal", base.replace('"output_len": 4', '"output_len": Infinity', 1),
         ("s.json", "output_len")),
        ("huge-number", base.replace('"prompt_len": 40', '"prompt_len": 1e400'),
         ("s.json", "prompt_len")),
        ("bool-prompt-len", _scenario(requests=[{"id": "a", "prompt_len": True, "output_len": 4}]),
         ("s.json", "prompt_len")),
        ("bool-num-gpu-blocks", _scenario(settings={"num_gpu_blocks": True}),
         ("s.json", "num_gpu_blocks")),
        ("bool-max-num-seqs", _scenario(settings={"max_num_seqs": True}),
         ("s.json", "max_num_seqs")),
        ("string-number", _scenario(settings={"num_gpu_blocks": "64"}),
         ("s.json", "num_gpu_blocks")),
        ("negative-prompt-len", _scenario(requests=[{"id": "a", "prompt_len": -4,
                                                     "output_len": 4}]), ("s.json", "prompt_len")),
        ("zero-output-len", _scenario(requests=[{"id": "a", "prompt_len": 40, "output_len": 0}]),
         ("s.json", "output_len")),
        ("fraction-prompt-len", _scenario(requests=[{"id": "a", "prompt_len": 40.5,
                                                     "output_len": 4}]), ("s.json", "prompt_len")),
        ("repeated-request-id", _scenario(requests=[{"id": "a", "prompt_len": 40, "output_len": 4},
                                                    {"id": "a", "prompt_len": 50, "output_len": 4}]),
         ("s.json", "'a'")),
        ("no-requests", _scenario(requests=[]), ("s.json", "requests")),
        ("requests-a-mapping", _scenario(requests={"a": 1}), ("s.json", "requests")),
        ("negative-arrival", _scenario(requests=[{"id": "a", "prompt_len": 40, "output_len": 4,
                                                  "arrival_step": -3}]), ("s.json", "arrival_step")),
        ("unknown-prefix-group", _scenario(requests=[{"id": "a", "prompt_len": 40, "output_len": 4,
                                                      "prefix_group": "nope"}]), ("s.json", "nope")),
        ("num-gpu-blocks-zero", _scenario(settings={"num_gpu_blocks": 0}),
         ("s.json", "num_gpu_blocks")),
        ("num-gpu-blocks-huge", _scenario(settings={"num_gpu_blocks": 10**15}),
         ("s.json", "num_gpu_blocks")),
        ("policy-unknown", _scenario(settings={"policy": "random"}), ("s.json", "policy")),
        ("misspelt-setting", _scenario(settings={"max_num_seq": 4}), ("s.json", "max_num_seq")),
        ("misspelt-mode", _scenario(mdoe={"type": "closed", "concurrency": 2}), ("s.json", "mdoe")),
        ("mode-unknown", _scenario(mode={"type": "half-open"}), ("s.json", "mode")),
        ("closed-concurrency-zero", _scenario(mode={"type": "closed", "concurrency": 0}),
         ("s.json", "concurrency")),
        ("seed-negative", _scenario(seed=-1), ("s.json", "seed")),
        ("prefix-len-beyond-group", _scenario(requests=[{"id": "r7", "prompt_len": 60,
                                                         "output_len": 2, "prefix_group": "sys",
                                                         "prefix_len": 48}]), ("s.json", "r7")),
        ("prompt-beyond-pool", _scenario(requests=[{"id": "big", "prompt_len": 100000,
                                                    "output_len": 4}]), ("s.json", "big")),
        ("latin1-name", base.replace('"tiny"', '"caf\xe9"').encode("latin-1"), ("s.json", "UTF-8")),
        ("binary", bytes(range(256)) * 4, ("s.json",)),
    ]
    cases = [Case(f"scenario/{cid}", ["simulate", "s.json", "--out", "o", "--no-metrics"],
                  names=names, files={"s.json": text}) for cid, text, names in edits]
    # Documented: ids default to r<index>; a step-level workload drives the scheduler alone,
    # which takes any block size (the attention backends' multiple of 16 is the profiles').
    cases.append(Case("scenario/request-without-id-is-r0", ["simulate", "s.json", "--out", "o"],
                      expect="accept", files={"s.json": _scenario(
                          requests=[{"prompt_len": 40, "output_len": 4}])}))
    cases.append(Case("scenario/block-size-7-scheduler-only", ["simulate", "s.json", "--out", "o"],
                      expect="accept", files={"s.json": _scenario(settings={"block_size": 7})}))
    cases.append(Case("scenario/valid-control", ["simulate", "s.json", "--out", "o"],
                      expect="accept", files={"s.json": base}))
    return cases


HW_ARGV = ["capacity", "--hardware", "hw.yaml", "--model", "llama-3.1-8b"]
MODEL_ARGV = ["capacity", "--hardware", "l40s", "--model", "m.yaml"]


def profile_cases() -> list[Case]:
    hw: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("duplicate-eta-f", L40S + "eta_f: 0.1\n", ("hw.yaml", "eta_f", "twice")),
        ("duplicate-memory", _sub(L40S, "memory_gib: 48\n", "memory_gib: 48\nmemory_gib: 96\n"),
         ("hw.yaml", "memory_gib", "twice")),
        ("deep", "name: " + DEEP + "\n", ("hw.yaml", "nested")),
        ("latin1", L40S.encode().replace(b"NVIDIA L40S 48GB", b"NVIDIA L40S caf\xe9"),
         ("hw.yaml", "UTF-8")),
        ("bool-memory", _line(L40S, "memory_gib", "memory_gib: true"), ("hw.yaml", "memory_gib")),
        ("bool-eta", _line(L40S, "eta_f", "eta_f: yes"), ("hw.yaml", "eta_f")),
        ("memory-negative", _line(L40S, "memory_gib", "memory_gib: -48"), ("hw.yaml", "memory_gib")),
        ("memory-zero", _line(L40S, "memory_gib", "memory_gib: 0"), ("hw.yaml", "memory_gib")),
        ("memory-nan", _line(L40S, "memory_gib", "memory_gib: .nan"), ("hw.yaml", "memory_gib")),
        ("memory-huge", _line(L40S, "memory_gib", "memory_gib: 1.0e+30"), ("hw.yaml", "memory_gib")),
        ("memory-bare-bytes", _line(L40S, "memory_gib", "memory: 48"), ("hw.yaml", "memory")),
        ("memory-bad-unit", _line(L40S, "memory_gib", "memory: 48XB"), ("hw.yaml", "memory")),
        ("memory-string", _line(L40S, "memory_gib", "memory_gib: lots"), ("hw.yaml", "memory_gib")),
        ("usable-above-memory", _line(L40S, "usable_memory_gib", "usable_memory_gib: 480"),
         ("hw.yaml", "usable_memory_gib")),
        ("eta-above-one", _line(L40S, "eta_f", "eta_f: 7.8"), ("hw.yaml", "eta_f")),
        ("bandwidth-zero", _line(L40S, "hbm_bandwidth_gb_s", "hbm_bandwidth_gb_s: 0"),
         ("hw.yaml", "hbm_bandwidth_gb_s")),
        ("flops-negative", _line(L40S, "peak_flops_tflops", "peak_flops_tflops: -1"),
         ("hw.yaml", "peak_flops_tflops")),
        ("cards-zero", _line(L40S, "num_cards", "num_cards: 0"), ("hw.yaml", "num_cards")),
        ("cards-fraction", _line(L40S, "num_cards", "num_cards: 2.5"), ("hw.yaml", "num_cards")),
        ("block-size-7", _line(L40S, "default_block_size", "default_block_size: 7"),
         ("hw.yaml", "default_block_size")),
        ("missing-memory", _line(L40S, "memory_gib", "# no memory"), ("hw.yaml", "memory")),
        ("misspelt-key", _line(L40S, "eta_m", "eta_mm: 0.85"), ("hw.yaml", "eta_mm")),
        ("top-level-list", "- l40s\n", ("hw.yaml",)),
        ("empty", "", ("hw.yaml",)),
        ("malformed", L40S.replace("eta_a: 0.5", "eta_a: [0.5"), ("hw.yaml", "line")),
    ]
    model: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("duplicate-layers", LLAMA + "num_hidden_layers: 80\n",
         ("m.yaml", "num_hidden_layers", "twice")),
        ("deep", "name: " + DEEP + "\n", ("m.yaml", "nested")),
        ("latin1", LLAMA.encode().replace(b"Llama 3.1 8B", b"Llama caf\xe9"), ("m.yaml", "UTF-8")),
        ("bool-layers", _line(LLAMA, "num_hidden_layers", "num_hidden_layers: true"),
         ("m.yaml", "num_hidden_layers")),
        ("bool-kv-heads", _line(LLAMA, "num_key_value_heads", "num_key_value_heads: true"),
         ("m.yaml", "num_key_value_heads")),
        ("kv-heads-7", _line(LLAMA, "num_key_value_heads", "num_key_value_heads: 7"),
         ("m.yaml", "num_key_value_heads")),
        ("kv-heads-64", _line(LLAMA, "num_key_value_heads", "num_key_value_heads: 64"),
         ("m.yaml", "num_key_value_heads")),
        ("kv-heads-zero", _line(LLAMA, "num_key_value_heads", "num_key_value_heads: 0"),
         ("m.yaml", "num_key_value_heads")),
        ("layers-zero", _line(LLAMA, "num_hidden_layers", "num_hidden_layers: 0"),
         ("m.yaml", "num_hidden_layers")),
        ("layers-negative", _line(LLAMA, "num_hidden_layers", "num_hidden_layers: -32"),
         ("m.yaml", "num_hidden_layers")),
        ("hidden-nan", _line(LLAMA, "hidden_size", "hidden_size: .nan"), ("m.yaml", "hidden_size")),
        ("hidden-fraction", _line(LLAMA, "hidden_size", "hidden_size: 4096.5"),
         ("m.yaml", "hidden_size")),
        ("head-dim-negative", _line(LLAMA, "head_dim", "head_dim: -128"), ("m.yaml", "head_dim")),
        ("dtype-unknown", _line(LLAMA, "dtype", "dtype: float7"), ("m.yaml", "dtype")),
        ("vocab-huge", _line(LLAMA, "vocab_size", "vocab_size: 1e400"), ("m.yaml", "vocab_size")),
        ("params-string", _line(LLAMA, "params_billion", "params_billion: eight"),
         ("m.yaml", "params_billion")),
        ("max-positions-zero", _line(LLAMA, "max_position_embeddings", "max_position_embeddings: 0"),
         ("m.yaml", "max_position_embeddings")),
        ("missing-layers", _line(LLAMA, "num_hidden_layers", "# none"),
         ("m.yaml", "num_hidden_layers")),
        ("misspelt-key", _line(LLAMA, "head_dim", "head_dimm: 128"), ("m.yaml", "head_dimm")),
        ("empty", "", ("m.yaml",)),
    ]
    hf = json.loads(HF_LLAMA)

    def hf_with(**changes) -> str:
        return json.dumps({**hf, **changes}, indent=1)

    hf_cases: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("hf-duplicate-key", HF_LLAMA.replace('"num_hidden_layers": 32',
                                              '"num_hidden_layers": 32, "num_hidden_layers": 80'),
         ("config.json", "num_hidden_layers", "twice")),
        ("hf-deep", '{"a": ' + DEEP + "}", ("config.json", "nested")),
        ("hf-latin1", HF_LLAMA.replace('"llama"', '"caf\xe9"').encode("latin-1"),
         ("config.json", "UTF-8")),
        ("hf-bool-layers", hf_with(num_hidden_layers=True), ("config.json", "num_hidden_layers")),
        ("hf-kv-heads-7", hf_with(num_key_value_heads=7), ("config.json", "num_key_value_heads")),
        ("hf-string-hidden", hf_with(hidden_size="4096"), ("config.json", "hidden_size")),
        ("hf-null-layers", hf_with(num_hidden_layers=None), ("config.json", "num_hidden_layers")),
        ("hf-nan-literal", HF_LLAMA.replace('"hidden_size": 4096', '"hidden_size": NaN'),
         ("config.json", "hidden_size")),
        ("hf-torch-dtype-unknown", hf_with(torch_dtype="float7"), ("config.json", "float7")),
        ("hf-missing-layers", _text(TESTS / "hf_config" / "missing-layers.json"),
         ("config.json", "num_hidden_layers")),
        ("hf-a-list", "[]", ("config.json",)),
    ]
    cases = [Case(f"hardware/{cid}", HW_ARGV, names=names, files={"hw.yaml": text})
             for cid, text, names in hw]
    cases += [Case(f"model/{cid}", MODEL_ARGV, names=names, files={"m.yaml": text})
              for cid, text, names in model]
    cases += [Case(f"model/{cid}", ["capacity", "--hardware", "l40s", "--model", "config.json"],
                   names=names, files={"config.json": text}) for cid, text, names in hf_cases]
    # An experiment naming a broken profile file by path.
    cases.append(Case("hardware/by-path-in-experiment",
                      ["simulate", "exp.yaml", "--out", "o", "--no-metrics", "--concurrency", "4"],
                      names=("hw.yaml", "eta_f"),
                      files={"exp.yaml": _sub(CI_SMALL, "hardware: l40s", "hardware: hw.yaml"),
                             "hw.yaml": L40S + "eta_f: 0.1\n"}))
    cases.append(Case("model/by-path-in-experiment",
                      ["simulate", "exp.yaml", "--out", "o", "--no-metrics", "--concurrency", "4"],
                      names=("m.yaml", "num_key_value_heads"),
                      files={"exp.yaml": _sub(CI_SMALL, "model: llama-3.1-8b", "model: m.yaml"),
                             "m.yaml": _line(LLAMA, "num_key_value_heads",
                                             "num_key_value_heads: 7")}))
    cases.append(Case("hardware/valid-with-units", HW_ARGV, expect="accept",
                      files={"hw.yaml": _line(L40S, "memory_gib", "memory: 48GiB")}))
    return cases


def capacity_cases() -> list[Case]:
    base = ["capacity", "--hardware", "h100-80g", "--model", "llama-3.1-8b"]
    opts: list[tuple[str, list[str], tuple[str, ...]]] = [
        ("tp-zero", ["--tp", "0"], ("--tp",)),
        ("tp-negative", ["--tp", "-2"], ("--tp",)),
        ("tp-3", ["--tp", "3"], ("tensor",)),
        ("tp-huge", ["--tp", "1e400"], ("--tp",)),
        ("tp-text", ["--tp", "eight"], ("--tp",)),
        ("tp-beyond-cards", ["--tp", "16"], ("--tp",)),
        ("pp-zero", ["--pp", "0"], ("--pp",)),
        ("pp-beyond-layers", ["--pp", "64"], ("--pp",)),
        ("util-zero", ["--gpu-memory-utilization", "0"], ("--gpu-memory-utilization",)),
        ("util-above-one", ["--gpu-memory-utilization", "1.5"], ("--gpu-memory-utilization",)),
        ("util-negative", ["--gpu-memory-utilization", "-0.5"], ("--gpu-memory-utilization",)),
        ("util-nan", ["--gpu-memory-utilization", "nan"], ("--gpu-memory-utilization",)),
        ("util-inf", ["--gpu-memory-utilization", "inf"], ("--gpu-memory-utilization",)),
        ("util-percent", ["--gpu-memory-utilization", "90%"], ("--gpu-memory-utilization",)),
        ("max-model-len-zero", ["--max-model-len", "0"], ("--max-model-len",)),
        ("max-model-len-negative", ["--max-model-len", "-5"], ("--max-model-len",)),
        ("max-model-len-unit", ["--max-model-len", "16k"], ("--max-model-len",)),
        ("batched-tokens-zero", ["--max-num-batched-tokens", "0"], ("--max-num-batched-tokens",)),
        ("max-num-seqs-zero", ["--max-num-seqs", "0"], ("--max-num-seqs",)),
        ("max-num-seqs-negative", ["--max-num-seqs", "-1"], ("--max-num-seqs",)),
        ("block-size-7", ["--block-size", "7"], ("--block-size",)),
        ("block-size-zero", ["--block-size", "0"], ("--block-size",)),
        ("block-size-negative", ["--block-size", "-16"], ("--block-size",)),
        ("kv-dtype-unknown", ["--kv-cache-dtype", "fp7"], ("--kv-cache-dtype",)),
        ("blocks-override-zero", ["--num-gpu-blocks-override", "0"],
         ("--num-gpu-blocks-override",)),
        ("blocks-override-negative", ["--num-gpu-blocks-override", "-5"],
         ("--num-gpu-blocks-override",)),
        ("kv-bytes-1e400", ["--kv-cache-memory-bytes", "1e400"], ("--kv-cache-memory-bytes",)),
        ("kv-bytes-negative", ["--kv-cache-memory-bytes", "-1GiB"], ("--kv-cache-memory-bytes",)),
        ("kv-bytes-zero", ["--kv-cache-memory-bytes", "0"], ("--kv-cache-memory-bytes",)),
        ("kv-bytes-nan", ["--kv-cache-memory-bytes", "nan"], ("--kv-cache-memory-bytes",)),
        ("kv-bytes-bad-unit", ["--kv-cache-memory-bytes", "5XB"], ("--kv-cache-memory-bytes",)),
        ("weights-bare-float", ["--weights", "14.96"], ("--weights",)),
        ("weights-bare-small", ["--weights", "16"], ("--weights",)),
        ("weights-negative", ["--weights", "-5GiB"], ("--weights",)),
        ("weights-nan", ["--weights", "nanGiB"], ("--weights",)),
        ("weights-inf", ["--weights", "infGiB"], ("--weights",)),
        ("weights-above-card", ["--weights", "900GiB"], ("--weights",)),
        ("non-torch-huge", ["--non-torch", "1e30"], ("--non-torch",)),
        ("activation-negative", ["--activation-peak", "-1GiB"], ("--activation-peak",)),
        ("cudagraph-text", ["--cudagraph", "some"], ("--cudagraph",)),
        ("total-memory-1e30", ["--total-memory", "1e30"], ("--total-memory",)),
        ("total-memory-zero", ["--total-memory", "0GiB"], ("--total-memory",)),
        ("avg-seq-len-zero", ["--avg-seq-len", "0"], ("--avg-seq-len",)),
        ("avg-seq-len-negative", ["--avg-seq-len", "-100"], ("--avg-seq-len",)),
        ("avg-seq-len-huge", ["--avg-seq-len", "100000000000000000000"], ("--avg-seq-len",)),
        ("from-log-missing", ["--from-log", "nowhere.log"], ("nowhere.log",)),
        ("from-log-a-folder", ["--from-log", "."], ("--from-log",)),
    ]
    cases = [Case(f"capacity/{cid}", [*base, *argv], names=names) for cid, argv, names in opts]
    cases += [
        Case("capacity/unknown-hardware", ["capacity", "--hardware", "h100-90g", "--model",
                                           "llama-3.1-8b"], names=("h100-90g",)),
        Case("capacity/unknown-model", ["capacity", "--hardware", "h100-80g", "--model",
                                        "llama-3.1-9b"], names=("llama-3.1-9b",)),
        Case("capacity/from-log-latin1", [*base, "--from-log", "start.log"],
             names=("start.log", "UTF-8"), files={"start.log": "INFO caf\xe9\n".encode("latin-1")}),
        Case("capacity/from-log-binary", [*base, "--from-log", "start.log"],
             names=("start.log",), files={"start.log": bytes(range(256)) * 4}),
        Case("capacity/from-log-empty", [*base, "--from-log", "start.log"],
             names=("start.log",), files={"start.log": ""}),
        Case("capacity/from-log-cut", [*base, "--from-log", "start.log"], expect="accept",
             files={"start.log": STARTUP_LOG[: len(STARTUP_LOG) * 2 // 3]}),
        Case("capacity/weights-do-not-fit-exit-3", ["capacity", "--hardware", "l4", "--model",
                                                     "llama-3.1-70b"], expect="exit3"),
        Case("capacity/max-model-len-no-pool-holds-exit-3", [*base, "--max-model-len", "10000000"],
             expect="exit3"),
        # More than the card holds: the pool is shown with a warning (documented).
        Case("capacity/kv-bytes-above-card-warned", [*base, "--kv-cache-memory-bytes", "900GiB"],
             expect="accept", warns=True),
        Case("capacity/blocks-override-huge-warned", [*base, "--num-gpu-blocks-override",
                                                      "1000000000000000"], expect="accept",
             warns=True),
        Case("capacity/weights-lowercase-unit-is-gb", [*base, "--weights", "15gb"],
             expect="accept"),
        Case("capacity/max-model-len-auto", [*base, "--max-model-len", "-1"], expect="accept"),
        Case("capacity/weights-with-unit", [*base, "--weights", "14.96GiB", "--json"],
             expect="accept"),
        Case("capacity/valid-control", [*base, "--json"], expect="accept"),
    ]
    return cases


def cli_value_cases() -> list[Case]:
    """Options of simulate, sweep, knee, profiles, twin and tune given wrong values."""
    sim = ["simulate", "exp.yaml", "--out", "o", "--no-metrics"]
    files = {"exp.yaml": CI_SMALL, "open.yaml": _sub(_sub(
        CI_SMALL, "  concurrency: [4, 8, 16, 24, 32, 48]", "  request_rates: [1, 2]"),
        "focus:\n  concurrency: 32", "focus: {}")}
    sim_opts: list[tuple[str, list[str], tuple[str, ...]]] = [
        ("concurrency-zero", ["--concurrency", "0"], ("--concurrency",)),
        ("concurrency-negative", ["--concurrency", "-4"], ("--concurrency",)),
        ("concurrency-huge", ["--concurrency", "1e400"], ("--concurrency",)),
        ("concurrency-text", ["--concurrency", "many"], ("--concurrency",)),
        ("concurrency-beyond", ["--concurrency", "100000000000"], ("--concurrency",)),
        ("rate-nan", ["open.yaml", "--request-rate", "nan"], ("--request-rate",)),
        ("rate-negative", ["open.yaml", "--request-rate", "-1"], ("--request-rate",)),
        ("rate-zero", ["open.yaml", "--request-rate", "0"], ("--request-rate",)),
        ("rate-and-concurrency", ["--request-rate", "2", "--concurrency", "4"],
         ("request rate",)),
        ("set-text-for-number", ["--set", "max_num_seqs=abc", "--concurrency", "4"],
         ("max_num_seqs",)),
        ("set-unknown-key", ["--set", "max_num_seq=8", "--concurrency", "4"], ("max_num_seq",)),
        ("set-no-equals", ["--set", "max_num_seqs", "--concurrency", "4"], ("--set",)),
        ("set-block-size-7", ["--set", "block_size=7", "--concurrency", "4"], ("block_size",)),
        ("set-blocks-negative", ["--set", "num_gpu_blocks=-1", "--concurrency", "4"],
         ("num_gpu_blocks",)),
        ("set-util-nan", ["--set", "gpu_memory_utilization=nan", "--concurrency", "4"],
         ("gpu_memory_utilization",)),
        ("set-bool-for-number", ["--set", "max_num_seqs=true", "--concurrency", "4"],
         ("max_num_seqs",)),
        ("set-deep-yaml", ["--set", "max_num_seqs=" + "[" * 5000 + "]" * 5000, "--concurrency",
                           "4"], ("max_num_seqs",)),
        ("time-scale-zero", ["--time-scale", "0", "--concurrency", "4"], ("--time-scale",)),
        ("time-scale-nan", ["--time-scale", "nan", "--concurrency", "4"], ("--time-scale",)),
        ("time-scale-negative", ["--time-scale", "-1", "--concurrency", "4"], ("--time-scale",)),
        ("stages-no-seconds", ["--stages", "1:"], ("--stages",)),
        ("stages-text-rate", ["--stages", "x:10"], ("--stages",)),
        ("stages-negative-rate", ["--stages", "-1:10"], ("--stages",)),
        ("stages-zero-seconds", ["--stages", "1:0"], ("--stages",)),
        ("stages-nan", ["--stages", "nan:5"], ("--stages",)),
        ("trace-missing", ["--trace", "nowhere.csv"], ("nowhere.csv",)),
        ("trace-time-unit-unknown", ["--trace", "t.csv", "--trace-time-unit", "h"],
         ("--trace-time-unit",)),
    ]
    cases = []
    for cid, argv, names in sim_opts:
        first = ["simulate", argv.pop(0), *sim[2:]] if argv[0].endswith(".yaml") else sim
        cases.append(Case(f"simulate/{cid}", [*first, *argv], names=names, files=dict(files)))
    cases.append(Case("simulate/scenario-missing", ["simulate", "nowhere.json", "--out", "o"],
                      names=("nowhere.json",)))
    cases.append(Case("simulate/scenario-a-folder", ["simulate", ".", "--out", "o"],
                      names=("folder",)))
    cases.append(Case("simulate/builtin-name-misspelt", ["simulate", "ci_smal", "--out", "o"],
                      names=("ci_smal",)))
    sweep = ["sweep", "exp.yaml", "--out", "o"]
    for cid, argv, names in [
        ("concurrency-zero", ["--concurrency", "0"], ("--concurrency",)),
        ("concurrency-nan", ["--concurrency", "nan"], ("--concurrency",)),
        ("concurrency-inf", ["--concurrency", "inf"], ("--concurrency",)),
        ("concurrency-fraction", ["--concurrency", "2.5"], ("--concurrency",)),
        ("concurrency-negative", ["--concurrency", "-4"], ("--concurrency",)),
        ("concurrency-1e400", ["--concurrency", "1e400"], ("--concurrency",)),
        ("jobs-zero", ["--jobs", "0", "--concurrency", "4"], ("--jobs",)),
        ("jobs-negative", ["--jobs", "-1", "--concurrency", "4"], ("--jobs",)),
        ("jobs-huge", ["--jobs", "99999999999999999999", "--concurrency", "4"], ("--jobs",)),
        ("variants-unknown", ["--variants", "max_num_seqs=3", "--concurrency", "4"],
         ("max_num_seqs=3",)),
    ]:
        cases.append(Case(f"sweep/{cid}", [*sweep, *argv], names=names, files=dict(files)))
    runs = ("variant,concurrency,output_throughput\nbaseline,4,100\nbaseline,8,180\n"
            "baseline,16,240\nbaseline,32,230\n")
    for cid, text, argv, names in [
        ("ragged-row-named-not-placed", runs + "baseline,64\n", "accept", ("runs.csv",)),
        ("text-concurrency-named-not-placed", runs.replace("baseline,8,", "baseline,eight,"),
         "accept", ("runs.csv",)),
        ("empty", "", [], ("runs.csv",)),
        ("header-only", "variant,concurrency,output_throughput\n", [], ("runs.csv",)),
        ("negative-throughput", runs.replace(",240", ",-240"), [], ("runs.csv",
                                                                   "output_throughput")),
        ("nan-throughput-named-not-placed", runs.replace(",240", ",nan"), "accept",
         ("runs.csv",)),
        ("repeated-level-as-repeats", runs.replace("baseline,16,", "baseline,8,"), "accept",
         ("runs.csv",)),
        ("latin1", runs.replace("baseline", "caf\xe9").encode("latin-1"), [],
         ("runs.csv", "UTF-8")),
        ("binary", bytes(range(256)) * 4, [], ("runs.csv",)),
        ("y-a-latency", runs.replace("output_throughput", "output_throughput,ttft_p95_s")
         .replace(",100\n", ",100,1\n").replace(",180\n", ",180,2\n").replace(",240\n", ",240,3\n")
         .replace(",230\n", ",230,4\n"), ["--y", "ttft_p95_s"], ("--y",)),
        ("y-missing", runs, ["--y", "tokens"], ("--y",)),
        ("x-missing", runs, ["--x", "clients"], ("--x",)),
        ("group-missing", runs, ["--group", "variantt"], ("--group",)),
        ("plateau-negative", runs, ["--plateau-tol", "-1"], ("--plateau-tol",)),
        ("plateau-nan", runs, ["--plateau-tol", "nan"], ("--plateau-tol",)),
        ("plateau-above-one", runs, ["--plateau-tol", "5"], ("--plateau-tol",)),
        ("columns-bad-mapping", runs, ["--columns", "concurrency"], ("--columns",)),
        ("columns-unknown-target", runs, ["--columns", "concurency=concurrency"],
         ("concurency",)),
    ]:
        expect = "refuse"
        if argv == "accept":
            expect, argv = "accept", []
        cases.append(Case(f"knee/{cid}", ["knee", "runs.csv", *argv], names=names,
                          files={"runs.csv": text}, expect=expect))
    cases.append(Case("knee/missing-file", ["knee", "nowhere.csv"], names=("nowhere.csv",)))
    cases.append(Case("knee/valid-control", ["knee", "runs.csv"], expect="accept",
                      files={"runs.csv": runs}))
    cases.append(Case("profiles/kind-unknown", ["profiles", "--kind", "gpu"], names=("--kind",)))
    cases.append(Case("profiles/valid-control", ["profiles", "--json"], expect="accept"))
    # twin and tune on inputs that are not run folders, and on wrong options
    for cid, argv, names in [
        ("run-dir-missing", ["twin", "nowhere", "--out", "t"], ("nowhere",)),
        ("run-dir-a-file", ["twin", "exp.yaml", "--out", "t"], ("exp.yaml",)),
        ("run-dir-empty", ["twin", "empty", "--out", "t"], ("empty",)),
        ("limits-text", ["twin", "empty", "--out", "t", "--limits", "ttft_p95=soon"], ("--limits",)),
        ("limits-unknown", ["twin", "empty", "--out", "t", "--limits", "ttft_p96=2s"],
         ("--limits",)),
        ("limits-negative", ["twin", "empty", "--out", "t", "--limits", "ttft_p95=-2s"],
         ("--limits",)),
        ("limits-1e400", ["twin", "empty", "--out", "t", "--limits", "ttft_p95=1e400s"],
         ("--limits",)),
        ("limits-hours", ["twin", "empty", "--out", "t", "--limits", "ttft_p95=2h"],
         ("--limits",)),
        ("focus-nan", ["twin", "empty", "--out", "t", "--focus", "nan"], ("--focus",)),
        ("focus-negative", ["twin", "empty", "--out", "t", "--focus", "-4"], ("--focus",)),
        ("bootstrap-negative", ["twin", "empty", "--out", "t", "--bootstrap", "-1"],
         ("--bootstrap",)),
        ("return-steps-negative", ["twin", "empty", "--out", "t", "--return-steps", "-1"],
         ("--return-steps",)),
        ("set-unknown", ["twin", "empty", "--out", "t", "--set", "max_num_seq=4"],
         ("max_num_seq",)),
        ("hardware-without-model", ["twin", "empty", "--out", "t", "--hardware", "l40s"],
         ("--model",)),
        ("tp-zero", ["twin", "empty", "--out", "t", "--hardware", "l40s", "--model",
                     "llama-3.1-8b", "--tp", "0"], ("--tp",)),
        ("server-log-missing", ["twin", "empty", "--out", "t", "--server-log", "none.log"],
         ("none.log",)),
        ("out-a-file", ["twin", "empty", "--out", "exp.yaml"], ("--out",)),
    ]:
        pre: list[list[str]] = []
        if not cid.startswith("run-dir"):  # a real run folder: the option is what is wrong
            argv = [a if a != "empty" else "run" for a in argv] + ["--no-remedies"]
            pre = TWIN_PRE
        cases.append(Case(f"twin/{cid}", argv, names=names, files=dict(files), dirs=("empty",),
                          protect=("exp.yaml",), pre=pre))
    tune = ["tune", "exp.yaml", "--out", "t", "--limits", "ttft_p95=60s"]
    for cid, argv, names in [
        ("param-no-values", ["--param", "max_num_seqs="], ("max_num_seqs",)),
        ("param-unknown", ["--param", "max_num_seq=16,32"], ("max_num_seq",)),
        ("param-reversed-range", ["--param", "max_num_seqs=256..16"], ("max_num_seqs",)),
        ("param-zero-range", ["--param", "max_num_seqs=0..16"], ("max_num_seqs",)),
        ("param-text", ["--param", "max_num_seqs=a,b"], ("max_num_seqs",)),
        ("param-huge-grid", ["--param", "max_num_seqs=1..1000000000:1"], ("max_num_seqs",)),
        ("param-zero-step", ["--param", "max_num_seqs=16..256:0"], ("max_num_seqs",)),
        ("param-nan", ["--param", "watermark=nan"], ("watermark",)),
        ("param-no-equals", ["--param", "max_num_seqs"], ("--param",)),
        ("executor-unknown", ["--param", "max_num_seqs=16,32", "--executor", "threads"],
         ("--executor",)),
        ("executor-processes-zero", ["--param", "max_num_seqs=16,32", "--executor",
                                     "processes:0"], ("processes",)),
        ("executor-dask-nohost", ["--param", "max_num_seqs=16,32", "--executor",
                                  "dask://127.0.0.1:9"], ("dask",)),
        ("workers-zero", ["--param", "max_num_seqs=16,32", "--workers", "0"], ("--workers",)),
        ("batch-zero", ["--param", "max_num_seqs=16,32", "--batch", "0"], ("--batch",)),
        ("limits-bad", ["--param", "max_num_seqs=16,32", "--limits", "ttft=fast"], ("--limits",)),
        ("grid-missing", ["--grid", "nowhere.yaml"], ("nowhere.yaml",)),
        ("grid-and-param", ["--grid", "g.yaml", "--param", "max_num_seqs=16"], ("--grid",)),
        ("grid-duplicate", ["--grid", "dup.yaml"], ("dup.yaml", "max_num_seqs")),
        ("grid-deep", ["--grid", "deep.yaml"], ("deep.yaml", "nested")),
        ("grid-latin1", ["--grid", "latin.yaml"], ("latin.yaml", "UTF-8")),
        ("grid-bool", ["--grid", "bool.yaml"], ("bool.yaml", "max_num_seqs")),
        ("grid-empty", ["--grid", "empty.yaml"], ("empty.yaml",)),
        ("no-grid-no-param", [], ("--param",)),
    ]:
        cases.append(Case(f"tune/{cid}", [*tune, *argv], names=names, files={
            "exp.yaml": CI_SMALL,
            "g.yaml": "parameters:\n  max_num_seqs: [16, 32]\n",
            "dup.yaml": "parameters:\n  max_num_seqs: [16]\n  max_num_seqs: [32]\n",
            "deep.yaml": "parameters: " + DEEP + "\n",
            "latin.yaml": "parameters:\n  max_num_seqs: [16] # caf\xe9\n".encode("latin-1"),
            "bool.yaml": "parameters:\n  max_num_seqs: [true, 32]\n",
            "empty.yaml": "",
        }))
    cases.append(Case("tune/source-missing", ["tune", "nowhere.yaml", "--out", "t", "--param",
                                              "max_num_seqs=16,32"], names=("nowhere.yaml",)))
    return cases


def ingest_cases() -> list[Case]:
    vdump = _vllm_only(DUMP)
    log2 = _scrape_log([_vllm_only(DUMP_IDLE), vdump])
    sample = next(line for line in vdump.splitlines() if line.startswith("vllm:num_preemptions_total"))
    prom: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("prom-cut-line", vdump.replace(sample, sample[: len(sample) // 2]), ("d.prom", "line")),
        ("prom-garbage-line", vdump + "this is not a sample\n", ("d.prom", "line")),
        ("prom-text-value", vdump.replace(sample, sample.rsplit(" ", 1)[0] + " twenty"),
         ("d.prom", "line")),
        ("prom-duplicate-series", vdump + sample + "\n", ("d.prom", "num_preemptions")),
        ("prom-duplicate-series-other-value", vdump + sample.rsplit(" ", 1)[0] + " 99\n",
         ("d.prom", "num_preemptions")),
        ("prom-negative-counter", vdump.replace(sample, sample.rsplit(" ", 1)[0] + " -20"),
         ("d.prom", "num_preemptions")),
        ("prom-nan-counter", vdump.replace(sample, sample.rsplit(" ", 1)[0] + " NaN"),
         ("d.prom", "num_preemptions")),
        ("prom-unclosed-labels", vdump.replace('{engine="0"', '{engine="0', 1), ("d.prom", "line")),
        ("prom-comments-only", "# HELP vllm:x nothing\n# TYPE vllm:x counter\n", ("d.prom",)),
        ("prom-no-vllm-metrics", "".join(line + "\n" for line in DUMP.splitlines()
                                         if line.startswith("python_")), ("d.prom",)),
        ("prom-empty", "", ("d.prom",)),
        ("prom-latin1", vdump.replace('engine="0"', 'engine="caf\xe9"', 1).encode("latin-1"),
         ("d.prom", "UTF-8")),
        ("prom-binary", bytes(range(256)) * 8, ("d.prom",)),
        ("prom-html-error-page", "<html><body>502 Bad Gateway</body></html>\n", ("d.prom",)),
        ("prom-histogram-no-inf", "\n".join(line for line in vdump.splitlines()
                                            if 'le="+Inf"' not in line) + "\n",
         ("d.prom", "+Inf")),
    ]
    cases = [Case(f"ingest/{cid}", ["ingest", "d.prom", "--out", "o"], names=names,
                  files={"d.prom": text}) for cid, text, names in prom]
    first, second = _vllm_only(DUMP_IDLE), vdump
    reset = _set_counter(_set_counter(second, "vllm:num_preemptions_total", 3),
                         "vllm:generation_tokens_total", 10)
    lines = log2.splitlines()
    jsonl: list[tuple[str, str | bytes, str, tuple[str, ...]]] = [
        # (id, text, expect, names)
        ("log-cut-last-line", log2[:-40], "accept", ()),
        ("log-not-json-line", lines[0] + "\nnot json at all\n" + lines[1] + "\n", "refuse",
         ("s.jsonl", "line 2")),
        ("log-t-a-string", _scrape_log([first, second]).replace('"t": 1700000000.0',
                                                                '"t": "yesterday"'),
         "refuse", ("s.jsonl", "'t'")),
        ("log-t-nan", _scrape_log([first, second]).replace('"t": 1700000000.0', '"t": NaN'),
         "refuse", ("s.jsonl", "'t'")),
        ("log-t-bool", _scrape_log([first, second]).replace('"t": 1700000000.0', '"t": true'),
         "refuse", ("s.jsonl", "'t'")),
        ("log-no-text", json.dumps({"t": 1.0}) + "\n" + lines[1] + "\n", "refuse",
         ("s.jsonl", "text")),
        ("log-text-a-number", json.dumps({"t": 1.0, "text": 5}) + "\n", "refuse",
         ("s.jsonl", "text")),
        ("log-out-of-order", lines[1] + "\n" + lines[0].replace("1700000000.0", "1700000010.0")
         + "\n", "refuse", ("s.jsonl", "line")),
        ("log-same-t-twice", lines[0] + "\n" + lines[1].replace("1700000005.0", "1700000000.0")
         + "\n", "refuse", ("s.jsonl", "line")),
        ("log-all-gaps", "".join(json.dumps({"t": 1.0 + i, "gap": "HTTP 500"}) + "\n"
                                 for i in range(3)), "refuse", ("s.jsonl",)),
        ("log-empty", "", "refuse", ("s.jsonl",)),
        ("log-duplicate-key", lines[0].replace('"t": 1700000000.0', '"t": 1700000000.0, '
                                               '"t": 1700000001.0') + "\n", "refuse",
         ("s.jsonl", "'t'")),
        ("log-deep-line", '{"t": 1, "text": "x", "extra": ' + DEEP + "}\n", "refuse",
         ("s.jsonl", "nested")),
        ("log-latin1", (lines[0] + "\n").encode() + b'{"t": 2, "text": "caf\xe9"}\n', "refuse",
         ("s.jsonl", "UTF-8")),
        ("log-garbage-text", lines[0] + "\n" + json.dumps({"t": 1700000005.0,
                                                           "text": "garbage here"}) + "\n",
         "refuse", ("s.jsonl", "line 2")),
        ("log-missing-metrics", _scrape_log(["".join(line + "\n" for line in DUMP.splitlines()
                                                     if line.startswith("python_"))] * 2),
         "refuse", ("s.jsonl",)),
        ("log-a-list-line", "[1, 2]\n", "refuse", ("s.jsonl",)),
    ]
    for cid, text, expect, names in jsonl:
        cases.append(Case(f"ingest/{cid}", ["ingest", "s.jsonl", "--out", "o"], expect=expect,
                          names=names, files={"s.jsonl": text}))
    cases.append(Case("ingest/log-counter-reset", ["ingest", "s.jsonl", "--out", "o"],
                      expect="accept", files={"s.jsonl": _scrape_log([first, second, reset])},
                      verify=_runs_nonnegative))
    cases.append(Case("ingest/single-dump-counters-since-start", ["ingest", "d.prom", "--out", "o"],
                      expect="accept", files={"d.prom": DUMP},
                      verify=_runs_col("preemptions", 20)))
    bench = json.loads(BENCH)

    def b(**changes) -> str:
        return json.dumps({**bench, **changes}, indent=1)

    bad_bench: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("bench-malformed", BENCH[:-5], ("b.json",)),
        ("bench-duplicate-key", BENCH.replace('"completed": 200', '"completed": 200, '
                                              '"completed": 100'), ("b.json", "completed", "twice")),
        ("bench-deep", '{"a": ' + DEEP + "}", ("b.json", "nested")),
        ("bench-latin1", BENCH.replace('"openai"', '"caf\xe9"', 1).encode("latin-1"),
         ("b.json", "UTF-8")),
        ("bench-bool-concurrency", b(max_concurrency=True), ("b.json", "max_concurrency")),
        ("bench-negative-duration", b(duration=-50.0), ("b.json", "duration")),
        ("bench-zero-duration", b(duration=0), ("b.json", "duration")),
        ("bench-nan-throughput", BENCH.replace('"output_throughput": 1024.0',
                                               '"output_throughput": NaN'),
         ("b.json", "output_throughput")),
        ("bench-string-completed", b(completed="200"), ("b.json", "completed")),
        ("bench-negative-completed", b(completed=-1), ("b.json", "completed")),
        ("bench-tokens-negative", b(total_output_tokens=-5), ("b.json", "total_output_tokens")),
        ("bench-concurrency-zero", b(max_concurrency=0), ("b.json", "max_concurrency")),
        ("bench-date-garbage", b(date="yesterday"), ("b.json", "date")),
        ("bench-a-list", "[]", ("b.json",)),
        ("bench-other-tool", _text(TESTS / "bench" / "other_tool.json"), ("b.json",)),
        ("bench-missing-duration", _text(TESTS / "bench" / "missing_duration.json"),
         ("b.json", "duration")),
        ("bench-ttft-text", b(p99_ttft_ms="fast"), ("b.json", "p99_ttft_ms")),
    ]
    cases += [Case(f"ingest/{cid}", ["ingest", "b.json", "--out", "o"], names=names,
                   files={"b.json": text}) for cid, text, names in bad_bench]
    opt: list[tuple[str, list[str], tuple[str, ...]]] = [
        ("num-gpu-blocks-zero", ["--num-gpu-blocks", "0"], ("--num-gpu-blocks",)),
        ("num-gpu-blocks-negative", ["--num-gpu-blocks", "-1"], ("--num-gpu-blocks",)),
        ("block-size-7", ["--block-size", "7"], ("--block-size",)),
        ("block-size-zero", ["--block-size", "0"], ("--block-size",)),
        ("metrics-misspelt", ["--metrics", "vllm:num_preemtions"], ("--metrics",)),
        ("columns-no-equals", ["--columns", "concurrency"], ("--columns",)),
        ("bench-timezone-unknown", ["--bench-timezone", "Mars/Base"], ("--bench-timezone",)),
        ("log-timezone-unknown", ["--log-timezone", "+25:00"], ("--log-timezone",)),
        ("log-year-zero", ["--log-year", "0"], ("--log-year",)),
        ("log-year-negative", ["--log-year", "-2025"], ("--log-year",)),
        ("log-year-huge", ["--log-year", "99999"], ("--log-year",)),
        ("counter-origin-unknown", ["--counter-origin", "one"], ("--counter-origin",)),
        ("run-name-empty", ["--run", ""], ("--run",)),
    ]
    cases += [Case(f"ingest/opt-{cid}", ["ingest", "s.jsonl", "--out", "o", *argv], names=names,
                   files={"s.jsonl": log2}) for cid, argv, names in opt]
    for cid, argv, names in [
        ("start-garbage", ["--start", "yesterday-ish", "--end", "now"], ("--start",)),
        ("end-before-start", ["--start", "1000", "--end", "10"], ("--end",)),
        ("step-zero", ["--start", "0", "--end", "100", "--step", "0"], ("--step",)),
        ("step-negative", ["--start", "0", "--end", "100", "--step", "-5"], ("--step",)),
        ("step-nan", ["--start", "0", "--end", "100", "--step", "nan"], ("--step",)),
        ("timeout-zero", ["--start", "0", "--end", "100", "--timeout", "0"], ("--timeout",)),
        ("timeout-nan", ["--start", "0", "--end", "100", "--timeout", "nan"], ("--timeout",)),
        ("timeout-1e20", ["--start", "0", "--end", "100", "--timeout", "1e20"], ("--timeout",)),
        ("url-unreachable", ["--start", "0", "--end", "100", "--timeout", "0.5"],
         ("127.0.0.1:9",)),
    ]:
        url = "http://127.0.0.1:9" if cid == "url-unreachable" else "{url}/promok"
        cases.append(Case(f"ingest/api-{cid}", ["ingest", url, "--out", "o", *argv],
                          names=names))
    for mode in ("500", "garbage", "close", "hang", "html"):
        cases.append(Case(f"ingest/api-server-{mode}", ["ingest", f"{{url}}/{mode}", "--start",
                                                        "0", "--end", "100", "--timeout", "2",
                                                        "--out", "o"], names=("{url}",)))
        cases.append(Case(f"ingest/metrics-url-{mode}", ["ingest", f"{{url}}/{mode}/metrics",
                                                         "--timeout", "2", "--out", "o"],
                          names=("{url}",)))
    for cid, text, names in [
        ("server-log-latin1", SERVER_LOG.encode().replace(b"INFO", b"INF\xe9", 1),
         ("v.log", "UTF-8")),
        ("server-log-binary", bytes(range(256)) * 8, ("v.log",)),
        ("server-log-no-stats", "INFO 03-01 10:00:00 hello\n" * 5, ("v.log",)),
    ]:
        cases.append(Case(f"ingest/{cid}", ["ingest", "v.log", "--out", "o"], names=names,
                          files={"v.log": text}))
    cases += [
        Case("ingest/source-missing", ["ingest", "nowhere.jsonl", "--out", "o"],
             names=("nowhere.jsonl",)),
        Case("ingest/empty-folder", ["ingest", "empty", "--out", "o"], names=("empty",),
             dirs=("empty",)),
        Case("ingest/gzip-cut", ["ingest", "s.jsonl.gz", "--out", "o"], names=("s.jsonl.gz",),
             files={"s.jsonl.gz": gzip.compress(log2.encode())[:200]}),
        Case("ingest/csv-runs-ragged-named-not-placed", ["ingest", "runs.csv", "--out", "o"],
             expect="accept",
             files={"runs.csv": "concurrency,output_throughput\n4,100\n8\n16,240,7\n"}),
        Case("ingest/csv-runs-unmapped", ["ingest", "runs.csv", "--out", "o"],
             names=("runs.csv",), files={"runs.csv": "conc,tok_s\n4,100\n8,180\n"}),
        Case("ingest/valid-control", ["ingest", "s.jsonl", "--out", "o"], expect="accept",
             files={"s.jsonl": log2}),
    ]
    return cases


def live_cases() -> list[Case]:
    """scrape and collect against loopback servers that fail in every way we know of."""
    cases = []
    for mode in ("500", "404", "garbage", "close", "hang", "html", "empty", "trickle", "latin1"):
        cases.append(Case(f"scrape/server-{mode}", ["scrape", f"{{url}}/{mode}/metrics", "--out",
                                                    "log.jsonl", "--count", "1", "--timeout", "2"],
                          names=("{url}",)))
    for cid, argv, names in [
        ("interval-zero", ["--interval", "0"], ("--interval",)),
        ("interval-nan", ["--interval", "nan"], ("--interval",)),
        ("interval-negative", ["--interval", "-5"], ("--interval",)),
        ("count-zero", ["--count", "0"], ("--count",)),
        ("count-negative", ["--count", "-1"], ("--count",)),
        ("duration-nan", ["--duration", "nan"], ("--duration",)),
        ("duration-negative", ["--duration", "-1"], ("--duration",)),
        ("timeout-inf", ["--timeout", "inf", "--count", "1"], ("--timeout",)),
        ("timeout-1e20", ["--timeout", "1e20", "--count", "1"], ("--timeout",)),
        ("max-failures-zero", ["--max-failures", "0", "--count", "1"], ("--max-failures",)),
    ]:
        cases.append(Case(f"scrape/{cid}", ["scrape", "{url}/ok/metrics", "--out", "log.jsonl",
                                            *argv], names=names))
    cases += [
        Case("scrape/url-ftp", ["scrape", "ftp://127.0.0.1/metrics", "--out", "log.jsonl",
                                "--count", "1"], names=("ftp://",)),
        Case("scrape/url-no-scheme", ["scrape", "127.0.0.1:9/metrics", "--out", "log.jsonl",
                                      "--count", "1"], names=("127.0.0.1:9",)),
        Case("scrape/url-bad-port", ["scrape", "http://127.0.0.1:99999/metrics", "--out",
                                     "log.jsonl", "--count", "1"], names=("99999",)),
        Case("scrape/url-unclosed-ipv6", ["scrape", "http://[::1/metrics", "--out", "log.jsonl",
                                          "--count", "1"], names=("[::1",)),
        Case("scrape/out-a-folder", ["scrape", "{url}/ok/metrics", "--out", "o", "--count", "1"],
             names=("--out",), dirs=("o",)),
        # A user's own file as the log: appending scrapes (or a gap) to it changes their file.
        Case("scrape/out-a-user-file-server-down", ["scrape", "{url}/500/metrics", "--out",
                                                    "notes.txt", "--count", "1"],
             names=("notes.txt",), files={"notes.txt": "my notes\n"}, protect=("notes.txt",)),
        Case("scrape/out-a-user-file", ["scrape", "{url}/ok/metrics", "--out", "notes.txt",
                                        "--count", "1"], names=("notes.txt",),
             files={"notes.txt": "my notes\n"}, protect=("notes.txt",)),
        Case("scrape/out-a-user-csv", ["scrape", "{url}/ok/metrics", "--out", "runs.csv",
                                       "--count", "1"], names=("runs.csv",),
             files={"runs.csv": "concurrency,output_throughput\n4,100\n"}, protect=("runs.csv",)),
        Case("scrape/valid-control", ["scrape", "{url}/ok/metrics", "--out", "log.jsonl",
                                      "--count", "2", "--interval", "0.2"], expect="accept"),
        Case("scrape/append-to-own-log", ["scrape", "{url}/ok/metrics", "--out", "log.jsonl",
                                          "--count", "1"], expect="accept",
             files={"log.jsonl": _scrape_log([_vllm_only(DUMP_IDLE)])}),
    ]
    collect = ["--levels", "1", "--out", "c", "--no-report", "--warmup", "0",
               "--prompts-per-level", "1", "--input-len", "8", "--output-len", "2",
               "--cooldown", "0"]
    for mode in ("500", "404", "garbage", "close", "hang", "html", "nometrics", "badmetrics"):
        cases.append(Case(f"collect/server-{mode}", ["collect", f"{{url}}/{mode}", *collect],
                          names=("{url}",), timeout=60))
    # No cache_config_info: the pool is unknown ("?") and the run goes on; the fake server
    # then answers no completion, which ends the level early (exit 5, documented).
    cases.append(Case("collect/server-nocache-exit-5", ["collect", "{url}/nocache", *collect],
                      expect="exit5", timeout=60))
    cases.append(Case("collect/completions-500-exit-5", ["collect", "{url}/comp500", *collect],
                      expect="exit5", timeout=60))
    for cid, argv, names in [
        ("levels-empty", ["--levels", ""], ("--levels",)),
        ("levels-zero", ["--levels", "0"], ("--levels",)),
        ("levels-text", ["--levels", "a,b"], ("--levels",)),
        ("levels-repeated", ["--levels", "4,4"], ("--levels",)),
        ("levels-negative", ["--levels", "-1"], ("--levels",)),
        ("levels-1e400", ["--levels", "1e400"], ("--levels",)),
        ("input-len-zero", ["--input-len", "0"], ("--input-len",)),
        ("output-len-negative", ["--output-len", "-1"], ("--output-len",)),
        ("range-ratio-two", ["--range-ratio", "2"], ("--range-ratio",)),
        ("range-ratio-nan", ["--range-ratio", "nan"], ("--range-ratio",)),
        ("prompts-zero", ["--prompts-per-level", "0"], ("--prompts-per-level",)),
        ("duration-nan", ["--duration-per-level", "nan"], ("--duration-per-level",)),
        ("warmup-negative", ["--warmup", "-1"], ("--warmup",)),
        ("cooldown-negative", ["--cooldown", "-5"], ("--cooldown",)),
        ("token-ids-reversed", ["--token-ids", "1000:10"], ("--token-ids",)),
        ("token-ids-text", ["--token-ids", "low:high"], ("--token-ids",)),
        ("level-timeout-zero", ["--level-timeout", "0"], ("--level-timeout",)),
        ("request-timeout-nan", ["--request-timeout", "nan"], ("--request-timeout",)),
        ("max-ttft-negative", ["--max-ttft", "-1"], ("--max-ttft",)),
        ("scrape-interval-zero", ["--scrape-interval", "0"], ("--scrape-interval",)),
        ("engine-args-typo", ["--engine-args", "{max_num_seq: 4}"], ("max_num_seq",)),
        ("engine-args-malformed", ["--engine-args", "{max_num_seqs: [4"], ("--engine-args",)),
        ("engine-args-duplicate", ["--engine-args", "{max_num_seqs: 4, max_num_seqs: 8}"],
         ("--engine-args", "max_num_seqs")),
        ("engine-args-bool", ["--engine-args", "{max_num_seqs: true}"], ("max_num_seqs",)),
        ("engine-args-list", ["--engine-args", "[1, 2]"], ("--engine-args",)),
        ("param-no-equals", ["--param", "focus"], ("--param",)),
        ("jobs-zero", ["--jobs", "0"], ("--jobs",)),
        ("load-engine-unknown", ["--load-engine", "wrk"], ("--load-engine",)),
    ]:
        rest = [x for x in collect]
        if argv[0] in rest:  # replace the default of that option
            i = rest.index(argv[0])
            del rest[i:i + 2]
        if argv[0] == "--duration-per-level":
            i = rest.index("--prompts-per-level")
            del rest[i:i + 2]
        cases.append(Case(f"collect/{cid}", ["collect", "{url}/ok", *rest, *argv], names=names))
    cases.append(Case("collect/out-a-user-folder", ["collect", "{url}/ok", *[
        x if x != "c" else "mine" for x in collect]], names=("--out",),
        files={"mine/notes.txt": "mine\n"}, protect=("mine",)))
    cases.append(Case("collect/url-unreachable", ["collect", "http://127.0.0.1:9", *collect],
                      names=("127.0.0.1:9",)))
    return cases


def out_cases() -> list[Case]:
    """--out at a user's file, folder, home or the checkout, with and without --force."""
    sim = ["simulate", "s.json", "--no-metrics"]
    scen = {"s.json": json.dumps(TINY_SCENARIO)}
    runs = "variant,concurrency,output_throughput\nbaseline,4,100\n"
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "simulate": (sim, scen),
        "sweep": (["sweep", "exp.yaml", "--concurrency", "4", "--no-compare", "--jobs", "1"],
                  {"exp.yaml": CI_SMALL}),
        "ingest": (["ingest", "s.jsonl"], {"s.jsonl": _scrape_log([_vllm_only(DUMP_IDLE),
                                                                   _vllm_only(DUMP)])}),
        "tune": (["tune", "exp.yaml", "--param", "max_num_seqs=16,32", "--limits",
                  "ttft_p95=600s"], {"exp.yaml": _sub(CI_SMALL, "[4, 8, 16, 24, 32, 48]", "[4]")
                                     .replace("concurrency: 32", "concurrency: 4")}),
        "report": (["report", "--experiment", "exp.yaml"], {"exp.yaml": CI_SMALL}),
        "twin": (["twin", "run"], {}),
    }
    cases = []
    for cmd, (argv, files) in commands.items():
        user = {**files, "mine/notes.txt": "mine\n", "mine/data/runs.csv": runs,
                "notes.txt": "my notes\n"}
        for force in ((), ("--force",)):
            tag = "-force" if force else ""
            cases += [
                Case(f"out/{cmd}-user-file{tag}", [*argv, "--out", "notes.txt", *force],
                     names=("notes.txt",), files=user, protect=("notes.txt",)),
                Case(f"out/{cmd}-user-folder{tag}", [*argv, "--out", "mine", *force],
                     names=("mine",), files=user, protect=("mine",)),
                Case(f"out/{cmd}-home{tag}", [*argv, "--out", "{home}", *force],
                     names=("--out",), files=files, protect=("{home}",)),
                Case(f"out/{cmd}-checkout{tag}", [*argv, "--out", "{repo}", *force],
                     names=("--out",), files=files, protect=("{repo}/README.md",
                                                            "{repo}/notebooks")),
            ]
        cases.append(Case(f"out/{cmd}-parent-is-a-file", [*argv, "--out", "notes.txt/sub"],
                          names=("notes.txt",), files=user, protect=("notes.txt",)))
        cases.append(Case(f"out/{cmd}-symlink-to-user-folder-force",
                          [*argv, "--out", "link", "--force"], names=("--out",), files=user,
                          protect=("mine",), dirs=("link->mine",)))
    twin_pre = TWIN_PRE
    for c in cases:
        if c.id.startswith("out/twin"):
            c.pre = twin_pre
            c.argv += ["--bootstrap", "0", "--no-remedies"]
    cases += [
        Case("out/simulate-user-empty-folder-in-run-force", [*sim, "--out", "o", "--force"],
             names=("keepme",), files=scen, pre=[[*sim, "--out", "o"]], dirs=("o/keepme",),
             protect=("o/keepme",)),
        Case("out/simulate-user-file-in-run-force", [*sim, "--out", "o", "--force"],
             names=("mine.txt",), files=scen, pre=[[*sim, "--out", "o"]],
             dirs=("o/mine.txt=mine",), protect=("o/mine.txt",)),
        Case("out/ingest-user-file-in-run-force", ["ingest", "s.jsonl", "--out", "o", "--force"],
             names=("mine.txt",), files=commands["ingest"][1],
             pre=[["ingest", "s.jsonl", "--out", "o"]], dirs=("o/mine.txt=mine",),
             protect=("o/mine.txt",)),
        Case("out/sweep-user-folder-in-points-force", [*commands["sweep"][0], "--out", "o",
                                                       "--force"],
             names=("keep",), files=commands["sweep"][1], pre=[[*commands["sweep"][0], "--out",
                                                               "o"]],
             dirs=("o/points/keep",), protect=("o/points/keep",)),
        Case("out/simulate-cwd-with-user-files-force", [*sim, "--out", ".", "--force"],
             names=("--out",), files={**scen, "notes.txt": "mine\n"}, protect=("notes.txt",)),
        Case("out/simulate-checkout-data-force", [*sim, "--out", "{repo}/data", "--force"],
             names=("--out",), files=scen, protect=("{repo}/data/experiments",)),
        Case("out/simulate-root-force", [*sim, "--out", "/", "--force"], names=("--out",),
             files=scen),
        Case("out/simulate-rerun-force-own-folder", [*sim, "--out", "o", "--force"],
             expect="accept", files=scen, pre=[[*sim, "--out", "o"]]),
        Case("out/twin-user-folder-with-twin-md", ["twin", "run", "--out", "mine", "--bootstrap",
                                                   "0", "--no-remedies"], names=("mine",),
             files={"mine/twin.md": "my own notes on the twin\n"}, pre=twin_pre,
             protect=("mine",)),
    ]
    return cases


def html_cases() -> list[Case]:
    """Script payloads in every user text that reaches the page."""
    p = PAYLOADS
    hw = _line(L40S, "name", f"name: '{p[1]}'")
    model = _line(LLAMA, "name", f"name: '{p[2]}'")
    exp = _sub(CI_SMALL, "name: ci_small", f"name: '{p[0]}'")
    exp = _sub(exp, "description: >-", f"description: '{p[3]} {p[1]}'\nold_description: >-")
    exp = exp.replace("old_description: >-", "x_notes: >-")
    exp = _sub(exp, "hardware: l40s", "hardware: hw.yaml")
    exp = _sub(exp, "model: llama-3.1-8b", f"model: m.yaml\nserved_model_name: '{p[3]}'")
    exp = _sub(exp, "  seeds: 3", f"  seeds: 1\n  note: '{p[0]}'")
    exp = _sub(exp, "    values: [true]", f"    values: [true]\n    note: '{p[1]}'")
    # x_notes is not a key of the experiment: keep the file valid by dropping it
    exp = re.sub(r"(?m)^x_notes: >-\n(?:  .*\n)+", "", exp)
    bench = json.loads(BENCH)
    bench_files = {}
    for c in (4, 8, 16, 32):
        doc = {**bench, "max_concurrency": c, "max_concurrent_requests": c,
               "label": p[0], "model_id": p[1], "tokenizer_id": p[2],
               "output_throughput": {4: 400.0, 8: 700.0, 16: 900.0, 32: 850.0}[c],
               "date": f"20250301-10{c:02d}00"}
        bench_files[f"bench/{p[3]}c{c}.json"] = json.dumps(doc)
    folder = "out<svg onload=alert(5)>"
    return [
        Case("html/report-experiment-payloads", ["report", "--experiment", "exp.yaml", "--out",
                                                 folder],
             expect="accept", files={"exp.yaml": exp, "hw.yaml": hw, "m.yaml": model},
             html=f"{folder}/index.html", timeout=300),
        Case("html/report-bench-payloads", ["report", "--source", "bench", "--out", folder],
             expect="accept", files=bench_files, html=f"{folder}/index.html", timeout=300),
        Case("html/report-scrape-label-payloads", ["report", "--source", "s.jsonl", "--out",
                                                   folder, "--param", "focus_concurrency=8"],
             expect="accept", files={"s.jsonl": _scrape_log([
                 _vllm_only(t).replace('model_name="', f'model_name="{p[3]}').replace(
                     'engine="0"', f'engine="{p[0]}"') for t in (DUMP_IDLE, DUMP)])},
             html=f"{folder}/index.html", timeout=300),
    ]


def report_cases() -> list[Case]:
    """report refusing bad experiments and sources before any notebook runs."""
    out = ["--out", "r"]
    return [
        Case("report/experiment-duplicate-key", ["report", "--experiment", "exp.yaml", *out],
             names=("exp.yaml", "twice"), files={"exp.yaml": CI_SMALL + "name: again\n"}),
        Case("report/experiment-latin1", ["report", "--experiment", "exp.yaml", *out],
             names=("exp.yaml", "UTF-8"),
             files={"exp.yaml": CI_SMALL.encode().replace(b"ci_small", b"caf\xe9", 1)}),
        Case("report/experiment-bool", ["report", "--experiment", "exp.yaml", *out],
             names=("exp.yaml", "max_num_seqs"),
             files={"exp.yaml": _sub(CI_SMALL, "engine:\n", "engine:\n  max_num_seqs: true\n")}),
        Case("report/experiment-missing", ["report", "--experiment", "nowhere.yaml", *out],
             names=("nowhere.yaml",)),
        Case("report/experiment-unknown-hardware", ["report", "--experiment", "exp.yaml", *out],
             names=("l40z",), files={"exp.yaml": _sub(CI_SMALL, "hardware: l40s",
                                                       "hardware: l40z")}),
        Case("report/source-missing", ["report", "--source", "nowhere", *out],
             names=("nowhere",)),
        Case("report/source-empty-folder", ["report", "--source", "empty", *out],
             names=("empty",), dirs=("empty",)),
        Case("report/source-binary", ["report", "--source", "s.jsonl", *out], names=("s.jsonl",),
             files={"s.jsonl": bytes(range(256)) * 4}),
        Case("report/param-no-equals", ["report", "--experiment", "exp.yaml", *out, "--param",
                                        "focus"], names=("--param",), files={"exp.yaml": CI_SMALL}),
        Case("report/param-unknown", ["report", "--experiment", "exp.yaml", *out, "--param",
                                      "focus_concurency=8"], names=("focus_concurency",),
             files={"exp.yaml": CI_SMALL}),
        Case("report/param-focus-text", ["report", "--experiment", "exp.yaml", *out, "--param",
                                         "focus_concurrency=abc"], names=("focus_concurrency",),
             files={"exp.yaml": CI_SMALL}),
        Case("report/param-limits-bad", ["report", "--experiment", "exp.yaml", *out, "--param",
                                         "limits=ttft=fast"], names=("limits",),
             files={"exp.yaml": CI_SMALL}),
        Case("report/param-engine-args-dup", ["report", "--source", "s.jsonl", *out, "--param",
                                              "engine_args={max_num_seqs: 1, max_num_seqs: 2}"],
             names=("engine_args", "max_num_seqs"),
             files={"s.jsonl": _scrape_log([_vllm_only(DUMP_IDLE), _vllm_only(DUMP)])}),
        Case("report/jobs-zero", ["report", "--experiment", "exp.yaml", *out, "--jobs", "0"],
             names=("--jobs",), files={"exp.yaml": CI_SMALL}),
    ]


def catalogue() -> list[Case]:
    cases = (experiment_cases() + scenario_cases() + profile_cases() + capacity_cases()
             + cli_value_cases() + ingest_cases() + live_cases() + out_cases() + report_cases()
             + html_cases())
    ids = Counter(c.id for c in cases)
    assert not [i for i, n in ids.items() if n > 1], [i for i, n in ids.items() if n > 1]
    return cases


# --------------------------------------------------------------------------- loopback servers
class Misbehaving(BaseHTTPRequestHandler):
    """The first path segment says how to fail: /500/..., /garbage/..., /hang/... ."""

    protocol_version = "HTTP/1.1"
    metrics = _vllm_only(DUMP_IDLE)  # an idle engine: the cool-down does not wait

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        mode, _, rest = self.path.lstrip("/").partition("/")
        rest = "/" + rest
        if mode == "500":
            return self._send(500, b"Internal Server Error")
        if mode == "404":
            return self._send(404, b"Not Found")
        if mode == "garbage":
            return self._send(200, bytes(range(256)) * 16, "application/octet-stream")
        if mode == "html":
            return self._send(200, b"<html><body>Login required</body></html>", "text/html")
        if mode == "empty":
            return self._send(200, b"")
        if mode == "latin1":
            return self._send(200, 'vllm:x{m="caf\xe9"} 1\n'.encode("latin-1"))
        if mode == "close":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)
            return None
        if mode == "hang":
            time.sleep(30)
            return None
        if mode == "trickle":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(60):
                with contextlib.suppress(OSError):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                time.sleep(0.5)
            return None
        # a vLLM-looking server, broken in one part
        if rest.startswith("/v1/models"):
            body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model",
                                                           "max_model_len": 4096}]})
            return self._send(200, body.encode(), "application/json")
        if rest.startswith("/metrics"):
            if mode == "nometrics":
                return self._send(404, b"Not Found")
            if mode == "badmetrics":
                return self._send(200, b"this is not prometheus\n")
            text = self.metrics
            if mode == "nocache":
                text = "".join(line + "\n" for line in text.splitlines()
                               if "cache_config_info" not in line)
            return self._send(200, text.encode())
        if rest.startswith("/api/v1/"):  # a Prometheus answering an empty matrix
            body = json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                             "result": []}})
            return self._send(200, body.encode(), "application/json")
        return self._send(404, b"Not Found")

    def do_POST(self) -> None:  # noqa: N802
        mode = self.path.lstrip("/").partition("/")[0]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if mode == "comp500":
            return self._send(500, b"Internal Server Error")
        return self.do_GET()


def start_server() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# --------------------------------------------------------------------------- running
def _snapshot(path: Path) -> dict[str, str]:
    if path.is_symlink():
        return {"": "link:" + os.readlink(path)}
    if path.is_file():
        return {"": hashlib.sha256(path.read_bytes()).hexdigest()}
    if path.is_dir():
        out = {"": "dir"}
        for p in sorted(path.rglob("*")):
            rel = str(p.relative_to(path))
            if ".venv" in p.parts or "__pycache__" in p.parts:
                continue
            out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() \
                if p.is_file() else "other"
        return out
    return {}


def _lost(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [k or "." for k, v in before.items() if after.get(k) != v]


class Runner:
    def __init__(self, root: Path, work: Path, url: str, timeout_scale: float = 1.0):
        self.root = root
        self.exe = root / ".venv" / "bin" / "kvpressure"
        self.work = work
        self.url = url
        self.scale = timeout_scale
        self.help: dict[str, str | None] = {}
        self.lock = threading.Lock()

    def _help(self, command: str) -> str | None:
        with self.lock:
            if command not in self.help:
                proc = subprocess.run([str(self.exe), command, "--help"], capture_output=True,
                                      text=True, timeout=60, cwd=self.work)
                self.help[command] = proc.stdout if proc.returncode == 0 else None
            return self.help[command]

    def _unsupported(self, argv: list[str]) -> str | None:
        text = self._help(argv[0])
        if text is None:
            return f"no command {argv[0]!r}"
        for arg in argv[1:]:
            if arg.startswith("--") and re.search(rf"(?<![\w-]){re.escape(arg.split('=')[0])}"
                                                  r"(?![\w-])", text) is None:
                return f"no option {arg}"
        return None

    def _fill(self, s: str, home: Path) -> str:
        return s.replace("{repo}", str(self.root)).replace("{home}", str(home)).replace(
            "{url}", self.url)

    def _env(self, home: Path, state: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPRESSURE_")}
        env.update(HOME=str(home), XDG_STATE_HOME=str(state), PYTHONWARNINGS="ignore",
                   MPLBACKEND="Agg", NO_COLOR="1")
        env.pop("VIRTUAL_ENV", None)
        return env

    def _exec(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
              ) -> tuple[int | None, str, str, float]:
        t = time.monotonic()
        proc = subprocess.Popen([str(self.exe), *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the case's own process group
            out, err = proc.communicate()
            code = None
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), \
            time.monotonic() - t

    def run(self, index: int, case: Case) -> dict:
        base = self.work / f"{index:04d}"
        cwd, home, state = base / "cwd", base / "home", base / "state"
        for d in (cwd, home / "projects", state):
            d.mkdir(parents=True, exist_ok=True)
        (home / "notes.txt").write_text("the user's own notes\n")
        (home / "projects" / "plan.md").write_text("# plan\n")
        argv = [self._fill(a, home) for a in case.argv]
        result = {"id": case.id, "command": case.command, "argv": argv, "expect": case.expect}
        why = self._unsupported(argv)
        if why:
            return {**result, "outcome": "unsupported", "detail": why}
        for name, content in case.files.items():
            path = cwd / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        env = self._env(home, state)
        for pre in case.pre:
            pre = [self._fill(a, home) for a in pre]
            why = self._unsupported(pre)
            if why:
                return {**result, "outcome": "unsupported", "detail": why}
            code, _, err, _ = self._exec(pre, cwd, env, 180 * self.scale)
            if code != 0:
                return {**result, "outcome": "setup failed",
                        "detail": f"{' '.join(pre)} -> {code}: {err.strip()[-300:]}"}
        for d in case.dirs:
            if "->" in d:
                link, target = d.split("->")
                (cwd / link).symlink_to(target)
            elif "=" in d:
                name, text = d.split("=")
                (cwd / name).write_text(text + "\n")
            else:
                (cwd / d).mkdir(parents=True, exist_ok=True)
        protect = [cwd / self._fill(p, home) for p in case.protect]
        snaps = {str(p): _snapshot(p) for p in protect}
        code, out, err, wall = self._exec(argv, cwd, env, case.timeout * self.scale)
        result.update(code=code, wall_s=round(wall, 2), stderr=err.strip()[-1500:],
                      stdout=out.strip()[-300:])
        lost = {p: _lost(s, _snapshot(Path(p))) for p, s in snaps.items()}
        lost = {p: v for p, v in lost.items() if v}
        result["outcome"], result["detail"] = self._classify(case, code, out, err, cwd, lost,
                                                             home)
        shutil.rmtree(base, ignore_errors=True)
        return result

    def _classify(self, case: Case, code: int | None, out: str, err: str, cwd: Path,
                  lost: dict[str, list[str]], home: Path) -> tuple[str, str]:
        if lost:
            return "data lost", "; ".join(f"{p}: {', '.join(v[:3])}" for p, v in lost.items())
        if code is None:
            return "hang", f"killed after {case.timeout * self.scale:g} s"
        if "Traceback (most recent call last)" in err + out:
            last = [x for x in err.strip().splitlines() if x.strip()][-1:]
            return "traceback", last[0][:200] if last else ""
        if code == 1:
            return "exit 1", err.strip().splitlines()[-1][:300] if err.strip() else ""
        message = "\n".join(x for x in err.splitlines() if "error" in x.lower()) or err
        if case.expect == "accept":
            if code != 0:
                return ("valid input refused" if code == 2 else "wrong exit code",
                        f"exit {code}: {message.strip()[-300:]}")
            if case.html:
                page = cwd / case.html
                if not page.exists():
                    return "silently wrong", f"no {case.html}"
                text = page.read_text(encoding="utf-8", errors="replace")
                raw = [m for m in RAW_MARKUP if m in text]
                if raw:
                    return "unescaped HTML", f"{case.html} holds {raw}"
            if case.warns and "warning" not in err.lower():
                return "silently accepted", "accepted without the warning it needs"
            if case.verify:
                problem = case.verify(cwd)
                if problem:
                    return "silently wrong", problem
            return "accepted", ""
        if case.expect.startswith("exit"):
            want = int(case.expect.removeprefix("exit"))
            if code == want:
                return "documented exit", ""
            return ("silently accepted" if code == 0 else "wrong exit code",
                    f"exit {code} where {want} is documented: {message.strip()[-200:]}")
        if code == 0:
            return "silently accepted", " ".join((out.strip() or err.strip()).split())[-200:]
        if code != 2:
            return "wrong exit code", f"exit {code}: {message.strip()[-200:]}"
        names = [self._fill(n, home) for n in case.names]
        missing = [n for n in names if n.lower() not in message.lower()]
        if missing:
            return "unnamed refusal", f"lacks {missing}: {message.strip()[-250:]}"
        return "clean refusal", ""


def table(results: list[dict]) -> tuple[str, dict]:
    outcomes = sorted({r["outcome"] for r in results},
                      key=lambda o: (o not in CLEAN, CLEAN.index(o) if o in CLEAN else o))
    per: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        per[r["command"]][r["outcome"]] += 1
    total = Counter(r["outcome"] for r in results)
    lines = ["| command | cases | " + " | ".join(outcomes) + " |",
             "|---|---:|" + "---:|" * len(outcomes)]
    for cmd in sorted(per):
        lines.append(f"| {cmd} | {sum(per[cmd].values())} | "
                     + " | ".join(str(per[cmd][o] or "") for o in outcomes) + " |")
    lines.append(f"| **all** | {len(results)} | "
                 + " | ".join(str(total[o]) for o in outcomes) + " |")
    summary = {"cases": len(results), "outcomes": dict(total),
               "per_command": {c: dict(v) for c, v in per.items()}}
    return "\n".join(lines), summary


def compare(before_path: Path, after_path: Path) -> str:
    """Markdown: the counts per outcome and per command of two runs of the catalogue."""
    runs = [json.loads(Path(p).read_text()) for p in (before_path, after_path)]
    order = [*CLEAN, "unsupported"]
    outcomes = sorted({o for r in runs for o in r["outcomes"]},
                      key=lambda o: (o not in order, order.index(o) if o in order else 0, o))
    lines = [f"| outcome | before ({runs[0]['commit']}) | after ({runs[1]['commit']}) |",
             "|---|---:|---:|"]
    lines += [f"| {o} | {runs[0]['outcomes'].get(o, 0)} | {runs[1]['outcomes'].get(o, 0)} |"
              for o in outcomes]
    lines.append(f"| **cases** | {runs[0]['cases']} | {runs[1]['cases']} |")
    lines += ["", "| command | cases | clean before | clean after | not clean before | "
              "not clean after | unsupported before |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cmd in sorted(runs[1]["per_command"]):
        b, a = (r["per_command"].get(cmd, {}) for r in runs)
        clean = [sum(x.get(o, 0) for o in CLEAN) for x in (b, a)]
        bad = [sum(v for o, v in x.items() if o not in order) for x in (b, a)]
        lines.append(f"| {cmd} | {sum(a.values())} | {clean[0]} | {clean[1]} | {bad[0]} | "
                     f"{bad[1]} | {b.get('unsupported', 0)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE.json", "AFTER.json"),
                    help="print the two runs' counts side by side (markdown) and exit")
    ap.add_argument("--root", type=Path, default=HERE, help="the checkout whose CLI is probed")
    ap.add_argument("--label", default="after", help="name of the output (probe_hostile_LABEL)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run side by side (default 2)")
    ap.add_argument("--only", default="", help="run only cases whose id contains this")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    args = ap.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return 0
    root = args.root.resolve()
    if not (root / ".venv" / "bin" / "kvpressure").exists():
        print(f"{root}/.venv/bin/kvpressure: missing (make .venv/.synced there)", file=sys.stderr)
        return 2
    cases = [c for c in catalogue() if args.only in c.id]
    server, url = start_server()
    work = Path(tempfile.mkdtemp(prefix="kvpressure-probe-"))
    runner = Runner(root, work, url, args.timeout_scale)
    t0 = time.monotonic()
    results: list[dict] = [{}] * len(cases)
    done = 0

    def one(i: int) -> None:
        nonlocal done
        results[i] = runner.run(i, cases[i])
        done += 1
        r = results[i]
        if r["outcome"] not in CLEAN:
            print(f"[{done}/{len(cases)}] {r['id']}: {r['outcome']} {r.get('detail', '')[:160]}",
                  file=sys.stderr, flush=True)

    # Report cases are the slowest: start them first so the rest fill in around them.
    order = sorted(range(len(cases)), key=lambda i: -cases[i].timeout)
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(one, order))
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t0
    text, summary = table(results)
    print(f"\n{len(cases)} cases on {root} in {wall:.0f} s\n")
    print(text)
    bad = [r for r in results if r["outcome"] not in CLEAN + ("unsupported",)]
    print(f"\nnot clean: {len(bad)}")
    for r in sorted(bad, key=lambda r: (r["outcome"], r["id"])):
        print(f"- {r['outcome']}: {r['id']}: {r.get('detail', '')[:200]}")
    out_dir = HERE / "benchmarks" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    path = out_dir / f"probe_hostile_{args.label}.json"
    path.write_text(json.dumps({"root": str(root), "commit": commit, "wall_s": round(wall, 1),
                                **summary, "table": text, "results": results}, indent=1) + "\n")
    (out_dir / f"probe_hostile_{args.label}.md").write_text(
        f"{len(cases)} cases, {root} at {commit}, {wall:.0f} s\n\n{text}\n")
    print(f"\n{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
