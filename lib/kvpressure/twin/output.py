"""The twin folder: ``twin.json`` (everything), ``fit_table.csv`` (measured vs twin per level),
``twin.png`` (the curves overlaid) and ``twin.md`` (the fit first, then the predictions)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from kvpressure.folders.run_folder import RunFolder
from kvpressure.jsonable import to_jsonable
from kvpressure.twin.step_time import UNITS

TWIN_JSON = "twin.json"
FIT_TABLE = "fit_table.csv"
FIGURE = "twin.png"
SUMMARY_MD = "twin.md"


def up_front(twin: Any) -> list[str]:
    """What a reader must know before the numbers: the settings the data does not show and
    where the request lengths came from (the verdict's first lines)."""
    from kvpressure.twin.lengths import MEANS

    out = []
    if twin.assumed_settings:
        out.append("Assumed, not in the data: " + ", ".join(
            f"{k} = {twin.settings[k]}" for k in twin.assumed_settings)
            + " (vLLM's defaults; give the server's values with --set KEY=VALUE); a remedy "
            "changing one of them is not recommended")
    by_source: dict[str, list[str]] = {}
    for c, src in twin.lengths_sources().items():
        by_source.setdefault(src or "given", []).append(f"{c:g}")
    out.append("Request lengths: " + "; ".join(
        f"{src} at {'rate' if twin.open_loop else 'c'}={', '.join(levels)}"
        for src, levels in by_source.items())
        + ("" if MEANS not in by_source else ": the spread is not in the data, so preemptions "
           "from long requests are not modelled and no remedy's sign can be told"))
    return out


def _relabel(obj: Any, run_dir: str, label: str | None) -> Any:
    """``obj`` with the run folder's path written as ``label`` (a report's twin is built in a
    folder that is renamed when it is complete)."""
    if label is None or not run_dir:
        return obj
    if isinstance(obj, str):
        return obj.replace(run_dir, label)
    if isinstance(obj, dict):
        return {k: _relabel(v, run_dir, label) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relabel(v, run_dir, label) for v in obj]
    return obj


def twin_document(twin: Any, remedies: dict[str, Any] | None, label: str | None = None
                  ) -> dict[str, Any]:
    doc = _document(twin, remedies, label)
    return _relabel(doc, str(twin.measured.run_dir), label)


def _document(twin: Any, remedies: dict[str, Any] | None, label: str | None) -> dict[str, Any]:
    fit, report = twin.fitted, twin.report
    return {
        "up_front": up_front(twin),
        "assumed_settings": twin.assumed_settings,
        "lengths_sources": {f"{c:g}": s for c, s in twin.lengths_sources().items()},
        "run_dir": label or str(twin.measured.run_dir),
        "variant": twin.measured.variant,
        "settings": {k: {"value": twin.settings[k], "source": twin.settings_source.get(k)}
                     for k in sorted(twin.settings)},
        "workload": [w.describe() for _, w in sorted(twin.workloads.items())],
        "step_time": {"model": "T = t0 + t_prefill_token*P + t_decode_seq*D + "
                               "t_decode_ctx*sum_decode_ctx + t_prefill_attn*sum_prefill_attn",
                      "coefficients": fit.describe(), "fitted_on_levels": fit.levels,
                      "fit_rows": fit.rows.to_dict(orient="records"), "notes": fit.notes},
        "fit": {"verdict": report.verdict.text, "fits": report.verdict.fits,
                "details": to_jsonable(report.verdict),
                "levels": report.table.to_dict(orient="records")},
        "remedies": remedies,
        "assumptions": twin.assumptions(),
        "load": {"key": twin.key, "open_loop": twin.open_loop},
        "client_turnaround": None if twin.open_loop else twin.turnaround(),
        "return_lag": None if twin.return_lag is None else to_jsonable(twin.return_lag),
        "timings_s": {k: round(v, 3) for k, v in twin.timings.items()},
    }


def _figure(twin: Any, remedies: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvpressure.report.display import figure_png

    t = twin.report.table
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.0))
    x = t[twin.key]
    xlabel = "request rate (req/s)" if twin.open_loop else "concurrency"
    ax = axes[0]
    ax.plot(x, t["output_throughput_measured"], "o-", color="black", label="measured")
    ax.plot(x, t["output_throughput_twin"], "s--", color="tab:blue", label="twin")
    ax.fill_between(x, t["output_throughput_twin_p05"], t["output_throughput_twin_p95"],
                    color="tab:blue", alpha=0.2, lw=0, label="twin 90% (bootstrap)")
    if remedies and remedies.get("recommendation", {}).get("overrides"):
        rec = remedies["recommendation"]
        curve = pd.DataFrame([twin.predict_level(c, rec["overrides"])
                              for c in sorted(twin.workloads)])
        ax.plot(curve[twin.key], curve["output_throughput"], "^:", color="tab:green",
                label=f"twin, {rec['setting']}")
    ax.set(xlabel=xlabel, ylabel="output tokens/s", title="throughput")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(x, t["preemptions_measured"], "o-", color="black", label="measured")
    ax.plot(x, t["preemptions_twin"], "s--", color="tab:red", label="twin")
    if "preemptions_twin_low" in t:
        ax.fill_between(x, t["preemptions_twin_low"], t["preemptions_twin_high"],
                        color="tab:red", alpha=0.2, lw=0, label="twin, over its replays")
    ax.set(xlabel=xlabel, ylabel="preemptions", title="preemptions")
    ax.legend(fontsize=8)
    ax = axes[2]
    for stat, name, color in (("ttft_p95_s", "TTFT p95", "tab:purple"),
                              ("itl_p95_s", "ITL p95", "tab:orange")):
        ax.plot(x, t[f"{stat}_measured"], "o-", color=color, label=f"{name} measured")
        ax.plot(x, t[f"{stat}_twin"], "s--", color=color, alpha=0.7, label=f"{name} twin")
    ax.set(xlabel=xlabel, ylabel="seconds", title="latency p95", yscale="log")
    ax.legend(fontsize=8)
    import textwrap

    # The whole verdict, wrapped to the figure's width (a cut title hides what did not fit).
    fig.suptitle("\n".join(textwrap.wrap(twin.report.verdict.text, 160)), fontsize=9)
    fig.tight_layout()
    path.write_bytes(figure_png(fig))
    plt.close(fig)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def twin_preemptions(r: dict[str, Any]) -> str:
    """The twin's preemptions at a level, with the range of its replays (an open loop's timing,
    a closed loop's arrival orders) where they differ."""
    def finite(v: Any) -> bool:
        return isinstance(v, int | float) and math.isfinite(v)

    lo, hi, point = (r.get(f"preemptions_twin{k}") for k in ("_low", "_high", ""))
    text = f"{point:.0f}" if finite(point) else "n/a"
    return f"{text} ({lo:.0f}-{hi:.0f})" if finite(lo) and finite(hi) and lo != hi else text


def _markdown(doc: dict[str, Any]) -> str:
    fit = doc["fit"]
    key = (doc.get("load") or {}).get("key", "concurrency")
    lines = [f"# Twin of {doc['run_dir']}", "", f"**Fit: {fit['verdict']}**", ""]
    lines += [f"**{line}**" for line in doc.get("up_front", [])]
    lines += ["", "## Measured vs twin, per level", "",
             f"| {'c' if key == 'concurrency' else 'req/s'} | throughput meas | twin | err % | preempt meas | twin | TTFT p95 meas | twin "
             "| ITL p95 meas | twin | recompute meas (low-high) | twin |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fit["levels"]:
        lines.append(
            f"| {r[key]:g} | {_fmt(r['output_throughput_measured'], 4)} | "
            f"{_fmt(r['output_throughput_twin'], 4)} | {_fmt(r['output_throughput_error_pct'], 2)} "
            f"| {_fmt(r['preemptions_measured'])} | {twin_preemptions(r)} | "
            f"{_fmt(r['ttft_p95_s_measured'])} | {_fmt(r['ttft_p95_s_twin'])} | "
            f"{_fmt(r['itl_p95_s_measured'])} | {_fmt(r['itl_p95_s_twin'])} | "
            f"{_fmt(r['recompute_ratio_measured_low'])}-{_fmt(r['recompute_ratio_measured_high'])}"
            f" | {_fmt(r['recompute_ratio_twin'])} |")
    lines += ["", "## Step time", "", "| coefficient | value | 90% interval | unit | source |",
              "|---|---|---|---|---|"]
    for name, c in doc["step_time"]["coefficients"].items():
        lines.append(f"| {name} | {_fmt(c['value'])} | {_fmt(c['p05'])} - {_fmt(c['p95'])} | "
                     f"{UNITS.get(name, c['unit'])} | {c['source']} |")
    rem = doc.get("remedies")
    if rem:
        at = rem["focus"]["name"]
        lines += ["", f"## Remedies at {at}", "",
                  f"{rem['trust']}", "",
                  f"**Recommendation: {rem['recommendation']['text']}**", "",
                  f"Run-to-run noise of a level's throughput: "
                  f"{rem['noise']['throughput_sd_pct']:.1f}% ({rem['noise']['source']}); a "
                  f"change inside it is no measurable effect. Focus: {rem['focus']['rule']}."
                  + (f" Left out as no-ops (already set): {', '.join(rem['no_ops_left_out'])}."
                     if rem.get("no_ops_left_out") else ""), "",
                  "| setting | throughput | change at the focus | TTFT p95 s | ITL p95 s | "
                  "preemptions | meets limits | changes an assumed setting |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rem["candidates"]:
            lines.append(f"| {r['setting']} | {_fmt(r['output_throughput'], 4)} | "
                         f"{r['effect_text']} | "
                         f"{_fmt(r['ttft_p95_s'])} | {_fmt(r['itl_p95_s'])} | "
                         f"{r['preemptions']} | {'yes' if r['meets_limits'] else 'no'} | "
                         f"{', '.join(r['changes_assumed_settings']) or 'no'} |")
    lines += ["", "## Settings", ""]
    lines += [f"- {k} = {v['value']} ({v['source']})" for k, v in doc["settings"].items()]
    lines += ["", "## Assumptions", ""] + [f"- {a}" for a in doc["assumptions"]]
    return "\n".join(lines) + "\n"


def write_twin(twin: Any, remedies: dict[str, Any] | None, out_dir: str | Path,
               label: str | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = to_jsonable(twin_document(twin, remedies, label))
    paths = [out / TWIN_JSON, out / FIT_TABLE, out / FIGURE, out / SUMMARY_MD]
    paths[0].write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False,
                                   default=str) + "\n", encoding="utf-8")
    twin.report.table.to_csv(paths[1], index=False, lineterminator="\n")
    _figure(twin, remedies, paths[2])
    paths[3].write_text(_markdown(doc), encoding="utf-8")
    return paths


def make_twin_folder(run_dir: RunFolder | str | os.PathLike[str], out_dir: str | Path, *,
                     limits: dict[str, float] | None = None, focus: float | None = None,
                     overrides: dict[str, Any] | None = None, cost_model: Any = None,
                     variant: str | None = None, bootstrap: int = 200, seed: int = 0,
                     remedies: bool = True, refusal_ok: bool = False,
                     latency_tolerance_pct: float | None = None, label: str | None = None,
                     server_log: str | Path | None = None,
                     return_steps: int | None = None) -> dict[str, Any]:
    """Build, fit, check the twin of ``run_dir`` and write its folder; returns a summary.

    The one call a report stage needs. With ``refusal_ok``, data the twin cannot be fitted to
    (too few levels, no pool size) writes ``twin.json`` and ``twin.md`` saying why instead of
    raising. ``run_dir`` may be a :class:`RunFolder` holding what a stage already read of it.
    ``latency_tolerance_pct`` applies when ``limits`` is empty
    (``remedies.predict_remedies``); ``label`` names the measured data in the files instead
    of ``run_dir``'s path; ``server_log`` is the server's log with its iteration details
    (``api.build_twin``); ``return_steps`` the clients' return lag in engine steps, instead
    of the twin's estimate (``api.build_twin``).
    """
    from kvpressure.errors import InputError
    from kvpressure.twin.api import build_twin

    try:
        twin = build_twin(run_dir, overrides=overrides, variant=variant, cost_model=cost_model,
                          server_log=server_log, return_steps=return_steps)
        twin.fit(bootstrap=bootstrap, seed=seed)
    except InputError as exc:
        if not refusal_ok:
            raise
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"run_dir": label or os.fspath(run_dir), "refused": str(exc)}
        (out / TWIN_JSON).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
        (out / SUMMARY_MD).write_text(f"# Twin of {doc['run_dir']}\n\n**No twin: {exc}**\n",
                                      encoding="utf-8")
        return {"out": str(out), "files": [TWIN_JSON, SUMMARY_MD], "refused": str(exc)}
    report = twin.fit_report()
    fitted = twin.require_fit("the twin folder")
    advice = twin.predict_remedies(focus=focus, limits=limits or {},
                                   latency_tolerance_pct=latency_tolerance_pct) if remedies else None
    written = write_twin(twin, advice, out_dir, label)
    summary: dict[str, Any] = {
        "out": str(out_dir), "files": [p.name for p in written], "fit": report.verdict.text,
        "fits": report.verdict.fits,
        "coefficients": {k: {"value": v["value"], "source": v["source"]}
                         for k, v in fitted.describe().items()},
    }
    if advice is not None:
        summary["recommendation"] = advice["recommendation"]["text"]
    return summary
