"""How far a hardware profile's simulated latencies held against real vLLM servers.

``benchmarks/bench_sim_to_real.py`` simulates public measurements of real vLLM servers on GPUs
(their configurations and loads) and writes, per card, the mean absolute percentage error of
each latency over the stages no value was fitted on (``--fidelity`` writes
``data/fidelity/sim_to_real.json`` with :func:`summarise`). A simulated report states it next
to its latencies: the card's own figures where real servers on it were checked, else that none
were and what the checked cards gave, so a latency read off a profile no real server confirmed
is not taken for a measurement.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from kvpressure.paths import data_dir

# The latencies a report prints and the benchmark scores, in the benchmark's names.
METRICS = ("ttft_mean", "ttft_p99", "itl_mean", "e2e_mean", "e2e_p99")
# The tails whose errors have a side: the simulation has no step-to-step variation of the
# real servers' steps and no warm-up, so its p99s come out too tight, and a mean
# absolute error alone would read as a band on both sides of them.
TAILS = ("ttft_p99", "e2e_p99")
FIDELITY_FILE = ("fidelity", "sim_to_real.json")


def summarise(rows: Iterable[Mapping[str, Any]], setting: str = "after") -> dict[str, Any]:
    """Per card (the rows' ``hardware``): the held-out stages that were scored (not
    overloaded), their runs, the calibration stages, and each metric's mean absolute
    percentage error of ``setting`` against ``measured`` over the held-out stages that
    measured it, and per tail (``TAILS``) how many of those stages it came out below the
    real one (``below_real``)."""
    cards: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("overload"):
            continue
        card = cards.setdefault(str(r["hardware"]), {"held_out": [], "calibration_stages": 0})
        if r["split"] == "held-out":
            card["held_out"].append(r)
        else:
            card["calibration_stages"] += 1
    out: dict[str, Any] = {}
    for name, card in sorted(cards.items()):
        held = card["held_out"]
        mape, below = {}, {}
        for m in METRICS:
            have = [r for r in held if r["measured"].get(m) is not None]
            if have:
                mape[m] = round(float(np.mean([
                    abs(r[setting][m] - r["measured"][m]) / abs(r["measured"][m]) * 100
                    for r in have])), 1)
                if m in TAILS:
                    below[m] = sum(r[setting][m] < r["measured"][m] for r in have)
        out[name] = {"held_out_stages": len(held),
                     "held_out_runs": len({r["run"] for r in held}),
                     "calibration_stages": card["calibration_stages"], "mape_pct": mape,
                     "below_real": below}
    return out


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    path = data_dir().joinpath(*FIDELITY_FILE)
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def latency_fidelity(hardware: str) -> dict[str, Any]:
    """What the benchmark says of ``hardware``'s simulated latencies: ``checked`` (real servers
    on this card were simulated), its figures, and the checked cards' (the
    :class:`kvpressure.record.schema.LatencyFidelity` fields but the sentence). The tails'
    side (``tail_stages``, ``tail_below_real``) is the card's own where it was checked, else
    that of every checked card's stages together."""
    table = _table()
    cards = table.get("cards", {})
    mine = cards.get(hardware)
    checked = bool(mine and mine["held_out_stages"])
    counted = [mine] if checked else [c for c in cards.values() if c["held_out_stages"]]
    below = {m: sum(c.get("below_real", {}).get(m, 0) for c in counted) for m in TAILS
             if all(m in c.get("below_real", {}) for c in counted) and counted}
    return {"hardware": hardware, "checked": checked,
            "held_out_stages": mine["held_out_stages"] if checked else 0,
            "held_out_runs": mine["held_out_runs"] if checked else 0,
            "calibrated": bool(mine and mine["calibration_stages"]),
            "mape_pct": dict(mine["mape_pct"]) if checked else {},
            "checked_cards": {name: dict(card["mape_pct"]) for name, card in cards.items()
                              if card["held_out_stages"]},
            "tail_stages": sum(c["held_out_stages"] for c in counted) if below else 0,
            "tail_below_real": below,
            "source": table.get("source", "")}
