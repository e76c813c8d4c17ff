"""Fixtures for integration tests: a real SLURM cluster on this machine, started by the project's own code."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from filelock import FileLock

from orchestrator.cluster import (
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    LocalCluster,
    missing_packages,
    missing_packages_message,
)
from orchestrator.job.env import PORT_SPAN


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


def worker_cluster() -> LocalCluster:
    """The cluster of this test process: ``$GPUDAYS_CLUSTER_DIR`` (default /tmp/gpudays-cluster) in one process;
    under pytest-xdist, one of its own per worker (``...-gw0``, ``...-gw1``), so that SLURM tests on two workers
    at once never share a cluster: a test that kills a node must not reach another's jobs.

    Each worker's cluster also has a range of job ids of its own: every cluster runs its jobs on this one host,
    and rank 0's port comes from the job id (``orchestrator.job.env.rendezvous``), so two clusters handing out
    the same id at once would give two jobs one port. The ranges split the ports' span between the workers.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return LocalCluster()
    index, count = int(worker.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    span = PORT_SPAN // max(count, index + 1)
    base = os.environ.get(STATE_DIR_ENV) or str(DEFAULT_STATE_DIR)
    return LocalCluster(f"{base}-{worker}", job_ids=(index * span + 1, (index + 1) * span))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """This process's local cluster (:func:`worker_cluster`), up for the whole session.

    Reuses a cluster that is already up in that folder, else starts one. At the end, a cluster that a test
    session started is stopped once no other session (another pytest process) still uses it; one started
    with `gpudays cluster up` is left up. Sets ``SLURM_CONF`` in this process so that sbatch, sacct and
    submitit find the cluster.

    A worker's cluster that is down starts from an empty state, so that its job ids start at the beginning of
    its range (past the end they would start again, beside the old jobs' records). Workers start their clusters
    one at a time: each chooses free ports and binds them before the next chooses.
    """
    require_slurm_packages()
    saved = os.environ.get("SLURM_CONF")
    cluster = worker_cluster()
    with contextlib.ExitStack() as stack:
        with FileLock(f"{DEFAULT_STATE_DIR}-start.lock"):
            if "PYTEST_XDIST_WORKER" in os.environ and not cluster.is_up():
                cluster.down(purge=True, log=lambda message: None)
            stack.enter_context(cluster.session(log=lambda message: print(message)))
        os.environ.update(cluster.env())
        try:
            yield cluster
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved
