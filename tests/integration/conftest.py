"""Fixtures for integration tests: a real SLURM cluster on this machine, started by the project's own code."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from orchestrator.cluster import LocalCluster, missing_packages, missing_packages_message


def require_slurm_packages() -> None:
    """Skip the calling test when SLURM's Debian packages are missing; under CI (``CI=true``), fail instead."""
    missing = missing_packages()
    if missing:
        message = missing_packages_message(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() != 0:
        message = "the local SLURM cluster needs root (munged runs as user munge; fake GPUs are made with mknod)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """The local cluster (``$GPUDAYS_CLUSTER_DIR``, default /tmp/gpudays-cluster), up for the whole session.

    Reuses a cluster that is already up in that folder, else starts one. At the end, a cluster that a test
    session started is stopped once no other session (another pytest process) still uses it; one started
    with `gpudays cluster up` is left up. Sets ``SLURM_CONF`` in this process so that sbatch, sacct and
    submitit find the cluster.
    """
    require_slurm_packages()
    saved = os.environ.get("SLURM_CONF")
    with LocalCluster().session(log=lambda message: print(message)) as cluster:
        os.environ.update(cluster.env())
        try:
            yield cluster
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved
