"""Which gpudays measured a record, and which submitted a cell: the package's version, and the git commit where
it is installed from a checkout (an editable install), as ``0.1.0+git.1b9c968a2f3e``.

The submitting side hands its version to each job (``CellJob.submitted_by``, and the cell's attempts.jsonl line);
a job run by a different gpudays (the checkout was pulled, the environment reinstalled, between submission and
start) refuses before measuring, since its record would mix two versions' rules (``orchestrator.job.entry``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent.parent
"""The folder above the ``orchestrator`` package: a git checkout where gpudays is installed from one."""
COMMIT_MARK = "+git."
"""What joins the package version and the commit in a version read from a checkout."""


def git_commit(folder: Path = CHECKOUT) -> str | None:
    """The commit checked out at ``folder`` where it is a git checkout (12 hex digits), else None."""
    if not (folder / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


@functools.lru_cache(maxsize=1)
def gpudays_version() -> str:
    """This gpudays: ``<package version>`` or ``<package version>+git.<commit>`` from a checkout."""
    try:
        version = importlib.metadata.version("gpudays")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    commit = git_commit()
    return f"{version}{COMMIT_MARK}{commit}" if commit else version


def same_gpudays(submitted_by: str, running: str) -> bool:
    """Whether a job running gpudays ``running`` may measure a cell that ``submitted_by`` planned.

    Both versions name their commit where each side found one: then they must match whole. Where one side could not
    read its commit (a compute node without ``git``, a checkout git refuses as another user's, a file system too
    slow to answer in 10 s) only the package versions are compared: refusing there would stop every cell of a sweep
    over the absence of a tool, not over a difference of rules.
    """
    if submitted_by == running:
        return True
    if COMMIT_MARK in submitted_by and COMMIT_MARK in running:
        return False
    return submitted_by.partition(COMMIT_MARK)[0] == running.partition(COMMIT_MARK)[0]


def version_mismatch(submitted_by: str, running: str) -> str:
    """The record's reason where the job's gpudays is not the one that submitted it."""
    return (
        f"this cell was submitted by gpudays {submitted_by} but its job runs gpudays {running}: nothing was "
        "measured, since a record must come from the gpudays that planned it. Fix: reinstall the submitting "
        f"version ({submitted_by}) where the jobs run, or resubmit with this one (`gpudays resume SWEEP_DIR`)"
    )
