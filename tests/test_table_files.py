"""Every table the kit writes is CSV, and with pyarrow (the [parquet] extra) the same table as
Parquet beside it: a report's, an ingest's and a sweep's, read back equal."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvpressure.ingestion.api import ingest
from kvpressure.paths import REPO_ROOT
from kvpressure.table_files import parquet_available, write_table

pytestmark = pytest.mark.skipif(not parquet_available(), reason="pyarrow not installed")
SAVED = REPO_ROOT / "tests" / "data" / "twin_saved" / "quiet" / "pool64_fullisl"


def _same(folder, name):
    csv = pd.read_csv(folder / f"{name}.csv")
    pq = pd.read_parquet(folder / f"{name}.parquet")
    assert list(pq.columns) == list(csv.columns)
    # a missing value is missing in both (an all-missing column is None in Parquet, NaN in
    # CSV; an empty label string comes back from CSV as missing, Parquet keeps it)
    def plain(f):
        f = f.astype(object)
        return f.where(f.notna() & (f != ""), None)

    pd.testing.assert_frame_equal(plain(pq.reset_index(drop=True)), plain(csv),
                                  check_dtype=False)


def test_a_table_round_trips_with_its_missing_values(tmp_path):
    frame = pd.DataFrame({"concurrency": [2, 4], "preemptions": [0.0, np.nan],
                          "run": ["c2", "c4"]})
    written = write_table(frame, tmp_path / "runs.csv")
    assert [p.name for p in written] == ["runs.csv", "runs.parquet"]
    _same(tmp_path, "runs")
    assert pd.isna(pd.read_parquet(tmp_path / "runs.parquet")["preemptions"][1])


def test_ingest_and_report_folders_carry_both(tmp_path, ci_small_report):
    ingest([SAVED / "bench", SAVED / "metrics.prom.jsonl.gz"]).write(tmp_path / "run")
    for name in ("runs", "series"):
        _same(tmp_path / "run", name)
        _same(ci_small_report.run_dir, name)
