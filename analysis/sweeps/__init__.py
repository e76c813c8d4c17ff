"""Sweep folders read into one typed table: records, the config catalog, the cells table's columns."""
