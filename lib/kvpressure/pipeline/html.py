"""``index.html``: the readable report, one self-contained page without code.

The verdict comes first (status, key numbers, the knee, the evidence and the remedies, all from
``record.yaml``), then each executed notebook's outputs in the investigation's order: its
Markdown, generated sentences, tables and figures (PNG embedded as base64). Inputs, the
parameters cells and stderr streams are left out.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvpressure.pipeline.notebooks import NOTEBOOKS
from kvpressure.pipeline.run_folder import INDEX_HTML, NOTEBOOKS_DIR, RECORD_YAML
from kvpressure.pipeline.sentences import (
    count,
    focus_label,
    lead_sentence,
    ms,
    num,
    recompute_ratio_text,
    signed_pct,
    symptom_sentence,
    to_html,
    version_warning,
    window_text,
)
from kvpressure.record.schema import STATUS_KV_BOUND, STATUS_NOT_ESTABLISHED, Record
from kvpressure.stages.results import VerdictResult

SKIP_TAGS = frozenset({"parameters", "injected-parameters", "report-skip",
                       "papermill-error-cell-tag"})
_FIGURE_REPR = re.compile(r"^<(Figure|Axes|matplotlib)[^>]*>$|^<seaborn\.")

CSS = """
:root { --ink: #1d232b; --muted: #5a6572; --line: #d8dee5; --bg: #ffffff; --panel: #f5f7f9; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 40px 60px; }
h1 { font-size: 30px; margin: 0 0 4px; }
h2 { font-size: 24px; margin: 40px 0 10px; padding-top: 14px; border-top: 2px solid var(--line); }
h3 { font-size: 19px; margin: 24px 0 8px; }
h4 { font-size: 17px; margin: 18px 0 6px; }
p, li { max-width: 980px; }
.subtitle { color: var(--muted); margin: 0 0 20px; }
.verdict { background: var(--panel); border: 1px solid var(--line); border-left: 8px solid #6b7785;
  border-radius: 6px; padding: 18px 24px; margin: 16px 0 24px; }
.verdict.kv { border-left-color: #c2410c; }
.verdict.seq { border-left-color: #7c3aed; }
.status { display: inline-block; font-weight: 700; font-size: 22px; padding: 2px 12px;
  border-radius: 4px; background: #6b7785; color: #fff; }
.verdict.kv .status { background: #c2410c; }
.verdict.seq .status { background: #7c3aed; }
.verdict p.lead { font-size: 18px; margin: 12px 0 6px; }
.recommend { background: #fff; border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 16px; margin: 12px 0; }
.recommend p.do { font-size: 19px; font-weight: 700; margin: 4px 0; }
.muted { color: var(--muted); }
.version { color: #8a4b00; font-size: 15px; }
details summary { cursor: pointer; color: #1f5fa8; margin: 6px 0; }
p.files a { color: #1f5fa8; }
td { overflow-wrap: break-word; max-width: 36em; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 32px; }
table { border-collapse: collapse; font-size: 13.5px; margin: 10px 0 16px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 10px; text-align: right;
  vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
table.text td, table.text th { text-align: left; }
.table-wrap { overflow-x: auto; max-width: 100%; }
img { max-width: 100%; height: auto; display: block; margin: 12px 0; }
pre { background: var(--panel); padding: 10px 12px; border-radius: 4px; overflow-x: auto;
  font-size: 13px; line-height: 1.4; }
pre.error { background: #fdecec; color: #8a1c1c; }
.yes { color: #b45309; font-weight: 700; }
.no { color: #4b5563; }
nav.toc { font-size: 15px; color: var(--muted); }
nav.toc a { color: #1f5fa8; margin-right: 14px; text-decoration: none; }
footer { margin-top: 48px; color: var(--muted); font-size: 13px; border-top: 1px solid var(--line);
  padding-top: 10px; }
code { font-size: 90%; background: var(--panel); padding: 0 3px; border-radius: 3px; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


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


def _rows(rows: Iterable[tuple[str, str]], css: str = "") -> str:
    # The values are text: a run's name (a bench result's label, a folder) is the user's.
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    cls = f' class="{css}"' if css else ""
    return f'<div class="table-wrap"><table{cls}>{body}</table></div>'


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


def recommendation_html(rec: dict[str, Any] | None) -> str:
    """The first thing on the page: the change to make, then (folded) the runner-up, the
    remedies that had no effect or broke the latency limits, and those not run (with why)."""
    if not rec or not rec.get("text"):
        return ""
    folded = ""
    rows = []
    op = next((r.get("operating_concurrency") for r in rec.get("ranked") or []
               if r.get("operating_concurrency") is not None), None)
    for label, items in (("runner-up", (rec.get("ranked") or [])[1:2]),
                         ("also gains", (rec.get("ranked") or [])[2:]),
                         ("over the latency limits", rec.get("over_limits") or []),
                         ("no effect", rec.get("no_effect") or [])):
        for r in items:
            why = "; ".join(r.get("breaks") or []) or label
            rows.append(f"<tr><td><code>{_e(r['parameter'])}</code> {_e(r.get('from'))} → "
                        f"{_e(r['value'])}</td>"
                        f"<td>{_e(_gain_cell(r.get('gain_pct'), r.get('gain_range_pct')))}</td>"
                        + (f"<td>{_e(_gain_cell(r.get('operating_gain_pct'), r.get('operating_gain_range_pct')))}</td>"
                           if op is not None else "")
                        + f"<td>{_e(signed_pct(r.get('ttft_p95_change_pct')))}</td>"
                        f"<td>{_e(signed_pct(r.get('itl_p95_change_pct')))}</td><td>{_e(why)}</td>"
                        "</tr>")
    for r in rec.get("not_run") or []:
        blank = "<td>not run</td>" * (4 if op is not None else 3)
        rows.append(f"<tr><td><code>{_e(r['parameter'])}</code> {_e(r.get('from'))} → "
                    f"{_e(r['value'])}</td>{blank}<td>{_e(r.get('why') or 'not run')}</td></tr>")
    if rows:
        c = rec.get("concurrency")
        folded = (
            f"<details><summary>Other remedies tried ({len(rows)}), under the limits: "
            f"{_e(rec.get('limits', ''))}</summary><div class='table-wrap'><table class='text'>"
            f"<tr><th>change</th><th>output throughput at concurrency {_e(num(c) if c else '?')}"
            "</th>" + (f"<th>at concurrency {_e(num(op))} (today's operating limit)</th>"
                       if op is not None else "")
            + "<th>TTFT p95</th><th>ITL p95</th><th>why not first</th></tr>"
            f"{''.join(rows)}</table></div></details>")
    note = ""
    if rec.get("source") == "twin" and rec.get("twin_fit"):
        # The fit before the prediction: how far the twin's numbers can be trusted.
        note = (f"<p class='muted'>The twin of the measured server, fitted to its curve: "
                f"{_e(rec['twin_fit'])} (the fit, level by level, in stage 06; every remedy it "
                "predicted, with its interval, in <a href='twin/twin.md'>twin/twin.md</a>).</p>")
        return (f'<div id="recommendation" class="recommend">{note}'
                f'<p class="do">{_e(rec["text"])}</p>{folded}</div>')
    if rec.get("source") == "symptoms" and rec.get("why_not_simulated"):
        note = (f"<p class='muted'>Not simulated ({_e(rec['why_not_simulated'])}): chosen from "
                "the symptoms below.</p>")
    return (f'<div id="recommendation" class="recommend"><p class="do">{_e(rec["text"])}</p>'
            f"{note}{folded}</div>")


def links_html() -> str:
    """The run folder's files, linked (the page sits in the run folder)."""
    files = ((RECORD_YAML, "the record"), ("runs.csv", "one row per level and seed"),
             ("series.csv", "the focus level's metrics over time"),
             (f"{NOTEBOOKS_DIR}/", "the executed notebooks"))
    return ("<p class='files'>Files: " + " · ".join(
        f"<a href='{_e(name)}'>{_e(name)}</a> ({_e(what)})" for name, what in files) + "</p>")


def _reason(text: str) -> str:
    """A status rule as a sentence: without its rule number."""
    text = re.sub(r"^\s*\d+\s*:\s*", "", text)
    finding = re.match(r"^([a-z ]+): (.+)$", text)
    if finding and "interference" in finding.group(1):  # a finding beside the status
        return f"Also present: {finding.group(1)} ({finding.group(2)})."
    return text[:1].upper() + text[1:]


def verdict_html(record: Record, headline: str = "", verdict: VerdictResult | None = None
                 ) -> str:
    """The first screen: status, the recommendation, the sentence that explains it, the
    headline figure (the curve with its knee), key numbers, evidence, remedies, and what the
    data could not give. ``verdict`` is stage 06's result (its recommendation and symptoms)."""
    s, c, w, p = record.scheduler, record.counters, record.workload, record.perf
    knee = p.knee
    kind = "kv" if record.status == STATUS_KV_BOUND else (
        "open" if record.status == STATUS_NOT_ESTABLISHED else "seq")
    lead = to_html(lead_sentence(record))
    from kvpressure import VLLM_BEHAVIOUR_VERSION

    warning = version_warning(record.provenance.vllm_version_served, VLLM_BEHAVIOUR_VERSION)
    version = f"<p class='version'>{to_html(warning)}</p>" if warning else ""
    ratio = recompute_ratio_text(c.recompute_ratio, *(c.recompute_ratio_range or (None, None)),
                                 exact=c.recompute_exact)

    def one(v: float | None) -> str:
        return _or(v, lambda x: f"{x:.1f}")

    window = f"{_or(w.concurrency, str, 'unknown')} ({c.window.run}, {window_text(c.window)})"
    numbers = [
        ("knee / peak concurrency",
         NO_DATA + " (too few levels)" if knee is None else
         f"{'none' if knee.knee_x is None else num(knee.knee_x)} / {num(knee.peak_x)}"),
        ("peak output throughput", NO_DATA if knee is None else f"{num(knee.peak_y)} tok/s"),
        ("decline after the peak", NO_DATA if knee is None else
         f"{knee.decline_pct:.1f}%" + ("" if knee.declines else " (within noise)")),
        ("counters read at concurrency", window),
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
    missing = "".join(f"<tr><td><code>{_e(k)}</code></td><td>{_e(v)}</td></tr>"
                      for k, v in record.missing.items())
    missing_html = (
        "<h3>Not measured</h3><p>These fields of the record are null: the data given could not "
        "measure them (a missing value is never read as zero).</p><div class='table-wrap'>"
        f"<table class='text'><tr><th>field</th><th>why</th></tr>{missing}</table></div>"
        if missing else "")
    symptoms = [x.model_dump() for x in verdict.symptoms.symptoms] if verdict else []
    seen = [symptom_sentence(symptoms[i], s.max_num_seqs) if i < len(symptoms) else ch.observed
            for i, ch in enumerate(record.evidence.checks)]
    checks = "".join(
        f"<tr><td>{_e(ch.name)}</td><td class='{'yes' if ch.holds else 'no'}'>"
        f"{_holds(ch)}</td><td>{_e(text)}</td>"
        f"<td><code>{_e(ch.metric)}</code></td></tr>"
        for ch, text in zip(record.evidence.checks, seen, strict=True)
    )
    comparison = record.evidence.comparison
    comp_html = (f"<p>{_e(comparison.summary)} <em>Noise: {_e(comparison.noise)}.</em></p>"
                 if comparison else "")
    reasons = "".join(f"<li>{_e(_reason(r))}</li>" for r in record.evidence.reasons)
    remedies = "".join(
        f"<tr><td><code>{_e(r.parameter)}</code></td><td>{_e(r.change)}</td>"
        f"<td>{_e(r.effect)}</td><td>{_e(r.cost)}</td></tr>"
        for r in record.remedies
    )
    remedies_html = (
        "<details><summary>Every remedy, in the workflow's order, with its cost</summary>"
        "<div class='table-wrap'><table class='text'><tr><th>parameter</th><th>change</th>"
        f"<th>effect</th><th>cost</th></tr>{remedies}</table></div></details>"
        if remedies else ""
    )
    return (
        f'<section id="verdict" class="verdict {kind}">'
        f'<span class="status">{_e(record.status)}</span>'
        f"{recommendation_html(verdict.remedies.recommendation if verdict else None)}"
        f'<p class="lead">{lead}</p>{version}{headline}{comp_html}<ul>{reasons}</ul>'
        f"{links_html()}"
        "</section>"
        f"<h3>Key numbers</h3>{_rows(numbers)}"
        "<h3>Symptom checklist</h3><div class='table-wrap'><table class='text'>"
        "<tr><th>symptom</th><th>holds</th><th>what was seen</th><th>metric</th></tr>"
        f"{checks}</table></div>{remedies_html}{missing_html}"
    )


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
    from kvpressure import VLLM_BEHAVIOUR_VERSION, __version__

    toc = " ".join(f'<a href="#{_e(n)}">{_e(_title(nb, n))}</a>' for n, nb in notebooks)
    sections = "\n".join(
        f'<section id="{_e(name)}">{notebook_html(nb)}</section>' for name, nb in notebooks
    )
    prov = record.provenance
    inputs = ", ".join(f"{_e(i.path)} (sha256 {i.sha256[:12]}…)" for i in prov.inputs)
    seed = "" if prov.seed is None else f"; seed {prov.seed}"
    if prov.seeds is not None and len(prov.seeds) > 1:
        more = ", ".join(map(str, prov.seeds[1:]))
        seed += f" (and {more} for the run-to-run noise)"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} — kvpressure</title><style>{CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="subtitle">{_e(record.workload.model_name)} · policy '
        f"{_e(_or(record.scheduler.policy, str, 'unknown'))} · {_pool(record)} · "
        f"{_e(prov.mode)} data"
        + (f" · served by vLLM {_e(prov.vllm_version_served)}" if prov.vllm_version_served
           else "")
        + (f" · run folder {_e(run_folder)}" if run_folder else "")
        + "</p>"
        f"{verdict_html(record, headline_figure(notebooks), verdict)}"
        f'<nav class="toc">Stages: {toc}</nav>\n{sections}'
        f"<footer>kvpressure {_e(__version__)} (vLLM {_e(VLLM_BEHAVIOUR_VERSION)}'s scheduler "
        "rules" + (f"; the data's server: vLLM {_e(prov.vllm_version_served)}"
                   if prov.vllm_version_served else "") + ") · "
        f"inputs: {inputs}{_e(seed)} · record: {RECORD_YAML} · executed notebooks: "
        f"{NOTEBOOKS_DIR}/</footer></main></body></html>\n"
    )


def render_report(run_dir: str | os.PathLike[str], title: str | None = None,
                  run_folder: str | None = None) -> Path:
    """Write ``run_dir/index.html`` from ``record.yaml`` and ``notebooks/*.ipynb``."""
    import nbformat

    from kvpressure.record.io import load_record

    run_dir = Path(run_dir)
    record = load_record(run_dir / RECORD_YAML)
    notebooks = []
    for name in NOTEBOOKS:
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
    from kvpressure.pipeline.run_folder import display_path

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
