"""Step-by-step comparison of two ``steps.csv`` tables (and two ``requests.csv``): where the
kit's simulation and a real vLLM scheduler first part ways, with both rows side by side."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

# kv_usage is written with 6 decimals on both sides; a difference in the last digit would be a
# different block count only for pools of more than a million blocks.
_FLOAT_TOLERANCE = {"kv_usage": 1e-6, "kv_usage_after": 1e-6}


@dataclass
class Divergence:
    """The first row where the two tables differ (``index`` counts data rows from 0)."""

    table: str
    index: int
    key: str
    columns: list[str]
    ours: dict[str, str] | None
    theirs: dict[str, str] | None

    def describe(self, ours_label: str = "kvpressure", theirs_label: str = "vllm") -> str:
        """Both rows, one column a line, the differing columns marked with ``<<``."""
        if self.ours is None or self.theirs is None:
            missing = ours_label if self.ours is None else theirs_label
            present = self.theirs if self.ours is None else self.ours
            lines = [f"{self.table}: {missing} has no row {self.index} ({self.key}); the other "
                     "side continues with:"]
            lines += [f"  {c:>24} {present.get(c, '')}" for c in present]  # type: ignore[union-attr]
            return "\n".join(lines)
        lines = [f"{self.table}: first divergence at {self.key} (row {self.index}); "
                 f"differing: {', '.join(self.columns)}",
                 f"  {'column':>24} {ours_label:>12} {theirs_label:>12}"]
        names = list(self.ours) + [c for c in self.theirs if c not in self.ours]
        for c in names:
            mark = "  <<" if c in self.columns else ""
            lines.append(f"  {c:>24} {self.ours.get(c, ''):>12} {self.theirs.get(c, ''):>12}"
                         f"{mark}")
        return "\n".join(lines)


@dataclass
class Comparison:
    """The verdict for one workload."""

    name: str
    steps_ours: int = 0
    steps_theirs: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    error: str | None = None

    @property
    def matches(self) -> bool:
        return self.error is None and not self.divergences


def read_table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV text."""
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def _equal(column: str, a: str, b: str) -> bool:
    if a == b:
        return True
    tol = _FLOAT_TOLERANCE.get(column)
    if tol is None:
        return False
    try:
        return abs(float(a) - float(b)) <= tol + 1e-12
    except ValueError:
        return False


def first_divergence(ours: str, theirs: str, table: str = "steps.csv",
                     key: str = "step") -> Divergence | None:
    """The first data row where the two CSV texts differ in a column both have, or where
    one table ends before the other; None when they agree row for row.

    Only the columns present in both tables are compared, so a table with extra columns
    (``time_s`` of a timed run) still compares on the shared ones.
    """
    cols_a, rows_a = read_table(ours)
    cols_b, rows_b = read_table(theirs)
    shared = [c for c in cols_a if c in cols_b]
    for i in range(max(len(rows_a), len(rows_b))):
        a = rows_a[i] if i < len(rows_a) else None
        b = rows_b[i] if i < len(rows_b) else None
        if a is None or b is None:
            row = a if a is not None else b
            return Divergence(table, i, f"{key} {row.get(key, i)}", [], a, b)  # type: ignore[union-attr]
        bad = [c for c in shared if not _equal(c, a[c], b[c])]
        if bad:
            label = a.get(key, str(i))
            if b.get(key) != label:
                label = f"{label} / {b.get(key)}"
            return Divergence(table, i, f"{key} {label}", bad, a, b)
    return None


def compare_runs(name: str, ours_steps: str, theirs_steps: str, ours_requests: str,
                 theirs_requests: str) -> Comparison:
    """Steps first (where a scheduling decision first differs), then requests (per-request
    totals, which can differ only if some step did)."""
    result = Comparison(name, steps_ours=len(read_table(ours_steps)[1]),
                        steps_theirs=len(read_table(theirs_steps)[1]))
    for table, a, b, key in (("steps.csv", ours_steps, theirs_steps, "step"),
                             ("requests.csv", ours_requests, theirs_requests, "id")):
        d = first_divergence(a, b, table, key)
        if d is not None:
            result.divergences.append(d)
    return result
