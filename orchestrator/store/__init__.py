"""The sweep folder on disk, one reader and writer per file: paths, atomic writes, records, attempts, states."""
