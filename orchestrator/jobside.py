"""The job's entry under its path before 0.2: a sweep submitted then pickled ``orchestrator.jobside.CellJob``, and
its requeued or held jobs unpickle it from here. New jobs use ``orchestrator.job.entry``."""

from orchestrator.job.entry import CellJob

__all__ = ["CellJob"]
