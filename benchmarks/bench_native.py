"""The compiled exact step (``make native``) against the sources, on every kind of workload.

Runs ``bench_kinds.py --no-vllm`` in child processes, alternately on the sources
(``KVPRESSURE_NATIVE=0``) and on the compiled set, ``--rounds`` times each (the machine's drift
falls on both alike), and gives per kind (its slowest seed against vLLM) the kit's steps/s on
each, the speed-up, and both ratios to vLLM's loop; then the slowest and median ratios.

    .venv/bin/python benchmarks/bench_native.py [--rounds 3] [--seeds 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))

from kvpressure.simulation import native  # noqa: E402

MODES = {"sources": "0", "compiled": "1"}


def _round(mode: str, args: argparse.Namespace, out: Path) -> list[dict]:
    env = {**os.environ, "KVPRESSURE_NATIVE": MODES[mode]}
    cmd = [sys.executable, str(HERE / "bench_kinds.py"), "--no-vllm", "--seeds", str(args.seeds),
           "--repeat", str(args.repeat), "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    want = "compiled" if mode == "compiled" else "sources"
    if f"simulation: {want}" not in proc.stdout:
        raise SystemExit(f"bench_native: the {mode} round did not run the {want}: is the "
                         "compiled set built from these sources (make native)?")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    stamp = native.native_dir() / native.STAMP
    if not stamp.is_file() or json.loads(stamp.read_text()) != native.expected_stamp():
        print("bench_native: skipped, no compiled set built from these sources (make native)")
        return
    kit: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                for row in _round(mode, args, Path(tmp) / f"{mode}{r}.json"):
                    kit[mode].setdefault(row["name"], []).append(row["kit_steps_per_s"])
                    rows[row["name"]] = row
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"CPU time, median of {args.rounds} rounds; per kind the seed with the lowest "
          "compiled ratio to vLLM's loop")
    print(f"{'kind':26s} {'steps':>7s} {'vLLM st/s':>10s} {'sources':>9s} {'compiled':>9s}"
          f" {'speed-up':>8s} {'ratio':>6s} {'ratio':>7s}")
    out = []
    for name, row in rows.items():
        src = statistics.median(kit["sources"][name])
        comp = statistics.median(kit["compiled"][name])
        vr = row["vllm_steps_per_s"]
        out.append({"kind": row["kind"], "name": name, "steps": row["steps"],
                    "vllm_steps_per_s": vr, "sources_steps_per_s": src,
                    "compiled_steps_per_s": comp, "speedup": comp / src,
                    "sources_ratio": src / vr, "compiled_ratio": comp / vr})
    for kind in dict.fromkeys(r["kind"] for r in out):
        w = min((r for r in out if r["kind"] == kind), key=lambda r: r["compiled_ratio"])
        print(f"{kind:26s} {w['steps']:7d} {w['vllm_steps_per_s']:10.0f} "
              f"{w['sources_steps_per_s']:9.0f} {w['compiled_steps_per_s']:9.0f} "
              f"{w['speedup']:8.2f} {w['sources_ratio']:6.1f} {w['compiled_ratio']:7.1f}")
    for key in ("sources_ratio", "compiled_ratio"):
        slow = min(out, key=lambda r: r[key])
        print(f"{key}: slowest x{slow[key]:.1f} ({slow['name']}), median over {len(out)} "
              f"workloads x{statistics.median(r[key] for r in out):.1f}")
    sp = [r["speedup"] for r in out]
    print(f"speed-up: min {min(sp):.2f}, median {statistics.median(sp):.2f}, max {max(sp):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.0f} s)")
