"""The report's sentences: one home for every sentence the page, the terminal and the notebooks
say about a number, so each number is worded (and rounded) once.

Sentences are Markdown with ``**bold**`` only: the notebooks show them as they are, the page
turns them into HTML (:func:`to_html`) and the terminal drops the marks (:func:`to_plain`).
Every number carries its unit and, where the page shows the same quantity from more than one
measurement, the window it comes from (:func:`focus_label`, :func:`runs_label`).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kvpressure.jsonable import finite_or_none as finite
from kvpressure.stages.results import LatencyKnee
from kvpressure.words import NO_DATA, LevelWords, level_words, num


# --------------------------------------------------------------------------- numbers
def count(value: Any) -> str:
    """A count (preemptions, tokens, requests): an integer with separators, even when it is a
    mean over seeds (620.3 preemptions reads as noise)."""
    f = finite(value)
    return NO_DATA if f is None else f"{round(f):,}"


def ms(seconds: Any) -> str:
    """A latency in ms below 10 s, in s above."""
    f = finite(seconds)
    if f is None:
        return NO_DATA
    return f"{f:,.1f} s" if f >= 10 else f"{f * 1000:,.1f} ms"


def pct(value: Any, digits: int = 1) -> str:
    """A fraction as a percentage."""
    f = finite(value)
    return NO_DATA if f is None else f"{f:.{digits}%}"


def signed_pct(value: Any) -> str:
    """A change in percent, with its sign."""
    f = finite(value)
    return NO_DATA if f is None else f"{f:+.0f}%"


def levels_text(levels: Sequence[Any]) -> str:
    """``8, 16 and 24``."""
    words = [num(v) for v in levels]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def record_axis(record: Any) -> LevelWords:
    """The level words of a record (its ``workload.level_axis``)."""
    return level_words(getattr(record.workload, "level_axis", "concurrency"))


# --------------------------------------------------------------------------- markup
def to_html(text: str) -> str:
    """A sentence for the page: escaped, ``**bold**`` as ``<b>``, backticks as ``<code>``."""
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def to_plain(text: str) -> str:
    """A sentence for the terminal: the bold marks dropped."""
    return text.replace("**", "")


# --------------------------------------------------------------------------- windows
def focus_label(seed: int | None) -> str:
    """Where the record's counters come from, to tell them from the per-level means of the
    curve and the remedies: the focus window of the experiment's own seed."""
    return "in the focus window" + ("" if seed is None else f", seed {seed}")


def runs_label(repeats: int) -> str:
    """Which measurement a runs-table number is: each run whole, averaged over the repeats
    (:mod:`kvpressure.analysis.levels`), unlike the focus window's counters of seed 0."""
    return f"whole runs, mean of {repeats} seeds" if repeats > 1 else "whole run"


def window_span(start_s: float, end_s: float) -> str:
    """A window in seconds from the start of the load."""
    return f"{start_s:,.0f}–{end_s:,.0f} s"


# --------------------------------------------------------------------------- recompute
def recompute_ratio_text(ratio: Any, low: Any = None, high: Any = None, exact: bool = True
                         ) -> str:
    """The recompute ratio as far as it is known: the exact share when the steps were counted,
    the estimated range when only counters were (never the range's end alone as if measured)."""
    r, lo, hi = finite(ratio), finite(low), finite(high)
    if exact or lo is None or hi is None:
        return NO_DATA if r is None else pct(r)
    if math.isclose(lo, hi, abs_tol=5e-4):
        return f"{pct(lo)} (estimated from counters)"
    return f"between {pct(lo)} and {pct(hi)} (estimated from counters)"


# --------------------------------------------------------------------------- knee
def _attr(knee: Any, key: str) -> Any:
    return knee.get(key) if isinstance(knee, Mapping) else getattr(knee, key, None)


def same_schedule_sentence(levels: Sequence[Any], same_from: Any) -> str:
    """Why levels from ``same_from`` on give the same numbers: the queue never empties."""
    same = [c for c in levels if finite(c) is not None and float(c) >= float(same_from)]
    if len(same) < 2:
        return ""
    return (f"Levels {levels_text(same)} give the same schedule (the same throughput, "
            f"preemptions and inter-token latency): from {num(same_from)} clients on the waiting "
            "queue never empties, so the scheduler sees the same requests in the same order "
            "whatever the client count, and more clients only add time queued before admission "
            "(TTFT).")


def knee_sentence(knee: Any, last: float, axis: str = "concurrency") -> str:
    """Where growth slows, where it peaks, what follows, and which of them is the operating
    limit (the number to size the client's concurrency or ``max_num_seqs`` by, or the offered
    load to admit on a request-rate sweep)."""
    w = level_words(axis)
    knee_x, peak_x, peak_y = _attr(knee, "knee_x"), _attr(knee, "peak_x"), _attr(knee, "peak_y")
    decline_pct = _attr(knee, "decline_pct") or 0.0
    same_from = _attr(knee, "same_schedule_from")
    peak = f"peaks at **{num(peak_y)} tok/s** at {w.at(peak_x, bold=True)}"
    slows = ("" if knee_x is None or knee_x >= peak_x
             else f"growth slows from {w.at(knee_x, bold=True)}, ")
    if knee_x is None:
        return (f"Output throughput is still rising at the largest level: it {peak}; no knee "
                "inside the range, so the operating limit lies beyond it.")
    if _attr(knee, "declines"):
        by = (f"falls {decline_pct:.0f}% at {num(same_from)} and stays there up to "
              f"{num(last)}" if same_from is not None and same_from < last
              else f"falls {decline_pct:.0f}% by {num(last)}")
        return (f"Output throughput: {slows}{peak}, then {by}. **The operating limit is "
                f"{w.at(peak_x)}**: past it {w.more} {w.lowers} throughput"
                + (f"; from {num(knee_x)} on {'they' if w.lowers == 'lower' else 'it'} mostly "
                   f"add{'' if w.lowers == 'lower' else 's'} waiting time." if slows else "."))
    flat = ("then stays flat" if decline_pct < 1 else
            f"then is {decline_pct:.0f}% lower by {num(last)}, a change within the noise")
    return (f"Output throughput: {slows}{peak}, {flat}. **The operating limit is "
            f"{w.at(knee_x)}** (the knee): beyond it {w.more} add"
            f"{'' if w.lowers == 'lower' else 's'} waiting time, not throughput.")


# --------------------------------------------------------------------------- symptoms
def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def symptom_sentence(symptom: Mapping[str, Any], max_num_seqs: Any = None,
                     max_num_seqs_assumed: bool = False, axis: str = "concurrency") -> str:
    """What was seen for one symptom, in words (its evidence as numbers a reader can check)."""
    ev = symptom.get("evidence") or {}
    sid, verdict = symptom.get("id"), symptom.get("verdict")
    if verdict == "no data":
        return f"no data: {ev.get('missing') or 'not measured'}"
    try:
        if sid == "curve_falls":
            fall = f"falls {ev['decline_pct']:.0f}% after it" if verdict == "present" else (
                f"changes by {-ev['decline_pct']:.0f}% after it, within the noise")
            return (f"throughput peaks at {num(ev['peak_y'])} tok/s at "
                    f"{level_words(axis).at(ev['peak_x'])} and {fall}")
        if sid == "waiting_persists":
            cap = finite(ev.get("frac_capacity"))
            return (f"requests waited {ev['frac_waiting']:.0%} of the time, "
                    f"{ev['mean_waiting']:.0f} on average and at most {ev['max_waiting']:.0f}"
                    + (f"; for KV space {100 * cap:.0f}% of the time" if cap is not None else ""))
        if sid == "running_below_max_num_seqs":
            limit = ""
            if max_num_seqs:
                limit = (f" of {max_num_seqs} allowed (vLLM's default, assumed)"
                         if max_num_seqs_assumed else f" of {max_num_seqs} allowed")
            return (f"requests waited for KV space {ev['frac_silent']:.0%} of the time while "
                    f"{ev['mean_running']:.0f}{limit} sequences ran (at most "
                    f"{ev['max_running']:.0f})")
        if sid == "kv_usage_near_full":
            return (f"the KV cache was {ev['mean_kv_usage']:.0%} full on average and near full "
                    f"{ev['frac_near_full']:.0%} of the time")
        if sid == "preemption_recompute":
            tokens = finite(ev.get("recomputed_tokens"))
            lo, hi = finite(ev.get("ratio_low")), finite(ev.get("ratio_high"))
            if lo is not None and hi is not None and not math.isclose(lo, hi, abs_tol=5e-3):
                share = (f"an estimated {lo:.0%} to {hi:.0%} of the processed tokens were "
                         "computed a second time")
                tokens = None  # a point count would claim more than the range knows
            else:
                share = (f"{ev['recompute_ratio']:.0%} of the processed tokens were computed "
                         "a second time")
            return (f"{count(ev['preemptions'])} preemptions; {share}"
                    + (f" ({count(tokens)} tokens)" if tokens is not None else ""))
        if sid == "itl_jitter":
            return (f"the spread of inter-token latency grows {ev['spread_growth']:.1f}x from "
                    "the lowest to the highest level" + ("" if verdict == "present" else
                                                         ", below the threshold"))
    except (KeyError, TypeError, ValueError):
        pass
    shown = {k: v for k, v in ev.items() if not isinstance(v, dict | list)}
    return ", ".join(f"{k.replace('_', ' ')} {_short(v)}" for k, v in list(shown.items())[:4])


# --------------------------------------------------------------------------- goodput
def goodput_sentence(gp: Any, ttft_limit_s: float | None, tpot_limit_s: float | None,
                     e2el_limit_s: float | None = None, axis: str = "concurrency") -> str:
    """The goodput table (``investigation.latency.goodput``) in one sentence: where it is highest,
    or that the data cannot judge the limits."""
    from kvpressure.analysis.limits import seconds

    given = [f"{name} ≤ {seconds(v)}" for name, v in (
        ("TTFT", ttft_limit_s), ("time per output token", tpot_limit_s),
        ("end-to-end latency", e2el_limit_s)) if v is not None]
    head = (f"**Goodput**: requests per second that meet {' and '.join(given)} "
            "(`vllm bench serve --goodput`)")
    col = "goodput (requests/s)"
    known = gp[gp[col].notna()] if len(gp) else gp
    if not len(known):
        return (head + ": not measured, the results give no latency per request to judge "
                "the limits on (for time per output token: neither output lengths nor token "
                "gaps per request).")
    best = known.loc[known[col].idxmax()]
    w = level_words(axis)
    return (head + f"; highest at {w.at(best[axis], bold=True)}, "
            f"{best[col]:.2f} requests/s ({best['within limits']:.0%} of its requests within "
            f"{'both limits' if len(given) == 2 else 'the limits'}). TTFT counts from the "
            f"request's arrival, so at {'high concurrency' if axis == 'concurrency' else 'a high request rate'} "  # noqa: E501
            "it is mostly time queued for admission, not prefill.")


# --------------------------------------------------------------------------- the lead
# Times past this are Unix epoch seconds (ingested data keeps the server's clock); smaller ones
# count from the start of a simulated load.
EPOCH_S = 1e8


def clock(t: float) -> str:
    """An epoch time as the wall clock (UTC)."""
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S UTC")


def span_text(start_s: float, end_s: float) -> str:
    """A window: the wall clock for ingested data (with its length), seconds from the start of
    the load for a simulation."""
    if start_s > EPOCH_S:
        return (f"{clock(start_s).removesuffix(' UTC')}–{clock(end_s)}, "
                f"{end_s - start_s:,.0f} s")
    return window_span(start_s, end_s)


def window_text(window: Any) -> str:
    """The record's counter window in words: which run, when, and the gauges' steady part."""
    if window.snapshot:
        return (f"one scrape at {span_text(window.end_s, window.end_s).split(',')[0]}: gauges "
                "then, counters since the server started")
    span = span_text(window.start_s, window.end_s)
    if (window.gauges_start_s, window.gauges_end_s) != (window.start_s, window.end_s):
        span += ("; gauges over the steady load "
                 f"{span_text(window.gauges_start_s, window.gauges_end_s)}")
    return span


def lead_sentence(record: Any, max_num_seqs_note: str = "") -> str:
    """The verdict box's paragraph: the curve in one sentence, then the engine's state at the
    focus level with the window it was read over."""
    s, c, w, p = record.scheduler, record.counters, record.workload, record.perf
    knee = p.knee
    words = record_axis(record)
    rates = words.axis == "request_rate"
    parts = []
    if knee is not None:
        levels = (w.request_rates if rates else w.concurrency_levels) or [knee.peak_x]
        parts.append(knee_sentence(knee, max(levels), words.axis))
        if getattr(knee, "same_schedule_from", None) is not None and not rates:
            parts.append(same_schedule_sentence(levels, knee.same_schedule_from))
    elif rates and p.throughput_by_request_rate:
        pt = p.throughput_by_request_rate[-1]
        parts.append(f"One load level measured: **{num(pt.output_throughput)} tok/s** at "
                     f"{words.at(pt.request_rate)} (no curve, so no knee).")
    elif p.throughput_by_concurrency:
        pt = p.throughput_by_concurrency[-1]
        parts.append(f"One load level measured: **{num(pt.output_throughput)} tok/s** at "
                     f"concurrency {pt.concurrency} (no curve, so no knee).")
    else:
        parts.append("One load of unknown concurrency measured (no curve, so no knee).")
    where = focus_label(record.provenance.seed).removeprefix("in the ")
    level = w.request_rate if rates else w.concurrency
    at = (f"At {words.at(level)} ({where}, {window_text(c.window)})"
          if level is not None else f"Over the window ({window_text(c.window)})")
    if c.kv_cache_usage_perc is None and c.num_requests_running is None:
        parts.append(f"{at}, the engine's own metrics were not measured (running, waiting, KV "
                     "usage, preemptions: no data), so the cause of the curve's shape is open.")
        return " ".join(parts)
    mns = (f"max_num_seqs {s.max_num_seqs}" if s.max_num_seqs is not None
           else "an unknown max_num_seqs")

    def one(v: Any) -> str:
        return NO_DATA if finite(v) is None else f"{v:.1f}"

    low, high = c.recompute_ratio_range or (None, None)
    ratio = recompute_ratio_text(c.recompute_ratio, low, high, exact=c.recompute_exact)
    parts.append(
        f"{at}, {one(c.num_requests_running)} sequences run on average (at most "
        f"{num(s.max_num_seqs_effective)}) against {mns}{max_num_seqs_note}, "
        f"{one(c.num_requests_waiting)} wait, the KV cache is {pct(c.kv_cache_usage_perc, 0)} "
        f"full, {count(c.num_preemptions_total)} preemptions, and "
        + ("the recompute ratio is not measured." if ratio == NO_DATA else
           f"{ratio} of the processed tokens are recomputed." if c.recompute_exact else
           f"{ratio.removesuffix(' (estimated from counters)')} of the processed tokens are "
           "recomputed (estimated from the counters)."))
    return " ".join(parts)


# --------------------------------------------------------------------------- stage 03
def knee_stage_sentences(res: Any) -> list[str]:
    """Stage 03's reading of its curve (``stages.results.KneeResult``): the peak, the knee, the
    sustained range and the fall, the latencies at the focus level, the noise, then its notes."""

    def lat(seconds: Any) -> str:
        return "not measured" if finite(seconds) is None else f"{1000 * seconds:.0f} ms"

    w = level_words(res.x)
    focus = res.focus_request_rate if res.x == "request_rate" else res.focus_concurrency
    at = (f"At the focus {w.at(focus)}" if focus is not None else "Over the measured load")
    tail = (f"{lat(res.itl_p95_s)} p95" if res.itl_p99_s is None  # p99 where p95 was not measured
            else f"{lat(res.itl_p99_s)} p99; {res.itl_tail_note}")
    latency = (f"{at}, ITL is {lat(res.itl_mean_s)} on average ({tail}) and TTFT p95 is "
               + ("not measured." if res.ttft_p95_s is None else f"{ms(res.ttft_p95_s)}."))
    k = res.knee
    if k is None:
        how = ("(e.g. `vllm bench serve --request-rate R` for each R)" if res.x == "request_rate"
               else "(e.g. `vllm bench serve --max-concurrency C` for each C)")
        return [f"**No curve, no knee**: {res.why_not}. Measure the same workload at several "
                f"{w.plural} {how} to locate it. " + latency]
    levels = [p.level(res.x) for p in res.curve]
    last = max(levels) if levels else k.peak_x
    knee_txt = ("still rising at the largest level: no knee inside the range"
                if k.knee_x is None else f"the knee is at {w.at(k.knee_x, bold=True)}")
    if k.decline_onset is not None:
        held = (f"it holds within {k.plateau_band:.0f} tok/s of the peak up to "
                f"{w.at(k.sustained_end)} and has turned down from {num(k.decline_onset)}")
    else:
        held = (f"it holds within {k.plateau_band:.0f} tok/s of the peak up to the largest "
                f"level, {num(last)}: no turn inside the range")
    same_from = k.same_schedule_from
    if k.declines:
        fall = f"past the peak it **falls {k.decline_pct:.0f}%**"
    else:
        fall = f"past the peak it changes by {-k.decline_pct:.0f}%, within the noise"
    noise = (f"Noise: {k.noise_sd:.1f} tok/s per run ({k.noise_source})."
             if k.noise_sd is not None else f"Noise: {k.noise_source}.")
    out = [f"Throughput peaks at **{num(k.peak_y)} tok/s** at {w.at(k.peak_x)}; "
           f"{knee_txt}; {held}; {fall}. {latency} {noise}"]
    if same_from is not None and res.x != "request_rate":
        out.append(same_schedule_sentence(levels, same_from))
    if res.latency_knees:
        out.append(latency_knee_sentence(res.latency_knees, last))
    out += [f"Note: {note}." for note in k.notes]
    return out


_LATENCY_NAMES = {"ttft_p95_s": "TTFT p95", "itl_p95_s": "ITL p95"}


def latency_knee_sentence(knees: Mapping[str, LatencyKnee | None], last: Any) -> str:
    """Where each latency turns up against offered load (``analysis.knee.latency_knee``)."""
    words = level_words("request_rate")
    parts = []
    for col, k in knees.items():
        if not k:
            continue
        name = _LATENCY_NAMES.get(col, col)
        band = f"{num(k.factor)}x its {ms(k.base)} at the lightest load"
        if k.turn_x is None:
            parts.append(f"{name} stays within {band} up to {words.at(last)}")
        elif k.knee_x is None:
            parts.append(f"{name} is past {band} from the second level on")
        else:
            parts.append(f"{name} holds within {band} up to {words.at(k.knee_x, bold=True)} "
                         f"and is past it from {words.at(k.turn_x)}")
    if not parts:
        return ""
    return ("**Latency against offered load**: " + "; ".join(parts) + ". Past the latency "
            "knee requests queue for admission: more load arrives than the server drains.")


# --------------------------------------------------------------------------- stage 01
def collect_sentence(info: Any, points: int, runs: int) -> str:
    """What stage 01 collected (``stages.results.CollectInfo``): the points, levels and
    variants, the pool, the seeds, what matched, incomplete levels, and where the counters are
    read."""
    focus, s = info.focus, info.settings
    seeds = info.seeds or []
    words = level_words(info.level_axis)
    if info.level_axis == "request_rate":
        cap = (f", at most {info.max_concurrency} requests in flight"
               if info.max_concurrency else ", open loop")
        levels = (f"{len(info.request_rates)} request rate(s) "
                  f"({', '.join(num(r) for r in info.request_rates)} req/s{cap})")
    else:
        levels = (f"{len(info.concurrency_levels)} concurrency level(s) "
                  f"({', '.join(map(str, info.concurrency_levels))})" if info.concurrency_levels
                  else "a load of unknown concurrency")

    def setting(key: str) -> str:
        return "unknown" if s.get(key) is None else num(s[key])

    text = (f"**{info.name}** ({info.mode}): {points} point(s), {levels} for the variants "
            f"{', '.join(info.variants)}; model {info.model_name}, "
            f"{setting('num_gpu_blocks')} KV blocks of {setting('block_size')} tokens, "
            f"max_num_seqs {setting('max_num_seqs')}. ")
    if len(seeds) > 1:
        text += (f"Every point also ran with {len(seeds) - 1} more workload seeds "
                 f"({', '.join(map(str, seeds[1:]))}) for the run-to-run noise, {runs} runs in "
                 f"all; the table shows seed {seeds[0]}, each point over its whole run; the "
                 "curves later are means over the seeds. ")
    if info.matched:
        text += f"Data: {info.matched}. "
    for lv in info.incomplete_levels:
        text += (f"**Level {lv.concurrency} was not measured in full** ({lv.reason}; "
                 f"{lv.completed} requests completed, `{lv.source}`): it is left off the "
                 "curve. ")
    if not info.engine_metrics:
        text += ("**No engine metrics were given**: running, waiting, KV usage and preemptions "
                 "are not measured (missing, not zero), so the later stages can draw the curve "
                 "but not its cause. ")
    at = (words.at(focus.level, bold=True) if focus.level is not None
          else f"{words.singular} **unknown**")
    text += (f"The counters are read at {at} "
             f"({focus.why}), over {span_text(focus.t0, focus.t1)} of run `{focus.run}`. ")
    text += " ".join(n[0].upper() + n[1:] + "." for n in info.load.notes)
    if info.load.idle:
        text += " **No load in the data**: nothing ran or waited while the server was scraped."
    return text


# --------------------------------------------------------------------------- stage 02
def recompute_stage_sentence(r: Any, seed: int | None) -> str:
    """Stage 02's preemptions and recompute in the focus window
    (``stages.results.RecomputeResult``): exact counts, or the estimated range."""
    where = focus_label(seed).capitalize()
    if r.preemptions is None:
        return (f"{where}, preemptions are **not measured** (the server does not export "
                "`vllm:num_preemptions_total`), so recomputed tokens cannot be sized.")
    if r.recompute_ratio is None:
        return (f"{where}, **{count(r.preemptions)}** preemptions; the token counters needed to "
                "size the recomputed tokens are missing.")
    share = finite(r.recompute_time_share)
    time = f"; recomputed tokens took {share:.0%} of the step time." if share is not None else "."
    if r.exact:
        return (f"{where}, **{count(r.preemptions)}** preemptions; "
                f"**{count(r.recomputed_tokens)}** tokens were computed again, a recompute ratio "
                f"of **{pct(r.recompute_ratio)}** (counted exactly, step by step){time}")
    tokens = (f"{count(r.recomputed_tokens_low)} to {count(r.recomputed_tokens_high)}"
              if r.recomputed_tokens_low is not None and r.recomputed_tokens_high is not None
              else count(r.recomputed_tokens))
    return (f"{where}, **{count(r.preemptions)}** preemptions; an estimated **{tokens}** tokens "
            "were computed again, a recompute ratio of **"
            + recompute_ratio_text(r.recompute_ratio, r.recompute_ratio_low,
                                   r.recompute_ratio_high, exact=False)
              .replace(" (estimated from counters)", "")
            + "** (estimated from the counters; the exact share needs the server's per-step "
              f"log, `--enable-logging-iteration-details`){time}")


# --------------------------------------------------------------------------- stage 06
def record_sentence(record: Any, path: Any) -> str:
    """Where the record was written and what it holds; a simulation's fields are simulated,
    never "measured"."""
    if record.missing:
        filled = (f"{len(record.missing)} fields not measured (null, with the reason, never "
                  "zero).")
    elif record.provenance.mode == "simulation":
        filled = "every field simulated (none missing)."
    else:
        filled = "every field measured."
    return (f"The record is written to [`record.yaml`](../record.yaml) (`{path}`), validated "
            f"against its schema: status **{record.status}**, {len(record.evidence.checks)} "
            f"symptom checks, {len(record.remedies)} remedies, {filled} `kvpressure analyse` "
            "writes the same file without Jupyter.")


# --------------------------------------------------------------------------- versions
def version_warning(served: str | None, rules: str) -> str:
    """What a reader must know when the data's server ran another vLLM than the one whose
    scheduler rules the kit follows (empty when they agree or the data does not say)."""
    if not served or served.split("+")[0] == rules:
        return ""
    return (f"The data comes from a vLLM {served} server; the kit's scheduler "
            f"rules, which the twin and every what-if follow, are vLLM {rules}'s. Admission and "
            "preemption rules change between releases: check them against that version's own "
            f"scheduler with `kvpressure verify-vllm --vllm-python PATH` (PATH: the python of "
            f"an environment with vLLM {served}).")


# The benchmark's metric names (``profiles.fidelity.METRICS``); not the knee columns above.
_FIDELITY_NAMES = {"ttft_mean": "TTFT mean", "ttft_p99": "TTFT p99", "itl_mean": "ITL",
                  "e2e_mean": "E2E mean", "e2e_p99": "E2E p99"}


def latency_fidelity_sentence(f: Mapping[str, Any]) -> str:
    """How far a simulated report's latencies can be read (``profiles.fidelity``): the card's
    own errors against real servers, or that none were checked and what the checked cards
    gave."""
    where = "benchmarks/bench_sim_to_real.py"
    if f["checked"]:
        errors = ", ".join(f"{name} {f['mape_pct'][m]:.1f}%" for m, name in _FIDELITY_NAMES.items()
                           if m in f["mape_pct"])
        text = (f"Latencies are simulated on the {f['hardware']} profile. Against real vLLM "
                f"servers on that card, over {f['held_out_stages']} load stages of "
                f"{f['held_out_runs']} runs the profile was not fitted on ({where}), the mean "
                f"error was {errors}.")
        if not f["calibrated"]:
            text += (" No run on this card was used to fit its step costs; they are the "
                     "profile's published starting values.")
        return text + _tails_side(f, "those")
    cards = f["checked_cards"]
    if not cards:
        return (f"Latencies are simulated on the {f['hardware']} profile. They are roofline "
                "estimates: no real vLLM server was checked against the simulation.")
    spans = []
    for m, name in _FIDELITY_NAMES.items():
        vals = [c[m] for c in cards.values() if m in c]
        if vals:
            spans.append(f"{name} {min(vals):.1f}% to {max(vals):.1f}%")
    return (f"Latencies are simulated on the {f['hardware']} profile. They are roofline "
            "estimates: no real vLLM server on this card was checked against the simulation. "
            f"On the cards that were ({', '.join(sorted(cards))}), over the stages no value was "
            f"fitted on ({where}), the mean error per card was {', '.join(spans)}."
            + _tails_side(f, "their"))


# A tail is said to read low when the simulation fell below the real servers in at least this
# share of the stages counted: a mean absolute error alone reads as a band on both sides.
_MOSTLY_BELOW = 2 / 3


def _tails_side(f: Mapping[str, Any], whose: str) -> str:
    """The tails that came out below the real servers' in most stages (``tail_below_real`` of
    ``tail_stages``), or nothing when none did."""
    n, below = f.get("tail_stages", 0), f.get("tail_below_real", {})
    low = [(name, below[m]) for m, name in _FIDELITY_NAMES.items()
           if m in below and n and below[m] >= _MOSTLY_BELOW * n]
    if not low:
        return ""
    (first, k), rest = low[0], low[1:]
    counts = f"the simulated {first} was below the real servers' in {k} of {whose} {n} stages"
    counts += "".join(f" and the {name} in {k2}" for name, k2 in rest)
    return (f" The tails read low: {counts} (the simulation has no step-to-step variation of "
            "a real server's steps and no warm-up of a fresh server), so take a simulated p99 "
            "as an optimistic one.")


# --------------------------------------------------------------------------- two run folders
def two_runs_markdown(result: Mapping[str, Any]) -> str:
    """``kvpressure compare``'s result (``analysis.two_runs.TwoRuns.to_dict()``) as Markdown:
    what changed, the knees and whether they moved beyond noise, then every level."""
    from kvpressure.analysis.compare import moved_right_words

    a, b = result["a"], result["b"]
    cur = {v["variant"]: v for v in result["knees"]["variants"]}
    shift = result["knees"]["shifts"][0]
    lines = [f"# {b} against {a}", ""]
    changed = result["settings_changed"] | result["versions_changed"]
    lines.append("**What differs**: " + ("; ".join(
        f"{k} {x} -> {y}" for k, (x, y) in changed.items())
        if changed else "no engine setting or version that both folders record") + ".")
    for name in ("A", "B"):
        v = cur[name]
        knee = "none in the range" if v["knee_x"] is None else f"{num(v['knee_x'])}"
        lines.append(f"- {name} ({a if name == 'A' else b}): knee {knee}, peak "
                     f"{num(v['peak_y'])} tok/s at {num(v['peak_x'])}, "
                     + (f"falls {v['decline_pct']:.0f}% past it" if v["declines"]
                        else "holds past the peak")
                     + f" (noise: {v['noise_source']})")
    by = shift.get("moved_right_by") or []
    lines.append("")
    lines.append(f"**The knee**: {num(shift['baseline_knee_x']) if shift['baseline_knee_x'] else 'none'}"
                 f" -> {num(shift['knee_x']) if shift['knee_x'] else 'none'}; "
                 + (("B's " + moved_right_words(by, past=True).removeprefix("the ")) if by
                    else "no move beyond the run-to-run noise") + ".")
    if result["status"][0] or result["status"][1]:
        lines.append(f"**Status**: {result['status'][0] or 'no record'} -> "
                     f"{result['status'][1] or 'no record'}.")
    lines += ["", "| concurrency | output tok/s A | B | change | preemptions A | B |",
              "|---|---|---|---|---|---|"]
    for r in result["levels"]:
        (ta, tb), (pa, pb) = r["output_throughput"], r["preemptions"]
        change = r.get("output_throughput_change_pct")
        said = ("" if change is None else
                (signed_pct(change) if r.get("beyond_noise") else "no measurable change"))
        # a table cell of a level one folder did not measure: a dash, not "no data"
        cells = [("-" if finite(v) is None else fmt(v))
                 for v, fmt in ((ta, num), (tb, num), (pa, count), (pb, count))]
        lines.append(f"| {num(r['concurrency'])} | {cells[0]} | {cells[1]} | {said} | "
                     f"{cells[2]} | {cells[3]} |")
    if result["notes"]:
        lines += [""] + [f"Note: {n}." for n in result["notes"]]
    return "\n".join(lines) + "\n"


def verification_sentence(level: Mapping[str, Any], setting: str) -> str:
    """A ``kvpressure verify-remedy`` level as the top box says it: the measured change with its
    interval next to the prediction, and whether the prediction held. Plain text: it ends the
    recommendation's own sentence, which the page prints as it is."""
    m, p = level.get("measured") or {}, level.get("predicted") or {}
    mean, pred = finite(m.get("mean_pct")), finite(p.get("change_pct"))
    lo, hi = (finite(x) for x in (m.get("interval_pct") or [None, None]))
    rounds = int(m.get("pairs") or 0)
    at = f"at concurrency {num(level.get('concurrency'))}, {rounds} paired rounds on the server"
    if mean is None or lo is None or hi is None or pred is None:
        return f"Not verified yet: {setting} measured over {rounds} round(s), too few for an interval."
    got = f"{mean:+.1f}% measured ({lo:+.1f}% to {hi:+.1f}%) vs {pred:+.1f}% predicted"
    if level.get("held"):
        if lo <= 0 <= hi:
            return f"Verified: no measurable effect, {got}, {at} ({setting})."
        return f"Verified: {got}, {at} ({setting})."
    return (f"The prediction did not hold: {got}, {at} ({setting}: "
            f"{level.get('why') or 'outside the interval'}).")
