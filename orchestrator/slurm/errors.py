"""What a SLURM command's failure means, in one line: SLURM's own words, or, where they say nothing of the cause
(no configuration found), what to do. Pure text; the calls themselves are ``orchestrator.slurm.commands``'s."""

from __future__ import annotations

__all__ = ["CONTROLLER_DOWN_MARKERS", "NO_CONFIG_MARKERS", "controller_down", "explain_failure"]

NO_CONFIG_MARKERS = ("resolve_ctls_from_dns_srv", "Could not establish a configuration source", "fetch_config")
"""What SLURM's commands print when they find no slurm.conf (SLURM_CONF unset, none in /etc/slurm): seven lines
of DNS lookups that say nothing of the cause."""
CONTROLLER_DOWN_MARKERS = ("Unable to contact slurm controller", "Connection refused", "connect failure")
"""What they print when slurm.conf names a controller that does not answer."""


def explain_failure(cmd: str, returncode: int, stderr: str) -> str:
    """One line for a SLURM command that failed: SLURM's own words, or, where it found no configuration, what to do."""
    if any(marker in stderr for marker in NO_CONFIG_MARKERS):
        return (
            "SLURM's commands find no configuration (SLURM_CONF is not set, and this machine has no "
            "/etc/slurm/slurm.conf): for the local cluster run `eval $(gpudays cluster env)` first; for another "
            "cluster, run gpudays where its commands work (a login node) or set SLURM_CONF"
        )
    said = " ".join(line.strip() for line in stderr.splitlines() if line.strip())
    return f"`{cmd}` failed ({returncode}): {said[:300]}"


def controller_down(message: str) -> bool:
    """Whether a SLURM command's failure says the controller could not be reached (or found at all)."""
    return any(marker in message for marker in (*CONTROLLER_DOWN_MARKERS, "find no configuration", "did not answer"))
