"""The configuration to recommend, its runner-up, and why, in words a user can check against
the tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from kvpressure.analysis.limits import broken, format_limits
from kvpressure.tune.ranking import best_within_limits


def _ms(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _at(level: Mapping[str, Any] | None, limits: Mapping[str, float], level_name: str) -> str:
    if level is None:
        return f"no {level_name}"
    lat = ", ".join(f"{k.removesuffix('_s')} {_ms(float(level[k]))}"
                    for k in (limits or {"ttft_p95_s": 0, "itl_p95_s": 0}))
    return f"{level_name} {level['level']:g} ({lat})"


def recommend(table: pd.DataFrame, records: Mapping[str, Mapping[str, Any]],
              limits: Mapping[str, float], level_name: str, baseline_id: str = "baseline"
              ) -> dict[str, Any]:
    """``{"recommended", "runner_up", "baseline", "equivalent", "text", ...}``."""
    base = records.get(baseline_id)
    base_good, base_at = ((0.0, None) if base is None or base["status"] != "ok"
                          else best_within_limits(base["levels"], limits))
    out: dict[str, Any] = {"limits": dict(limits), "baseline_within_limits_output_tok_s": base_good,
                           "recommended": None, "runner_up": None, "equivalent": []}
    ok = table[table["within_limits_output_tok_s"] > 0] if not table.empty else table
    if ok.empty:
        out["text"] = (f"no configuration meets {format_limits(limits)} at any level tried; "
                       "loosen the limits or add lower levels")
        return out
    best = ok.iloc[0]
    rec = records[best["id"]]
    good, at = best_within_limits(rec["levels"], limits)
    assert at is not None  # a configuration in ``ok`` meets the limits at some level
    same = ok[(ok["within_limits_output_tok_s"] == best["within_limits_output_tok_s"])
              & (ok["peak_output_tok_s"] == best["peak_output_tok_s"])]
    out["equivalent"] = [i for i in same["id"] if i != best["id"]]
    rest = ok[~ok["id"].isin(same["id"])]
    runner = rest.iloc[0] if not rest.empty else None
    out["recommended"] = {"id": best["id"], "config": rec["config"],
                          "within_limits_output_tok_s": good, "level": at["level"]}
    parts = [f"{best['id']}: {good:.0f} output tok/s within the limits at {_at(at, limits, level_name)}"]
    if best["id"] == baseline_id:
        parts[0] = (f"keep the baseline settings: {good:.0f} output tok/s within the limits at "
                    f"{_at(at, limits, level_name)}; no configuration tried does better")
    elif base is not None and base["status"] == "ok":
        if base_good > 0:
            parts.append(f"{100 * (good / base_good - 1):+.1f}% over the baseline's "
                         f"{base_good:.0f} tok/s at {_at(base_at, limits, level_name)}")
        else:
            parts.append("the baseline meets the limits at no level")
    higher = [r for r in rec["levels"] if r["level"] > at["level"]]
    if higher:
        nxt = higher[0]
        why = broken(nxt, limits)
        parts.append(f"at {level_name} {nxt['level']:g} it "
                     + (f"breaks {'; '.join(why)}" if why else
                        f"meets the limits but gives less ({nxt['output_throughput']:.0f} tok/s)"))
    else:
        parts.append("it meets the limits up to the highest level tried")
    if out["equivalent"]:
        parts.append(f"{len(out['equivalent'])} other configuration(s) give the same results "
                     "(the settings in which they differ do not bind here); the one with the "
                     "fewest changes from the baseline is named")
    if runner is not None:
        r_rec = records[runner["id"]]
        r_good, r_at = best_within_limits(r_rec["levels"], limits)
        assert r_at is not None  # the runner-up is in ``ok`` too
        differ = sorted(k for k in set(rec["config"]) | set(r_rec["config"])
                        if rec["config"].get(k) != r_rec["config"].get(k))
        out["runner_up"] = {"id": runner["id"], "config": r_rec["config"],
                            "within_limits_output_tok_s": r_good, "level": r_at["level"]}
        if r_good == good:
            tie = (f"the same throughput within the limits (a tie; it changes "
                   f"{runner['changes_from_baseline']} setting(s) from the baseline against "
                   f"{best['changes_from_baseline']}, and peaks at "
                   f"{runner['peak_output_tok_s']:.0f} against "
                   f"{best['peak_output_tok_s']:.0f} tok/s past the limits)")
        else:
            tie = (f"{r_good:.0f} tok/s at {_at(r_at, limits, level_name)}, "
                   f"{100 * (r_good / good - 1):+.1f}%")
        parts.append(f"runner-up {runner['id']}: {tie}"
                     + (f"; it differs in {', '.join(differ)}" if differ else ""))
    out["text"] = "; ".join(parts) + "."
    return out
