"""Records to tables, plots and report.md."""
