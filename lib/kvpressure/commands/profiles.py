"""``kvpressure profiles``: the built-in hardware, model and experiment profiles."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from kvpressure.paths import data_dir
from kvpressure.profiles import list_hardware, list_models, load_hardware, load_model

KINDS = ("hardware", "model", "experiment")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=KINDS, default=None,
                        help="list only this kind (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _hardware() -> list[dict]:
    out = []
    for name in list_hardware():
        hw = load_hardware(name)
        out.append({"name": name, "description": hw.description,
                    "memory_gib": hw.memory_gib, "num_cards": hw.num_cards})
    return out


def _models() -> list[dict]:
    out = []
    for name in list_models():
        m = load_model(name)
        out.append({"name": name, "description": m.description,
                    "params_billion": m.num_params / 1e9,
                    "kv_bytes_per_token": m.kv_bytes_per_token(1)})
    return out


def _experiments() -> list[dict]:
    out = []
    for path in sorted((data_dir() / "experiments").glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            description = data.get("description", "") if isinstance(data, dict) else ""
        except (OSError, yaml.YAMLError) as exc:
            description = f"(unreadable: {exc.__class__.__name__})"
        out.append({"name": path.stem, "description": str(description).strip()})
    return out


def run(args: argparse.Namespace) -> int:
    listers = {"hardware": _hardware, "model": _models, "experiment": _experiments}
    kinds = [args.kind] if args.kind else list(KINDS)
    result = {kind: listers[kind]() for kind in kinds}
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for kind in kinds:
        print(f"{kind}:")
        entries = result[kind]
        if not entries:
            print("  (none)")
        width = max((len(e["name"]) for e in entries), default=0)
        for e in entries:
            print(f"  {e['name']:<{width}}  {e['description']}")
    return 0
