"""SLURM's commands (sinfo, squeue, sacctmgr, ...) run against one local cluster."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from orchestrator.cluster.layout import ClusterError, ClusterLayout
from orchestrator.cluster.packages import find_program


class SlurmClient:
    """Runs SLURM's commands with ``SLURM_CONF`` pointing at the cluster of ``layout``."""

    def __init__(self, layout: ClusterLayout) -> None:
        self.layout = layout
        self.last_error = ""
        """What the last failed :meth:`ok` or :meth:`node_states_or_empty` call said; for timeout messages."""

    def env(self) -> dict[str, str]:
        """Environment variables that point SLURM's commands (and submitit) at this cluster."""
        return {"SLURM_CONF": str(self.layout.slurm_conf)}

    def run(self, args: Sequence[str], timeout_s: float = 30, check: bool = True) -> str:
        """Run a SLURM command such as ``["sinfo", "-N"]`` and return its stdout.

        With ``check``, a non-zero exit raises ClusterError with the command's stderr.
        """
        result = subprocess.run(
            [find_program(args[0]) or args[0], *args[1:]],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"`{' '.join(args)}` failed with exit code {result.returncode}: {result.stderr.strip()}\n"
                f"(cluster state in {self.layout.state_dir}, logs in {self.layout.log_dir})"
            )
        return result.stdout

    def ok(self, args: Sequence[str]) -> bool:
        """True if the command succeeds within 10 s; else False, and :attr:`last_error` says why."""
        try:
            self.run(args, timeout_s=10)
        except (ClusterError, subprocess.TimeoutExpired) as error:
            self.last_error = str(error)
            return False
        return True

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` in the default partition as sinfo prints it (``idle``, ``mix``, ``down*``, ...)."""
        out = self.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t"], timeout_s=10)
        return dict(line.split() for line in out.splitlines() if line.strip())

    def node_states_or_empty(self) -> dict[str, str]:
        try:
            return self.node_states()
        except (ClusterError, subprocess.TimeoutExpired) as error:
            self.last_error = str(error)
            return {}
