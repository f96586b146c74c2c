"""``index.html``: the readable report, one self-contained page without code.

The verdict comes first (status, key numbers, the knee, the evidence and the remedies, all from
``record.yaml``), then each executed notebook's outputs in the investigation's order: its
Markdown, generated sentences, tables and figures (PNG embedded as base64). Inputs, the
parameters cells and stderr streams are left out. This module gathers what the page shows;
``templates/report.html.j2`` lays it out, the template engine escaping every value.
"""

from __future__ import annotations

import base64
import functools
import os
import re
from pathlib import Path
from typing import Any

from markupsafe import escape

from kvpressure.folders.layout import INDEX_HTML, NOTEBOOKS_DIR, RECORD_YAML
from kvpressure.record.schema import STATUS_KV_BOUND, STATUS_NOT_ESTABLISHED, Record
from kvpressure.report.sentences import (
    count,
    focus_label,
    lead_sentence,
    level_words,
    ms,
    num,
    recompute_ratio_text,
    record_axis,
    signed_pct,
    symptom_sentence,
    to_html,
    version_warning,
    window_text,
)
from kvpressure.stages.files import STAGES
from kvpressure.stages.results import VerdictResult

SKIP_TAGS = frozenset({"parameters", "injected-parameters", "report-skip",
                       "papermill-error-cell-tag"})
_FIGURE_REPR = re.compile(r"^<(Figure|Axes|matplotlib)[^>]*>$|^<seaborn\.")

def _e(value: Any) -> str:
    return str(escape(str(value)))


@functools.cache
def _environment() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    # autoescape: every value is escaped by the template; html.py marks the few fragments it
    # made safe itself (Markup).
    return Environment(loader=PackageLoader("kvpressure", "templates"), autoescape=True,
                       trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined,
                       keep_trailing_newline=True)


# What notebook output may bring into the page: formatting, tables, links. Labels, model
# names and paths reach notebook output as text; anything else (a <script> in a model_name
# label, an onerror attribute, a javascript: link) is taken out, its text kept as text.
_SAFE_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "li",
    "ol", "p", "pre", "s", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody",
    "td", "tfoot", "th", "thead", "tr", "u", "ul",
})
_SAFE_ATTRIBUTES = {"*": ["class", "id", "title"], "a": ["href"], "td": ["colspan", "rowspan"],
                    "th": ["colspan", "rowspan"]}


def _clean(fragment: str) -> str:
    """Notebook HTML with only formatting left (see ``_SAFE_TAGS``)."""
    import bleach

    return bleach.clean(fragment, tags=_SAFE_TAGS, attributes=_SAFE_ATTRIBUTES,
                        protocols=["http", "https", "mailto"], strip=True,
                        strip_comments=True)


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    out = markdown2html_mistune(text)
    # Notebook headings sit one level below the page's own.
    for level in (5, 4, 3, 2, 1):
        out = re.sub(rf"<(/?)h{level}([ >])", rf"<\1h{level + 1}\2", out)
    out = re.sub(r'<a class="anchor-link"[^>]*>.*?</a>', "", out)
    return _clean(out)


NO_DATA = "no data"


def _or(value: Any, fmt: Any, missing: str = NO_DATA) -> str:
    """``fmt(value)``, or the words for a measurement the data did not give."""
    return missing if value is None else fmt(value)


def _pct(digits: int = 1) -> Any:
    return lambda v: f"{v:.{digits}%}"


def _holds(check: Any) -> str:
    """yes / no / no data: a check the data could not judge is not read as "no"."""
    return NO_DATA if check.holds is None else ("yes" if check.holds else "no")


def _gain_cell(gain: Any, spread: Any) -> str:
    text = signed_pct(gain)
    if spread:
        text += f" ({spread[0]:+.0f}% to {spread[1]:+.0f}%)"
    return text


def recommendation_view(rec: dict[str, Any] | None, axis: str = "concurrency"
                        ) -> dict[str, Any] | None:
    """The first thing on the page: the change to make, then (folded) the runner-up, the
    remedies that had no effect or broke the latency limits, and those not run (with why)."""
    if not rec or not rec.get("text"):
        return None
    rows = []
    op = next((r.get("operating_concurrency") for r in rec.get("ranked") or []
               if r.get("operating_concurrency") is not None), None)
    for label, items in (("runner-up", (rec.get("ranked") or [])[1:2]),
                         ("also gains", (rec.get("ranked") or [])[2:]),
                         ("over the latency limits", rec.get("over_limits") or []),
                         ("no effect", rec.get("no_effect") or [])):
        for r in items:
            cells = [_gain_cell(r.get("gain_pct"), r.get("gain_range_pct"))]
            if op is not None:
                cells.append(_gain_cell(r.get("operating_gain_pct"),
                                        r.get("operating_gain_range_pct")))
            cells += [signed_pct(r.get("ttft_p95_change_pct")),
                      signed_pct(r.get("itl_p95_change_pct"))]
            rows.append({"remedy": r, "cells": cells,
                         "why": "; ".join(r.get("breaks") or []) or label})
    for r in rec.get("not_run") or []:
        rows.append({"remedy": r, "cells": ["not run"] * (4 if op is not None else 3),
                     "why": r.get("why") or "not run"})
    c = rec.get("concurrency")
    twin = rec.get("source") == "twin" and rec.get("twin_fit")
    words = level_words(axis)
    return {"text": rec["text"], "rows": rows, "limits": rec.get("limits", ""),
            "at": words.at(c) if c else f"{words.singular} ?",
            "operating": words.at(op) if op is not None else None,
            # The fit before the prediction: how far the twin's numbers can be trusted.
            "twin_note": rec["twin_fit"] if twin else None,
            "symptoms_note": (rec.get("why_not_simulated")
                              if not twin and rec.get("source") == "symptoms" else None)}


def recommendation_html(rec: dict[str, Any] | None, axis: str = "concurrency") -> str:
    """The recommendation box alone (``recommendation_view`` through its template macro)."""
    view = recommendation_view(rec, axis)
    if view is None:
        return ""
    return str(_environment().get_template("macros.html.j2").module.recommendation(view))


# The run folder's files, linked from the verdict (the page sits in the run folder).
FILES = ((RECORD_YAML, "the record"), ("runs.csv", "one row per level and seed"),
         ("series.csv", "the focus level's metrics over time"),
         (f"{NOTEBOOKS_DIR}/", "the executed notebooks"))


def _reason(text: str) -> str:
    """A status rule as a sentence: without its rule number."""
    text = re.sub(r"^\s*\d+\s*:\s*", "", text)
    finding = re.match(r"^([a-z ]+): (.+)$", text)
    if finding and "interference" in finding.group(1):  # a finding beside the status
        return f"Also present: {finding.group(1)} ({finding.group(2)})."
    return text[:1].upper() + text[1:]


def verdict_view(record: Record, headline: str = "", verdict: VerdictResult | None = None
                 ) -> dict[str, Any]:
    """The first screen: status, the recommendation, the sentence that explains it, the
    headline figure (the curve with its knee), key numbers, evidence, remedies, and what the
    data could not give. ``verdict`` is stage 06's result (its recommendation and symptoms)."""
    from markupsafe import Markup

    s, c, w, p = record.scheduler, record.counters, record.workload, record.perf
    knee = p.knee
    kind = "kv" if record.status == STATUS_KV_BOUND else (
        "open" if record.status == STATUS_NOT_ESTABLISHED else "seq")
    from kvpressure import VLLM_BEHAVIOUR_VERSION

    warning = version_warning(record.provenance.vllm_version_served, VLLM_BEHAVIOUR_VERSION)
    low, high = c.recompute_ratio_range or (None, None)
    ratio = recompute_ratio_text(c.recompute_ratio, low, high, exact=c.recompute_exact)

    def one(v: float | None) -> str:
        return _or(v, lambda x: f"{x:.1f}")

    words = record_axis(record)
    level = w.request_rate if words.axis == "request_rate" else w.concurrency
    window = f"{_or(level, num, 'unknown')} ({c.window.run}, {window_text(c.window)})"
    numbers = [
        (f"knee / peak {words.singular}",
         NO_DATA + " (too few levels)" if knee is None else
         f"{'none' if knee.knee_x is None else num(knee.knee_x)} / {num(knee.peak_x)}"),
        ("peak output throughput", NO_DATA if knee is None else f"{num(knee.peak_y)} tok/s"),
        ("decline after the peak", NO_DATA if knee is None else
         f"{knee.decline_pct:.1f}%" + ("" if knee.declines else " (within noise)")),
        (f"counters read at {words.singular}", window),
        ("running (mean / max) vs max_num_seqs",
         f"{one(c.num_requests_running)} / {_or(s.max_num_seqs_effective, num)} vs "
         f"{_or(s.max_num_seqs, str, 'unknown')}"),
        ("waiting: capacity / deferred", f"{one(c.waiting_capacity)} / {one(c.waiting_deferred)}"),
        ("KV cache usage (mean)", _or(c.kv_cache_usage_perc, _pct())),
        (f"preemptions ({focus_label(record.provenance.seed)})", count(c.num_preemptions_total)),
        (f"recomputed tokens ({focus_label(record.provenance.seed)})",
         count(c.recomputed_tokens) if c.recompute_exact or c.recomputed_tokens_range is None
         else f"{count(c.recomputed_tokens_range[0])}–{count(c.recomputed_tokens_range[1])} "
              "(estimated from counters)"),
        (f"recompute ratio ({focus_label(record.provenance.seed)})", ratio),
        ("ITL mean / p95", f"{_or(p.itl_mean, ms)} / {_or(p.itl_p95, ms)}"),
        ("TTFT p95" + (" (mostly time queued before admission)"
                       if (c.num_requests_waiting or 0) >= 1 else ""), _or(p.ttft_p95, ms)),
    ]
    symptoms = [x.model_dump() for x in verdict.symptoms.symptoms] if verdict else []
    checks = [{"name": ch.name, "holds": ch.holds, "holds_text": _holds(ch),
               "seen": (symptom_sentence(symptoms[i], s.max_num_seqs, axis=words.axis)
                        if i < len(symptoms)
                        else ch.observed),
               "metric": ch.metric}
              for i, ch in enumerate(record.evidence.checks)]
    return {
        "kind": kind, "status": record.status,
        "recommendation": recommendation_view(
            verdict.remedies.recommendation if verdict else None, words.axis),
        # Sentences carry their own markup (to_html escapes the text first).
        "lead": Markup(to_html(lead_sentence(record))),
        "version_warning": Markup(to_html(warning)) if warning else None,
        "fidelity": (Markup(to_html(p.latency_fidelity.statement)) if p.latency_fidelity
                     else None),
        "fidelity_checked": bool(p.latency_fidelity and p.latency_fidelity.checked),
        "headline": Markup(headline),
        "comparison": record.evidence.comparison,
        "reasons": [_reason(r) for r in record.evidence.reasons],
        "files": FILES, "numbers": numbers, "checks": checks,
        "remedies": record.remedies, "missing": list(record.missing.items()),
    }


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def _output_html(output: Any) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        if output.get("name") == "stderr":
            return ""
        return f"<pre>{_e(''.join(output.get('text', '')))}</pre>"
    if kind == "error":
        return f"<pre class='error'>{_e(output.get('ename'))}: {_e(output.get('evalue'))}</pre>"
    data = output.get("data", {})
    if (output.get("metadata") or {}).get("kvpressure", {}).get("banner"):
        return ""  # the notebook's run banner: the page names its run once, in its header
    if "image/png" in data:
        png = data["image/png"]
        png = png if isinstance(png, str) else "".join(png)
        png = png.strip()
        if not _BASE64.fullmatch(png):
            return ""
        alt = data.get("text/plain") or "figure"
        alt = "".join(alt) if isinstance(alt, list) else alt
        return f'<img alt="{_e(alt.strip())}" src="data:image/png;base64,{png}">'
    if "text/html" in data:
        text = data["text/html"]
        return f'<div class="table-wrap">{_clean("".join(text) if isinstance(text, list) else text)}</div>'
    if "text/markdown" in data:
        text = data["text/markdown"]
        return _markdown("".join(text) if isinstance(text, list) else text)
    if "text/plain" in data:
        text = data["text/plain"]
        text = "".join(text) if isinstance(text, list) else text
        if _FIGURE_REPR.match(text.strip()):
            return ""
        return f"<pre>{_e(text)}</pre>"
    return ""


def notebook_html(nb: Any) -> str:
    """The outputs and Markdown of one executed notebook, inputs left out."""
    parts: list[str] = []
    for cell in nb.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if tags & SKIP_TAGS:
            continue
        if cell.cell_type == "markdown":
            parts.append(_markdown(cell.source))
        elif cell.cell_type == "code":
            parts.extend(_output_html(o) for o in cell.get("outputs", []))
    return "\n".join(p for p in parts if p)


def headline_figure(notebooks: list[tuple[str, Any]]) -> str:
    """The first figure of a cell tagged ``headline`` (the throughput curve with its knee), so
    the verdict shows the curve it speaks of."""
    for _, nb in notebooks:
        for cell in nb.cells:
            if cell.cell_type == "code" and "headline" in cell.get("metadata", {}).get("tags", []):
                for output in cell.get("outputs", []):
                    if "image/png" in output.get("data", {}):
                        return _output_html(output)
    return ""


def _title(nb: Any, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^#\s+(.+)$", cell.source, re.MULTILINE)
            if match:
                return match.group(1).strip()
    return fallback


def _pool(record: Record) -> str:
    s = record.scheduler
    if s.num_gpu_blocks is None or s.block_size is None:
        return "KV pool size unknown"
    return f"{s.num_gpu_blocks:,} KV blocks of {s.block_size} tokens"


def build_html(record: Record, notebooks: list[tuple[str, Any]], title: str,
               verdict: VerdictResult | None = None, run_folder: str = "") -> str:
    """The whole page from a record, the executed notebooks (name, NotebookNode) and stage
    06's result (the recommendation, the symptoms' evidence)."""
    from markupsafe import Markup

    from kvpressure import VLLM_BEHAVIOUR_VERSION, __version__

    prov = record.provenance
    seed = "" if prov.seed is None else f"; seed {prov.seed}"
    if prov.seeds is not None and len(prov.seeds) > 1:
        more = ", ".join(map(str, prov.seeds[1:]))
        seed += f" (and {more} for the run-to-run noise)"
    subtitle = [record.workload.model_name,
                f"policy {_or(record.scheduler.policy, str, 'unknown')}", _pool(record),
                f"{prov.mode} data"]
    if prov.vllm_version_served:
        subtitle.append(f"served by vLLM {prov.vllm_version_served}"
                        + (f" ({prov.platform})" if prov.platform and prov.mode == "ingested"
                           else ""))
    elif prov.platform:
        subtitle.append(prov.platform if prov.mode == "simulation" else f"on {prov.platform}")
    if prov.load_tool:
        subtitle.append(f"load: {prov.load_tool}")
    if run_folder:
        subtitle.append(f"run folder {run_folder}")
    return _environment().get_template("report.html.j2").render(
        title=title, subtitle=subtitle,
        v=verdict_view(record, headline_figure(notebooks), verdict),
        toc=[(name, _title(nb, name)) for name, nb in notebooks],
        # Notebook output went through the sanitiser (_clean) or was escaped on its way in.
        sections=[(name, Markup(notebook_html(nb))) for name, nb in notebooks],
        version=__version__, vllm_rules=VLLM_BEHAVIOUR_VERSION,
        served=prov.vllm_version_served, inputs=prov.inputs, seed=seed,
        record_yaml=RECORD_YAML, notebooks_dir=NOTEBOOKS_DIR)


def render_report(run_dir: str | os.PathLike[str], title: str | None = None,
                  run_folder: str | None = None) -> Path:
    """Write ``run_dir/index.html`` from ``record.yaml`` and ``notebooks/*.ipynb``."""
    import nbformat

    from kvpressure.record.io import load_record

    run_dir = Path(run_dir)
    record = load_record(run_dir / RECORD_YAML)
    notebooks = []
    for name in STAGES.values():
        path = run_dir / NOTEBOOKS_DIR / f"{name}.ipynb"
        if path.is_file():
            notebooks.append((name, nbformat.read(path, as_version=4)))
    from kvpressure.stages.files import has_stage, read_stage
    from kvpressure.stages.results import CollectInfo, VerdictResult

    verdict = read_stage(run_dir, VerdictResult) if has_stage(run_dir, VerdictResult) else None
    if title is None:
        name = (read_stage(run_dir, CollectInfo).name if has_stage(run_dir, CollectInfo)
                else None) or run_dir.resolve().name
        title = f"{name}: where throughput stops growing, and why"
    from kvpressure.folders.run_folder import display_path

    page = build_html(record, notebooks, title, verdict,
                      display_path(run_dir) if run_folder is None else run_folder)
    out = run_dir / INDEX_HTML
    out.write_text(page, encoding="utf-8")
    return out


def embedded_images(page: str) -> list[bytes]:
    """The PNG images embedded in a page (for checks)."""
    return [
        base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    ]
