"""What the cluster looks like (:class:`ClusterSpec`), and its configuration files, rendered from templates.

slurm.conf, gres.conf and slurmdbd.conf are Jinja2 templates in ``templates/`` next to this module; they take the
spec, its layout (``paths``) and the accounting database's settings (``db``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2

from orchestrator.cluster.layout import MAX_SOCKET_PATH_BYTES, ClusterLayout
from orchestrator.cluster.ports import ClusterPorts

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

MAX_JOB_ID = 67_043_328
"""SLURM's default MaxJobId (0x03ff0000), also the largest it accepts."""


@dataclass(frozen=True)
class AccountingDatabase:
    """The MariaDB database slurmdbd keeps its records in."""

    name: str = "slurm_acct_db"
    user: str = "slurm"
    password: str = "gpudays-local-only"
    """MariaDB listens on 127.0.0.1 only, for the lifetime of the cluster."""


DB = AccountingDatabase()


@dataclass(frozen=True)
class ClusterSpec:
    """What the cluster looks like; the defaults are what ``gpudays cluster up`` and the tests use."""

    layout: ClusterLayout
    hostname: str
    """This machine's host name: every node runs here (NodeHostname), reached at 127.0.0.1."""
    ports: ClusterPorts
    cluster_name: str = "gpudays"
    partition: str = "debug"
    preempt_partition: str = "urgent"
    """A second partition on the same nodes whose jobs preempt (requeue) jobs of ``partition``."""
    num_nodes: int = 2
    cpus_per_node: int = 8
    """Overcommitted on purpose (``SlurmdParameters=config_overrides``): the host may have 2 cores."""
    real_memory_mib: int = 16384
    """Per node; overcommitted like the CPUs. Memory is not a consumable resource here (CR_Core)."""
    gpu_type: str = "a100"
    gpus_per_node: int = 4
    max_array_size: int = 1001
    """SLURM's MaxArraySize: array indexes go from 0 to max_array_size - 1."""
    job_ids: tuple[int, int] = (1, MAX_JOB_ID)
    """The first and the last job id (SLURM's FirstJobId and MaxJobId; past the last, ids start again at the
    first). Clusters that share a host get ranges of their own, so that no job id, and no rendezvous port derived
    from one (``orchestrator.job.env.rendezvous``), is in use on two at once."""
    kill_wait_s: int = 2
    """Seconds between SIGTERM and SIGKILL at a time limit (SLURM's default is 30)."""
    slurmd_timeout_s: int = 20
    """Seconds before an unresponsive node is set DOWN and its jobs end NODE_FAIL (SLURM's default is 300)."""
    cred_expire_s: int = 20
    """Credential lifetime; also how long a requeued job waits before it may start again (default 120)."""
    node_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {self.num_nodes}")
        if len(self.ports.slurmd) != self.num_nodes:
            raise ValueError(f"{self.num_nodes} nodes need {self.num_nodes} slurmd ports, got {self.ports.slurmd}")
        if len(set(self.ports.all())) != len(self.ports.all()):
            raise ValueError(f"the cluster's ports must be distinct, got {self.ports}")
        if not 1 <= self.max_array_size <= 4_000_001:
            raise ValueError(f"max_array_size must be between 1 and 4000001, got {self.max_array_size}")
        first, last = self.job_ids
        if not 1 <= first < last <= MAX_JOB_ID:
            raise ValueError(f"job_ids must be a range (first, last) inside 1..{MAX_JOB_ID}, got {self.job_ids}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be at least 1, got {self.gpus_per_node}")
        object.__setattr__(self, "node_names", node_names(self.num_nodes))
        longest = self.layout.longest_socket_path(self.node_names[-1])
        if len(str(longest).encode()) > MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"the runtime folder {self.layout.runtime_dir} is too long: job steps would make sockets such as "
                f"{longest} ({len(str(longest).encode())} bytes), over the limit of {MAX_SOCKET_PATH_BYTES} "
                "bytes of a Unix socket path. Choose a shorter runtime_root."
            )


def node_names(num_nodes: int) -> tuple[str, ...]:
    """``("node1", "node2", ...)``."""
    return tuple(f"node{i}" for i in range(1, num_nodes + 1))


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(template: str, spec: ClusterSpec) -> str:
    return (
        _templates()
        .get_template(template)
        .render(spec=spec, paths=spec.layout, db=DB, nodes=list(zip(spec.node_names, spec.ports.slurmd, strict=True)))
    )


def render_slurm_conf(spec: ClusterSpec) -> str:
    """The text of slurm.conf for ``spec``."""
    return _render("slurm.conf.j2", spec)


def render_gres_conf(spec: ClusterSpec) -> str:
    """The text of gres.conf: each node's fake GPUs, one character device each."""
    return _render("gres.conf.j2", spec)


def render_slurmdbd_conf(spec: ClusterSpec) -> str:
    """The text of slurmdbd.conf: accounting in the private MariaDB, reached over 127.0.0.1."""
    return _render("slurmdbd.conf.j2", spec)
