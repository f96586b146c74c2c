"""The run folder's layout: the name of every file and folder a report's folder holds.

One place for the names, below every module that writes or reads them (the output folder's
replacement rules, the stages, the report).
"""

from __future__ import annotations

from kvpressure.stages.files import ANALYSIS_DIR

EXPERIMENT_COPY = "experiment.yaml"
SOURCES_FILE = "sources.json"
RUNS_CSV = "runs.csv"
SERIES_CSV = "series.csv"
INGEST_JSON = "ingest.json"
RECORD_YAML = "record.yaml"
INDEX_HTML = "index.html"
NOTEBOOKS_DIR = "notebooks"
POINTS_DIR = "points"
# The variant a comparison measures the others against, and the scrape log a point or a source
# folder keeps beside its bench results.
BASELINE = "baseline"
SCRAPE_FILES = ("metrics.prom.jsonl", "metrics.prom.jsonl.gz")
# What notebooks run on their own may write into a run folder (besides the marker's files).
RUN_LAYOUT = (EXPERIMENT_COPY, SOURCES_FILE, RUNS_CSV, SERIES_CSV, INGEST_JSON, RECORD_YAML,
              INDEX_HTML, "runs.parquet", "series.parquet", "prometheus-rules.yml")
RUN_LAYOUT_DIRS = (ANALYSIS_DIR, NOTEBOOKS_DIR, POINTS_DIR)
