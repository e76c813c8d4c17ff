"""One rank measures one cell and writes its record: the job's entry, the probe, ranks, timing, search, metering."""
