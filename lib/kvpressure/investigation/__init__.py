"""The investigation's stages 01-06 as the notebooks and `kvpressure analyse` run them: collect the tables, call the analysis, decide the verdict."""
