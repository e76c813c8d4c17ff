"""A throwaway but real SLURM cluster on this machine: ``gpudays cluster up | down | status | env``.

``up`` starts, all under one private state folder (``$GPUDAYS_CLUSTER_DIR``, default ``/tmp/gpudays-cluster``)
that clients find through ``SLURM_CONF``, nothing written under ``/etc``:

- munged, as user ``munge``, with its own key and socket (``AuthInfo=socket=...`` points SLURM at it);
- a MariaDB server on its own data folder, bound to 127.0.0.1 on a free port;
- slurmdbd with ``accounting_storage/mysql`` (so ``sacct`` knows every job), and the cluster added to it;
- slurmctld, and two slurmd (``node1``, ``node2``, one port each) with fake GPUs (``gpu:a100:4`` per node,
  character devices made with mknod) in the default partition ``debug``; jobs in partition ``urgent``
  preempt (requeue) jobs in ``debug``.

Unix sockets (munged's, MariaDB's, and those slurmd's job steps make in their spool) live in a short runtime
folder, ``/tmp/gd-<8 hex digits of the state folder's path>``, so that a long state folder never makes one
longer than the 107 bytes a socket path may have.

``down`` cancels the jobs, stops the daemons newest first and waits for them to exit. The state folder is kept,
so that job ids and accounting go on across restarts, unless ``down --purge`` is asked for.

From Python: ``LocalCluster().up()``, ``.down()``, ``.status()``, ``.env()``; ``.session()`` for test sessions
that share one cluster; ``.kill_node("node2")`` and ``.start_node("node2")`` for fault tests.

Modules: ``layout`` (paths), ``ports``, ``config`` (the spec and its rendered configuration files),
``packages`` (programs and Debian packages), ``processes`` (psutil), ``client`` (SLURM's commands),
``daemons`` (starting each daemon), ``lifecycle`` (:class:`LocalCluster`), ``cli``.
"""

from orchestrator.cluster.cli import main
from orchestrator.cluster.config import (
    ClusterSpec,
    node_names,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
)
from orchestrator.cluster.layout import (
    DEFAULT_STATE_DIR,
    MAX_SOCKET_PATH_BYTES,
    STATE_DIR_ENV,
    ClusterError,
    ClusterLayout,
)
from orchestrator.cluster.lifecycle import LocalCluster
from orchestrator.cluster.packages import (
    APT_INSTALL_COMMAND,
    REQUIRED_PROGRAMS,
    missing_packages,
    missing_packages_message,
)
from orchestrator.cluster.ports import ClusterPorts

__all__ = [
    "APT_INSTALL_COMMAND",
    "DEFAULT_STATE_DIR",
    "MAX_SOCKET_PATH_BYTES",
    "REQUIRED_PROGRAMS",
    "STATE_DIR_ENV",
    "ClusterError",
    "ClusterLayout",
    "ClusterPorts",
    "ClusterSpec",
    "LocalCluster",
    "main",
    "missing_packages",
    "missing_packages_message",
    "node_names",
    "render_gres_conf",
    "render_slurm_conf",
    "render_slurmdbd_conf",
]
