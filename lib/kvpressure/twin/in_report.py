"""The twin in the investigation's report, for measured data.

A measured run cannot be re-run with another setting, but its fitted twin can: stage 06 builds
the twin into the run folder's ``twin/`` before it recommends, so the recommendation is the
twin's what-if (``investigation.verdict``). The report then shows the fit first (the verdict, measured
against twin per level, the overlaid curves) and says how far the twin can be trusted; only then
its prediction. Data the twin cannot be fitted to (one level, no request lengths, no pool size)
gives a refusal with its reason, shown as such. A simulated run gets no twin: it is its own model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.errors import InputError
from kvpressure.folders.run_folder import RunFolder
from kvpressure.twin.output import (
    FIGURE,
    SUMMARY_MD,
    TWIN_JSON,
    make_twin_folder,
    twin_preemptions,
)

TWIN_DIR = "twin"
LABEL = "the measured server of this report"
# The report's rule for latency when no limits are given: no more than this much worse.
LATENCY_TOLERANCE_PCT = 10.0


@dataclass
class ReportTwin:
    """What the report shows of the twin (read back from ``twin/twin.json``)."""

    refused: str | None
    verdict: str = ""
    fits: bool = False
    trust: str = ""
    recommendation: str = ""
    fit_table: pd.DataFrame = field(default_factory=pd.DataFrame)
    coefficients: pd.DataFrame = field(default_factory=pd.DataFrame)
    assumptions: list[str] = field(default_factory=list)
    figure: Path | None = None
    limits_note: str = ""
    up_front: list[str] = field(default_factory=list)
    """The assumed settings and the request lengths' sources: shown with the verdict."""
    noise: dict[str, Any] = field(default_factory=dict)
    """The run-to-run noise the intervals include (``noise.RunNoise.to_dict``)."""
    focus: dict[str, Any] = field(default_factory=dict)
    """The level the remedies are priced at, and the rule that chose it."""
    remedies: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row a setting priced at the focus (neighbouring ``max_num_seqs`` values included):
    ``setting``, ``overrides``, ``effect`` (raises / lowers / no measurable effect),
    ``effect_text``, ``change_pct``, ``change_low_pct``/``change_high_pct`` (90%, with the
    noise), ``preemptions``, ``meets_limits``, ``changes_assumed_settings``."""
    document: Path | None = None
    """``twin/twin.md``, the twin's own account."""


def _write_refusal(out: Path, reason: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / TWIN_JSON).write_text(json.dumps({"run_dir": LABEL, "refused": reason}, indent=2,
                                            sort_keys=True) + "\n", encoding="utf-8")
    (out / SUMMARY_MD).write_text(f"# Twin of {LABEL}\n\n**No twin: {reason}**\n",
                                  encoding="utf-8")


def build_report_twin(run_dir: str | os.PathLike[str], focus: float | None,
                      levels: list[float], limits: Mapping[str, float] | None = None,
                      axis: str = "concurrency", read: RunFolder | None = None
                      ) -> dict[str, Any]:
    """Build, fit and check the twin of the measured run in ``run_dir`` into its ``twin/``,
    and predict the remedies at ``focus`` (when it is one of ``levels``, else the highest).

    ``limits`` are the report's latency limits (``analysis.limits`` names); those the twin does not
    price (means, p99) are left out and named. Without limits, the report's rule holds: TTFT
    and ITL p95 no more than 10% worse than the twin's own at the focus level. ``read`` is the
    run folder as the stage has read it (its tables, stage 01's result): the twin reads on
    from it rather than reading those files again.
    """
    from kvpressure.twin.remedies import PRICED_LATENCIES

    out = Path(run_dir) / TWIN_DIR
    given = dict(limits or {})
    kept = {k: float(v) for k, v in given.items() if k in PRICED_LATENCIES}
    dropped = sorted(set(given) - set(kept))
    if axis == "request_rate":  # the open loop's twin: its levels are request rates
        chosen: float | None = (float(focus) if focus is not None
                                and float(focus) in {float(v) for v in levels} else None)
    else:
        chosen = int(focus) if focus is not None and int(focus) in set(levels) else None
    try:
        held = read is not None and read.path.resolve() == Path(run_dir).resolve()
        summary = make_twin_folder(
            read if read is not None and held else run_dir, out, limits=kept, focus=chosen, refusal_ok=True, label=LABEL,
            latency_tolerance_pct=None if given else LATENCY_TOLERANCE_PCT)
    except InputError as exc:  # the fit held but a prediction was refused: say so, keep going
        _write_refusal(out, str(exc))
        summary = {"out": str(out), "refused": str(exc)}
    if dropped:
        summary["limits_not_priced"] = dropped
    return summary


def _fmt_range(lo: Any, hi: Any) -> str:
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (lo, hi)):
        return "n/a"
    return f"{lo:.1%}-{hi:.1%}"


def fit_frame(levels: list[dict[str, Any]]) -> pd.DataFrame:
    """Measured against twin per level, as a reader's table (errors in %)."""
    rows = []
    for r in levels:
        level = ({"concurrency": r["concurrency"]} if "concurrency" in r
                 else {"request rate (req/s)": r["request_rate"]})
        rows.append({
            **level,
            "output tok/s measured": r.get("output_throughput_measured"),
            "output tok/s twin": r.get("output_throughput_twin"),
            "error %": r.get("output_throughput_error_pct"),
            "preemptions measured": r.get("preemptions_measured"),
            "preemptions twin": twin_preemptions(r),
            "recompute measured (range)": _fmt_range(r.get("recompute_ratio_measured_low"),
                                                     r.get("recompute_ratio_measured_high")),
            "recompute twin": (f"{r['recompute_ratio_twin']:.1%}"
                               if isinstance(r.get("recompute_ratio_twin"), int | float)
                               else "n/a"),
            "TTFT p95 s measured / twin": _pair(r, "ttft_p95_s"),
            "ITL p95 ms measured / twin": _pair(r, "itl_p95_s", 1000.0),
        })
    return pd.DataFrame(rows)


def _pair(r: Mapping[str, Any], stat: str, scale: float = 1.0) -> str:
    def one(v: Any) -> str:
        return f"{v * scale:.3g}" if isinstance(v, int | float) and math.isfinite(v) else "n/a"

    err = r.get(f"{stat}_error_pct")
    tail = f" ({err:+.0f}%)" if isinstance(err, int | float) and math.isfinite(err) else ""
    return f"{one(r.get(f'{stat}_measured'))} / {one(r.get(f'{stat}_twin'))}{tail}"


def read_report_twin(run_dir: str | os.PathLike[str]) -> ReportTwin | None:
    """The twin written into ``run_dir`` (None when there is none: a simulated run)."""
    folder = Path(run_dir) / TWIN_DIR
    path = folder / TWIN_JSON
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return ReportTwin(refused=f"{path}: not readable JSON ({exc})")
    if doc.get("refused"):
        return ReportTwin(refused=str(doc["refused"]))
    fit = doc.get("fit") or {}
    rem = doc.get("remedies") or {}
    coef = pd.DataFrame([
        {"coefficient": name, "value": c.get("value"), "90% interval":
            f"{c.get('p05', float('nan')):.3g} - {c.get('p95', float('nan')):.3g}",
         "unit": c.get("unit"), "source": c.get("source")}
        for name, c in ((doc.get("step_time") or {}).get("coefficients") or {}).items()])
    limits = rem.get("limits") or {}
    note = ""
    if rem:
        note = ("latency limits: " + (", ".join(f"{k.removesuffix('_s')} <= {v:.3g} s"
                                                for k, v in limits.items()) or "none")
                + (f" ({rem['limits_rule']})" if rem.get("limits_rule") not in (None, "given")
                   else ""))
    table = pd.DataFrame([
        {"setting": r.get("setting"), "overrides": r.get("overrides"),
         "effect": r.get("effect"), "effect_text": r.get("effect_text"),
         "change_pct": r.get("throughput_change_pct"),
         "change_low_pct": (r.get("throughput_change_pct_with_noise") or [None, None])[0],
         "change_high_pct": (r.get("throughput_change_pct_with_noise") or [None, None])[1],
         "preemptions": r.get("preemptions"), "meets_limits": r.get("meets_limits"),
         "changes_assumed_settings": r.get("changes_assumed_settings") or []}
        for r in rem.get("candidates") or []])
    return ReportTwin(
        up_front=[str(a) for a in doc.get("up_front") or []], noise=rem.get("noise") or {},
        focus=rem.get("focus") or {}, remedies=table,
        document=folder / SUMMARY_MD if (folder / SUMMARY_MD).is_file() else None,
        refused=None, verdict=str(fit.get("verdict", "")), fits=bool(fit.get("fits")),
        trust=str(rem.get("trust", "")),
        recommendation=str((rem.get("recommendation") or {}).get("text", "")),
        fit_table=fit_frame(fit.get("levels") or []), coefficients=coef,
        assumptions=[str(a) for a in doc.get("assumptions") or []],
        figure=folder / FIGURE if (folder / FIGURE).is_file() else None, limits_note=note)


def show_report_twin(twin: ReportTwin | None) -> None:
    """The twin's part of notebook 06: the fit first (verdict, per level, the overlaid
    curves, the step time and what was assumed), then how far it can be trusted and its
    prediction; a refusal with its reason; nothing for a run without a twin."""
    import base64

    from IPython.display import display

    from kvpressure.report.display import say, show_table

    if twin is None:
        return
    say("## The twin of the measured server")
    if twin.refused:
        say(f"**No twin: {twin.refused}.** The recommendation comes from the symptoms "
            "instead (the measured run cannot be re-run with another setting).")
        return
    say(f"**Fit: {twin.verdict}.** The twin is vLLM's scheduler replaying the measured "
        "closed loop on the measured pool, with a step time fitted to this server's curve; "
        "measured against twin at every level:")
    if twin.up_front:
        say("\n".join(f"**{line}**" for line in twin.up_front))
    show_table(twin.fit_table, digits=1, missing="no data")
    if twin.figure is not None:
        png = base64.b64encode(twin.figure.read_bytes()).decode("ascii")
        display({"image/png": png, "text/plain": "measured and twin curves: output "
                 "throughput with the twin's bootstrap band, preemptions, TTFT and ITL p95"},
                raw=True)
    say("Step time fitted to the server (bootstrap over levels; a coefficient the data "
        "cannot identify says where its value came from):")
    show_table(twin.coefficients, text=True)
    say("What the twin assumes:\n\n" + "\n".join(f"- {a}" for a in twin.assumptions))
    say(f"**How far to trust it:** {twin.trust}.")
    if twin.recommendation:
        say(f"Only then the prediction: {twin.recommendation} ({twin.limits_note}). The "
            "remedies and their predicted effect are in `twin/twin.md`.")
    if len(twin.remedies):
        noise = twin.noise
        say(f"Each setting at {twin.focus.get('name', 'the focus level')} "
            f"({twin.focus.get('rule', '')}); a change inside the run-to-run noise "
            f"({noise.get('throughput_sd_pct', float('nan')):.1f}% a run, "
            f"{noise.get('source', '')}) is no measurable effect:")
        shown = twin.remedies[["setting", "effect_text", "preemptions",
                               "changes_assumed_settings"]].copy()
        shown["changes_assumed_settings"] = shown["changes_assumed_settings"].map(
            lambda v: ", ".join(v) if isinstance(v, list | tuple) and v else "none")
        show_table(shown.rename(columns={
            "effect_text": "predicted change in output throughput",
            "preemptions": "preemptions (twin)",
            "changes_assumed_settings": "changes an assumed setting"}), text=True)
