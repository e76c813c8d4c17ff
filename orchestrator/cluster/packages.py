"""The programs the local cluster runs, where to find them, and which Debian packages provide them."""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Sequence

from orchestrator.cluster.layout import ClusterError

APT_INSTALL_COMMAND = "apt-get install -y slurm-wlm slurmdbd munge mariadb-server"

# The programs the cluster runs, and the Debian package that ships each one.
REQUIRED_PROGRAMS: dict[str, str] = {
    "munged": "munge",
    "mungekey": "munge",
    "munge": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-client",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "sacct": "slurm-client",
    "sacctmgr": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
}
# slurmdbd reaches MariaDB through this plugin, which Debian ships apart from slurmdbd's binary.
MYSQL_PLUGIN_GLOB = "/usr/lib/*/slurm-wlm/accounting_storage_mysql.so"
MYSQL_PLUGIN_PACKAGE = "slurm-wlm-mysql-plugin"
# Daemons live in /usr/sbin, which is not on every user's PATH.
SYSTEM_BIN_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


def find_program(name: str, bin_dirs: Sequence[str] | None = None) -> str | None:
    """The path of ``name`` in ``bin_dirs`` (default: PATH, then the system binary folders), or None."""
    if bin_dirs is None:
        bin_dirs = [*os.environ.get("PATH", "").split(os.pathsep), *SYSTEM_BIN_DIRS]
    return shutil.which(name, path=os.pathsep.join(bin_dirs))


def missing_packages(bin_dirs: Sequence[str] | None = None) -> list[str]:
    """Debian packages the local cluster needs that are not installed (sorted; empty when none is missing).

    ``bin_dirs`` replaces the folders searched for the programs (default: PATH and the system folders).
    """
    missing = {package for program, package in REQUIRED_PROGRAMS.items() if find_program(program, bin_dirs) is None}
    if "slurmdbd" not in missing and not glob.glob(MYSQL_PLUGIN_GLOB):
        missing.add(MYSQL_PLUGIN_PACKAGE)
    return sorted(missing)


def missing_packages_message(missing: Sequence[str]) -> str:
    """What to tell a user who lacks the packages ``missing`` (from :func:`missing_packages`)."""
    return (
        f"The local SLURM cluster needs Debian packages that are not installed: {', '.join(missing)}.\n"
        f"Install them as root with:\n    {APT_INSTALL_COMMAND}"
    )


def program(name: str) -> str:
    """The path of a program the cluster needs; ClusterError naming its package when it is missing."""
    path = find_program(name)
    if path is None:
        raise ClusterError(missing_packages_message([REQUIRED_PROGRAMS.get(name, name)]))
    return path
