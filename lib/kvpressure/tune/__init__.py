"""Search engine settings under latency limits: a grid of configurations simulated at every
level of an experiment (or a fitted twin), ranked by output throughput within the limits, run serially, on local processes
or on a Dask cluster (``api.run_tune``)."""
