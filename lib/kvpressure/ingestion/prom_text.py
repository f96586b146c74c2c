"""Prometheus text exposition -> columnar samples of one run.

Parsing is ``prometheus_client``'s (``text_string_to_metric_families``); it is slow (about 7 ms
for one 500-line vLLM scrape, ten minutes for a day of 1-second scrapes), so every distinct
series line is parsed by it once and remembered. Later scrapes repeat the same
``name{labels}`` head with a new value: a dictionary lookup on the head and ``float()`` on the
value is all they cost. A head never seen before, or a value ``float()`` refuses, goes back
through the real parser, which validates it and names the bad line.

Samples accumulate in typed arrays (series id, value) plus one timestamp per scrape, never a
Python object per sample, so memory grows with the number of samples (12 bytes each), not with
the size of the text.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from kvpressure.errors import InputError
from kvpressure.ingestion.labels import format_labels
from kvpressure.ingestion.names import TARGET_LABELS, NameInfo, canonical_name, unescape

SKIP = -1  # a series filtered out by ``families``
CREATED = -2  # a ``_created`` sample: remembered, not a series


@dataclass
class SeriesInfo:
    canonical: str
    family: str
    kind: str
    labels: dict[str, str]


@dataclass(frozen=True)
class _Template:
    """The line layout of a scrape: every line's text before its last space, and which
    lines carry the values of which series."""

    heads: tuple[str, ...]
    pick: Callable[[tuple[str, ...]], Any]
    sids: bytes
    n_samples: int
    n_kept: int


@dataclass
class ParseStats:
    scrapes: int = 0
    sample_lines: int = 0
    skipped_lines: int = 0
    duplicate_samples: int = 0
    explicit_timestamps: int = 0


def _parse_one(line: str) -> tuple[str, dict[str, str], float, float | None]:
    """One sample line through prometheus_client's parser."""
    families = list(text_string_to_metric_families(line + "\n"))
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1:
        raise ValueError("not a sample line")
    s = samples[0]
    ts = s.timestamp
    return s.name, dict(s.labels), float(s.value), None if ts is None else float(ts)


def _parse_comment(line: str) -> tuple[str, str | None, str | None]:
    """``# TYPE name type`` / ``# HELP ...`` / other comment, via prometheus_client."""
    parts = line.split(None, 3)
    if len(parts) >= 3 and parts[1] == "TYPE":
        families = list(text_string_to_metric_families(line + "\n"))
        if len(parts) < 4 or not families:
            raise ValueError("TYPE line without a type")
        # The parser reports a counter family without its ``_total``; we want the name as
        # written, samples are matched against it.
        return "TYPE", parts[2], families[0].type
    if len(parts) >= 3 and parts[1] == "HELP":
        return "HELP", parts[2], None
    return "COMMENT", None, None


def _series_end(line: str) -> int:
    """Index just past a sample line's name and label set (label values may hold spaces,
    braces and ``#``); -1 when the label set is not closed."""
    brace, space = line.find("{"), line.find(" ")
    if brace < 0 or 0 <= space < brace:
        return space
    i, quoted = brace + 1, False
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "}":
            return i + 1
        i += 1
    return -1


def openmetrics_as_prometheus(text: str) -> str:
    """OpenMetrics text in the Prometheus text format the parser reads: exemplars
    (``... 5 # {trace_id="a"} 1.0 1234.5``) dropped, timestamps from seconds to milliseconds,
    nothing after ``# EOF``. An exemplar's value or timestamp is never the sample's."""
    openmetrics = False
    out = []
    for line in text.split("\n"):
        if line.startswith("#"):
            if line.rstrip() == "# EOF":
                openmetrics = True
                break
            out.append(line)
            continue
        if "#" in line:
            end = _series_end(line)
            if end > 0:
                values = line[end:].split("#", 1)[0].split()
                line = line[:end] + " " + " ".join(values)
        out.append(line)
    if not openmetrics:
        return "\n".join(out)
    # OpenMetrics stamps samples in seconds, the Prometheus text format in milliseconds.
    for i, line in enumerate(out):
        if line and not line.startswith("#"):
            end = _series_end(line)
            values = line[end:].split() if end > 0 else []
            if len(values) == 2:
                try:
                    ms = float(values[1]) * 1000.0
                except ValueError:
                    continue
                out[i] = f"{line[:end]} {values[0]} {ms:.0f}"
    return "\n".join(out)


def needs_openmetrics_pass(text: str) -> bool:
    """Whether the text may hold exemplars or an ``# EOF`` (cheap test on the whole text)."""
    return "# {" in text or "# EOF" in text


def _short(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")


@dataclass
class RunSamples:
    """Everything read for one run, in columns, plus what the report needs to say about it."""

    run: str
    families: frozenset[str] | None = None  # canonical families to keep (None: all)
    keep_created: bool = False

    sids: array = field(default_factory=lambda: array("i"))
    values: array = field(default_factory=lambda: array("d"))
    scrape_t: array = field(default_factory=lambda: array("d"))
    scrape_end: array = field(default_factory=lambda: array("q"))  # row count after each scrape
    ts_override: dict[int, float] = field(default_factory=dict)

    series: list[SeriesInfo] = field(default_factory=list)
    declared: dict[str, str] = field(default_factory=dict)  # family as written -> TYPE
    seen_families: set[str] = field(default_factory=set)  # families (as written) with samples
    mapped: dict[str, str] = field(default_factory=dict)  # original spelling -> canonical
    created: dict[str, float] = field(default_factory=dict)  # canonical family -> first value
    filtered: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    stats: ParseStats = field(default_factory=ParseStats)

    def __post_init__(self) -> None:
        self._sid_of: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._head: dict[str, int] = {}
        self._head_ts: dict[str, int] = {}
        self._comments: dict[str, tuple[str, str | None, str | None]] = {}
        self._unsorted = False
        self._dups_possible = False
        self._nonfinite: dict[str, dict[str, int]] | None = None
        self._template: _Template | None = None

    # ------------------------------------------------------------------ registration
    def series_id(
        self, raw_name: str, labels: dict[str, str], family_type: str | None
    ) -> int:
        """The id of one series (registering it), or SKIP / CREATED."""
        info = canonical_name(raw_name, family_type)
        written_family = info.family
        self.seen_families.add(unescape(raw_name) if info.created else written_family)
        if info.created and not self.keep_created:
            return CREATED
        if info.created:
            info = NameInfo(unescape(raw_name), info.family, "gauge", None)
        assert info.canonical is not None
        if info.mapped_from is not None:
            self.mapped[info.mapped_from] = info.canonical
        if self.families is not None and info.family not in self.families:
            self.filtered.add(info.family)
            return SKIP
        key = (info.canonical, tuple(sorted(labels.items())))
        sid = self._sid_of.get(key)
        if sid is None:
            sid = len(self.series)
            self._sid_of[key] = sid
            self.series.append(SeriesInfo(info.canonical, info.family, info.kind, dict(labels)))
        return sid

    def add_points(self, sid: int, t: np.ndarray, values: np.ndarray) -> None:
        """A whole series of points (one row per point, each its own 'scrape')."""
        n = len(t)
        if n == 0:
            return
        start = len(self.sids)
        self.sids.extend(array("i", [sid]) * n)
        self.values.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self.scrape_t.frombytes(np.ascontiguousarray(t, dtype=np.float64).tobytes())
        self.scrape_end.frombytes(np.arange(start + 1, start + n + 1, dtype=np.int64).tobytes())
        self._unsorted = True  # series after series: the rows need sorting by time
        self._dups_possible = True

    # ------------------------------------------------------------------ text
    def add_text(self, text: str, t: float, where: str, first_line: int = 1) -> int:
        """Add one scrape (a whole exposition) taken at ``t``; return its sample count.

        ``where`` names the file (and JSONL line) for error messages; ``first_line`` is the
        line number of the text's first line in that file.
        """
        sids, values = self.sids, self.values
        start = len(sids)
        if needs_openmetrics_pass(text):
            text = openmetrics_as_prometheus(text)
        lines = text.split("\n")
        parts = list(map(str.rpartition, lines, repeat(" ")))
        n_lines = -1
        if self._template is not None and parts:
            heads, _, tails = zip(*parts, strict=True)
            n_lines = self._take_template(heads, tails)
        if n_lines < 0:
            try:
                n_lines = self._scan(lines, where, first_line)
            except BaseException:
                # Keep the columns consistent: a scrape is taken whole or not at all.
                del sids[start:]
                del values[start:]
                for row in [r for r in self.ts_override if r >= start]:
                    del self.ts_override[row]
                raise
            self._learn_template(lines, parts, start)
            if len(sids) - start and len(set(sids[start:])) != len(sids) - start:
                self._dups_possible = True

        if self.scrape_t and t < self.scrape_t[-1]:
            self._unsorted = True
        elif self.scrape_t and t == self.scrape_t[-1]:
            self._dups_possible = True
        self.scrape_t.append(t)
        self.scrape_end.append(len(sids))
        added = len(sids) - start
        st = self.stats
        st.scrapes += 1
        st.sample_lines += n_lines
        st.skipped_lines += n_lines - added
        return added

    def _take_template(self, heads: tuple[str, ...], tails: tuple[str, ...]) -> int:
        """Fast path: a scrape laid out line for line like the last one read the slow way
        (same comments, same series heads in the same order) only brings new values."""
        template = self._template
        assert template is not None
        if heads != template.heads:
            return -1
        if template.n_kept:
            try:
                vals = np.array(template.pick(tails), dtype=np.float64, ndmin=1)
            except ValueError:
                return -1  # the slow path names the bad line
            self.values.frombytes(vals.tobytes())
            self.sids.frombytes(template.sids)
        return template.n_samples

    def _learn_template(
        self, lines: list[str], parts: list[tuple[str, str, str]], start: int
    ) -> None:
        if any(r >= start for r in self.ts_override):
            self._template = None
            return
        kept: list[int] = []
        sids = array("i")
        n_samples = 0
        for i, line in enumerate(lines):
            if not line or line[0] == "#":
                continue
            n_samples += 1
            sid = self._head.get(parts[i][0])
            if sid is None:  # an odd line the slow path read differently: no template
                self._template = None
                return
            if sid >= 0:
                kept.append(i)
                sids.append(sid)
        self._template = _Template(
            heads=tuple(p[0] for p in parts),
            pick=operator.itemgetter(*kept) if kept else (lambda tails: ()),
            sids=sids.tobytes(),
            n_samples=n_samples,
            n_kept=len(kept),
        )

    def _scan(self, lines: list[str], where: str, first_line: int) -> int:
        sids_append, values_append = self.sids.append, self.values.append
        head_cache, comments = self._head, self._comments
        cur_family: str | None = None
        cur_type: str | None = None
        n_lines = 0
        for lineno, line in enumerate(lines, start=first_line):
            if not line:
                continue
            if line[0] == "#":
                c = comments.get(line)
                if c is None:
                    c = self._comment(line, where, lineno)
                if c[0] == "TYPE":
                    cur_family, cur_type = c[1], c[2]
                continue
            n_lines += 1
            head, _, tail = line.rpartition(" ")
            sid = head_cache.get(head)
            if sid is not None:
                if sid >= 0:
                    try:
                        values_append(float(tail))
                    except ValueError:
                        self._fail(where, lineno, line)
                    sids_append(sid)
                continue
            self._slow_line(line, head, tail, cur_family, cur_type, where, lineno)
        return n_lines

    def _comment(self, line: str, where: str, lineno: int) -> tuple[str, str | None, str | None]:
        try:
            c = _parse_comment(line)
        except Exception as exc:  # prometheus_client raises ValueError, sometimes others
            raise InputError(
                f"{where}: line {lineno}: not Prometheus text: {_short(line)} ({exc})"
            ) from None
        if c[0] == "TYPE":
            assert c[1] is not None and c[2] is not None
            self.declared.setdefault(c[1], c[2])
        self._comments[line] = c
        return c

    def _fail(self, where: str, lineno: int, line: str, exc: Exception | None = None) -> None:
        reason = f" ({exc})" if exc else ""
        raise InputError(f"{where}: line {lineno}: not Prometheus text: {_short(line)}{reason}")

    def _slow_line(
        self,
        line: str,
        head: str,
        tail: str,
        cur_family: str | None,
        cur_type: str | None,
        where: str,
        lineno: int,
    ) -> None:
        # A timestamped sample: the head ends with the value.
        head2, _, value_text = head.rpartition(" ")
        sid = self._head_ts.get(head2)
        ts: float | None
        if sid is not None:
            try:
                value, ts = float(value_text), float(tail) / 1000.0
            except ValueError:
                sid = None
            else:
                self._append_ts(sid, value, ts)
                return
        try:
            name, labels, value, ts = _parse_one(line)
        except Exception as exc:
            self._fail(where, lineno, line, exc)
            return
        family_type = None
        if cur_family is not None and (name == cur_family or name.startswith(cur_family + "_")):
            family_type = cur_type
        sid = self.series_id(name, labels, family_type)
        info = canonical_name(name, family_type)
        if info.kind == "counter" and not info.created and not value >= 0:
            # A counter counts up from 0: a negative or NaN one is a broken exporter or an
            # edited dump, and every increase and estimate made from it would be wrong.
            raise InputError(f"{where}: line {lineno}: counter {name} is {value:g}; a counter "
                             "is never negative or NaN")
        if info.created:
            self.created.setdefault(info.family, value)
        if ts is None:
            if _same_value(tail, value):
                self._head[head] = sid
            if sid >= 0:
                self.sids.append(sid)
                self.values.append(value)
        else:
            self._head_ts[head2] = sid
            self._append_ts(sid, value, ts)

    def _append_ts(self, sid: int, value: float, ts: float) -> None:
        if sid < 0:
            return
        self.ts_override[len(self.sids)] = ts
        self.sids.append(sid)
        self.values.append(value)
        self.stats.explicit_timestamps += 1

    # ------------------------------------------------------------------ results
    @property
    def n_samples(self) -> int:
        return len(self.sids)

    def missing_families(self) -> list[str]:
        """Families with ``# TYPE`` (and maybe HELP) but not a single sample: missing, not 0."""
        out: list[str] = []
        for fam in self.declared:
            if fam in self.seen_families:
                continue
            info = canonical_name(fam, self.declared[fam])
            if info.family in self.seen_families or info.created:
                continue
            name = info.canonical if info.kind != "histogram" else info.family
            if name is not None:  # a _created sample is no series
                out.append(name)
        return sorted(set(out))

    def present_metrics(self) -> list[str]:
        return sorted({s.canonical for s in self.series})

    def target_labels(self) -> dict[str, list[str]]:
        """Values of model_name / engine / job / instance seen in this run."""
        seen: dict[str, set[str]] = {}
        for s in self.series:
            for key in TARGET_LABELS:
                if key in s.labels:
                    seen.setdefault(key, set()).add(s.labels[key])
        return {k: sorted(v) for k, v in seen.items()}

    def frame(self, drop_single_target_labels: bool = True) -> tuple[pd.DataFrame, dict]:
        """The run's rows of the ``series`` table, and what was done to its labels.

        Called once, when everything is read: the accumulated columns move into the frame.
        """
        n = len(self.sids)
        sids = np.frombuffer(self.sids, dtype=np.int32) if n else np.zeros(0, np.int32)
        values = np.frombuffer(self.values, dtype=np.float64) if n else np.zeros(0)
        ends = np.frombuffer(self.scrape_end, dtype=np.int64) if self.scrape_end else None
        scrape_t = np.frombuffer(self.scrape_t, dtype=np.float64) if self.scrape_t else None
        if ends is not None and scrape_t is not None and n:
            counts = np.diff(ends, prepend=0)
            t = np.repeat(scrape_t, counts)
        else:
            t = np.zeros(0)
        if self.ts_override:
            t = t.copy()
            rows = np.fromiter(self.ts_override.keys(), dtype=np.int64)
            t[rows] = np.fromiter(self.ts_override.values(), dtype=np.float64)
            self._unsorted = True
            self._dups_possible = True

        order = None
        if self._unsorted and n and np.any(np.diff(t) < 0):
            order = np.argsort(t, kind="stable")
            t, sids, values = t[order], sids[order], values[order]
        dropped = 0
        if self._dups_possible and n:
            keep = ~pd.DataFrame({"t": t, "s": sids}).duplicated(keep="last").to_numpy()
            dropped = int(n - keep.sum())
            if dropped:
                t, sids, values = t[keep], sids[keep], values[keep]
        self.stats.duplicate_samples = dropped

        targets = self.target_labels()
        drop = [k for k, v in targets.items() if len(v) <= 1] if drop_single_target_labels else []
        metric_names = [s.canonical for s in self.series]
        label_texts = [format_labels(s.labels, drop) for s in self.series]
        metric_cats, metric_codes = _categories(metric_names)
        label_cats, label_codes = _categories(label_texts)
        m_codes = metric_codes[sids] if n else np.zeros(0, np.int32)
        l_codes = label_codes[sids] if n else np.zeros(0, np.int32)
        del sids
        self._nonfinite = self.nonfinite_counts()
        # The columns are set one by one so that pandas keeps ``t`` and ``value`` as separate
        # blocks instead of copying both into one; ``value`` stays a view on the accumulated
        # array, which this object lets go of (it was read whole).
        df = pd.DataFrame(
            {
                "run": pd.Categorical.from_codes(np.zeros(len(t), np.int8), [self.run]),
                "metric": pd.Categorical.from_codes(m_codes, metric_cats),
                "labels": pd.Categorical.from_codes(l_codes, label_cats),
            }
        )
        df.insert(1, "t", t)
        df["value"] = values
        self.sids, self.values = array("i"), array("d")
        self.scrape_t, self.scrape_end = array("d"), array("q")
        self.ts_override = {}
        label_info = {
            "dropped": {k: targets[k][0] for k in drop if targets.get(k)},
            "kept": {k: v for k, v in targets.items() if k not in drop},
        }
        return df, label_info

    def nonfinite_counts(self) -> dict[str, dict[str, int]]:
        """Per metric: how many NaN / +-Inf values were read."""
        if self._nonfinite is not None:
            return self._nonfinite
        if not self.sids:
            return {}
        sids = np.frombuffer(self.sids, dtype=np.int32)
        values = np.frombuffer(self.values, dtype=np.float64)
        bad = ~np.isfinite(values)
        if not bad.any():
            return {}
        out: dict[str, dict[str, int]] = {}
        for kind, mask in (("nan", np.isnan(values)), ("inf", np.isinf(values))):
            counts = np.bincount(sids[mask], minlength=len(self.series))
            for sid in np.nonzero(counts)[0]:
                name = self.series[int(sid)].canonical
                out.setdefault(name, {}).setdefault(kind, 0)
                out[name][kind] += int(counts[sid])
        return out


def _categories(names: list[str]) -> tuple[list[str], np.ndarray]:
    """Sorted unique categories and, per input position, its code."""
    cats = sorted(set(names))
    index = {c: i for i, c in enumerate(cats)}
    dtype = np.int16 if len(cats) < 32000 else np.int32
    return cats, np.array([index[x] for x in names], dtype=dtype)


def _same_value(text: str, value: float) -> bool:
    """Whether ``float(text)`` reads ``value``: only then may the head be cached."""
    try:
        x = float(text)
    except ValueError:
        return False
    return x == value or (math.isnan(x) and math.isnan(value))


def add_scrape(acc: RunSamples, t: float, text: str, where: str, warnings: list[str]) -> int:
    """Add one scrape; a text cut short (no final newline) keeps its complete lines.

    The exposition format ends every line with a newline, so a last line without one may have
    lost characters (``123.0`` cut to ``12`` still parses): it is dropped and reported.
    """
    if not text or text.endswith("\n"):
        return acc.add_text(text, t, where)
    body, _, last_line = text.rpartition("\n")
    lineno = body.count("\n") + 2 if body else 1
    added = acc.add_text(body + "\n", t, where) if body else 0
    warnings.append(
        f"{where}: line {lineno}: the text ends without a newline, in the middle of "
        f"{_short(last_line)}: the file was cut; that line is dropped, the {added} complete "
        "samples before it are kept"
    )
    return added
