"""A throwaway but real SLURM cluster on this machine: ``gpudays cluster up | down | status | env``.

``up`` starts, all under one private state folder (``$GPUDAYS_CLUSTER_DIR``, default ``/tmp/gpudays-cluster``)
that clients find through ``SLURM_CONF``, nothing written under ``/etc``:

- munged, as user ``munge``, with its own key and socket (``AuthInfo=socket=...`` points SLURM at it);
- a MariaDB server on its own data folder, bound to 127.0.0.1 on a free port;
- slurmdbd with ``accounting_storage/mysql`` (so ``sacct`` knows every job), and the cluster added to it;
- slurmctld, and two slurmd (``node1``, ``node2``, one port each) with fake GPUs (``gpu:a100:4`` per node,
  character devices made with mknod) in the default partition ``debug``; jobs in partition ``urgent``
  preempt (requeue) jobs in ``debug``.

``down`` cancels the jobs, stops the daemons newest first and waits for them to exit. The state folder is kept,
so that job ids and accounting go on across restarts, unless ``down --purge`` is asked for.

From Python: ``LocalCluster().up()``, ``.down()``, ``.status()``, ``.env()``; ``.session()`` for test sessions
that share one cluster; ``.kill_node("node2")`` and ``.start_node("node2")`` for fault tests.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = Path("/tmp/gpudays-cluster")
STATE_DIR_ENV = "GPUDAYS_CLUSTER_DIR"
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

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
DB_PASSWORD = "gpudays-local-only"  # MariaDB listens on 127.0.0.1 only, for the lifetime of the cluster.
# Unix socket paths (sun_path) hold at most 107 bytes and a NUL. slurmstepd names its sockets
# SPOOL/NODE_JOBID.STEPID, with ids up to 10 digits each: the spool folders must stay short.
MAX_SOCKET_PATH_BYTES = 107
RUNTIME_ROOT = Path("/tmp")
# Daemon ports are drawn from here: below Linux's ephemeral range (32768-60999), so that no client socket
# opened while the cluster is down takes a port the next `up` expects to reuse.
PORT_RANGE = (20000, 32000)


class ClusterError(RuntimeError):
    """The local cluster could not be started, stopped or queried; the message says why and where to look."""


# --------------------------------------------------------------------------------------------------------------
# Layout and configuration (pure)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterLayout:
    """Every path in the cluster's state folder.

    ::

        STATE_DIR/
          etc/     slurm.conf, slurmdbd.conf, gres.conf (SLURM_CONF points here; rewritten by every `up`)
          munge/   munge.key, munged.log (owned by user munge)
          mysql/   data/, mysqld.log (owned by user mysql)
          log/     slurmctld.log, slurmdbd.log, slurmd.node1.log, ... and each daemon's stdout (NAME.out)
          run/     pid files the daemons write themselves
          spool/   slurmctld's saved state
          dev/     NODE/gpu0..: the fake GPUs, character devices
          runtime  a symbolic link to the runtime folder below
          ports.json   the ports chosen by the first `up`, reused while they are free
          pids.json    every daemon `up` started, with pid and start time: what `down` stops
          sessions/    who uses the cluster through `LocalCluster.session` (test sessions)

    Every Unix socket lives in a short runtime folder of its own, ``/tmp/gd-HASH`` (8 hex digits of the state
    folder's path), whatever the state folder's length: a socket path longer than 107 bytes cannot be bound,
    and slurmd's job steps make sockets named after job and step ids in their spool folder::

        RUNTIME_DIR/
          munge/   munge.socket (owned by user munge)
          mysql/   mysqld.sock (owned by user mysql)
          spool/   slurmd.NODE/: each slurmd's spool (its job steps run with it as their cwd)
    """

    state_dir: Path
    runtime_root: Path = RUNTIME_ROOT
    """Where the runtime folder is made; short, and searchable by every user."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir).absolute())
        object.__setattr__(self, "runtime_root", Path(self.runtime_root).absolute())

    @property
    def runtime_dir(self) -> Path:
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:8]
        return self.runtime_root / f"gd-{digest}"

    @property
    def runtime_link(self) -> Path:
        """A symbolic link in the state folder to :attr:`runtime_dir`: where to find the sockets."""
        return self.state_dir / "runtime"

    def longest_socket_path(self, node: str) -> Path:
        """The longest socket path a job step on ``node`` may make (job and step ids of 10 digits)."""
        return self.slurmd_spool(node) / f"{node}_4294967294.4294967294"

    @property
    def etc_dir(self) -> Path:
        return self.state_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc_dir / "slurmdbd.conf"

    @property
    def gres_conf(self) -> Path:
        # SLURM looks for gres.conf next to slurm.conf.
        return self.etc_dir / "gres.conf"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.runtime_dir / "munge" / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def mysql_dir(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def mysql_data_dir(self) -> Path:
        return self.mysql_dir / "data"

    @property
    def mysql_socket(self) -> Path:
        return self.runtime_dir / "mysql" / "mysqld.sock"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def spool_dir(self) -> Path:
        return self.state_dir / "spool"

    @property
    def slurmctld_state_dir(self) -> Path:
        return self.spool_dir / "slurmctld"

    def slurmd_spool(self, node: str) -> Path:
        return self.runtime_dir / "spool" / f"slurmd.{node}"

    def gpu_devices(self, node: str, num_gpus: int) -> list[Path]:
        return [self.state_dir / "dev" / node / f"gpu{i}" for i in range(num_gpus)]

    @property
    def ports_file(self) -> Path:
        return self.state_dir / "ports.json"

    @property
    def pids_file(self) -> Path:
        return self.state_dir / "pids.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / ".lock"

    @property
    def sessions_dir(self) -> Path:
        """One empty file per process using the cluster through ``LocalCluster.session`` (named PID-STARTTICKS)."""
        return self.state_dir / "sessions"

    @property
    def session_started_marker(self) -> Path:
        """Present while the running cluster was started by a session, which means the last session stops it."""
        return self.sessions_dir / ".started-by-a-session"

    def daemon_log(self, daemon: str) -> Path:
        """The log a daemon writes itself (``slurmd.node1`` for a node): where to look when it fails."""
        if daemon == "munged":
            return self.munge_dir / "munged.log"
        if daemon == "mariadbd":
            return self.mysql_dir / "mysqld.log"
        return self.log_dir / f"{daemon}.log"

    def daemon_stdout(self, daemon: str) -> Path:
        return self.log_dir / f"{daemon}.out"


@dataclass(frozen=True)
class ClusterPorts:
    """TCP ports of the cluster's daemons."""

    slurmctld: int
    slurmdbd: int
    mysql: int
    slurmd: tuple[int, ...]
    """One port per node, in node order."""

    def all(self) -> list[int]:
        return [self.slurmctld, self.slurmdbd, self.mysql, *self.slurmd]


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


def render_slurm_conf(spec: ClusterSpec) -> str:
    """The text of slurm.conf for ``spec``."""
    paths = spec.layout
    node_lines = "\n".join(
        f"NodeName={node} NodeHostname={spec.hostname} NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={spec.cpus_per_node} RealMemory={spec.real_memory_mib} "
        f"Gres=gpu:{spec.gpu_type}:{spec.gpus_per_node} State=UNKNOWN"
        for node, port in zip(spec.node_names, spec.ports.slurmd, strict=True)
    )
    nodes = ",".join(spec.node_names)
    return f"""\
# Written by `gpudays cluster up` at every start: edits are lost.
ClusterName={spec.cluster_name}
SlurmctldHost={spec.hostname}(127.0.0.1)
SlurmctldPort={spec.ports.slurmctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={paths.munge_socket},cred_expire={spec.cred_expire_s}

StateSaveLocation={paths.slurmctld_state_dir}
SlurmdSpoolDir={paths.runtime_dir}/spool/slurmd.%n
SlurmctldPidFile={paths.run_dir}/slurmctld.pid
SlurmdPidFile={paths.run_dir}/slurmd.%n.pid
SlurmctldLogFile={paths.daemon_log("slurmctld")}
SlurmdLogFile={paths.log_dir}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups on this machine: track job processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobCompType=jobcomp/none
MailProg=/bin/true

# Trust the node lines below over what the host has: overcommitted CPUs and memory.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# A node that was down (e.g. its slurmd was killed) returns to service when its slurmd registers again.
ReturnToService=2

AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={spec.hostname}
AccountingStoragePort={spec.ports.slurmdbd}
# Clients take the munge socket for slurmdbd connections from here, not from AuthInfo.
AccountingStoragePass={paths.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=5

# Hard time limits and short intervals, so that tests of faults run fast.
MaxArraySize={spec.max_array_size}
OverTimeLimit=0
KillWait={spec.kill_wait_s}
InactiveLimit=0
MinJobAge=300
MessageTimeout=5
SlurmctldTimeout=30
SlurmdTimeout={spec.slurmd_timeout_s}
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE

{node_lines}
PartitionName={spec.partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={spec.preempt_partition} Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


def render_gres_conf(spec: ClusterSpec) -> str:
    """The text of gres.conf: each node's fake GPUs, one character device each."""
    lines = ["# Written by `gpudays cluster up`: fake GPUs, for scheduling only.", "AutoDetect=off"]
    for node in spec.node_names:
        folder = spec.layout.gpu_devices(node, 1)[0].parent
        files = f"{folder}/gpu0" if spec.gpus_per_node == 1 else f"{folder}/gpu[0-{spec.gpus_per_node - 1}]"
        lines.append(f"NodeName={node} Name=gpu Type={spec.gpu_type} File={files}")
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(spec: ClusterSpec) -> str:
    """The text of slurmdbd.conf: accounting in the private MariaDB, reached over 127.0.0.1."""
    paths = spec.layout
    return f"""\
# Written by `gpudays cluster up` at every start: edits are lost.
AuthType=auth/munge
AuthInfo=socket={paths.munge_socket}
DbdHost={spec.hostname}
DbdAddr=127.0.0.1
DbdPort={spec.ports.slurmdbd}
SlurmUser=root
PidFile={paths.run_dir}/slurmdbd.pid
LogFile={paths.daemon_log("slurmdbd")}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={spec.ports.mysql}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
"""


# --------------------------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------------------------


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


def _program(name: str) -> str:
    path = find_program(name)
    if path is None:
        raise ClusterError(missing_packages_message([REQUIRED_PROGRAMS.get(name, name)]))
    return path


# --------------------------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------------------------

# Popen objects of the daemons this process started, kept so that they are reaped when they exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ")" are fixed.
    return text[text.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if it does not exist or has exited (zombie)."""
    fields = _proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class DaemonRecord:
    """One daemon started by ``up``: enough to find exactly that process again."""

    name: str
    pid: int
    start_ticks: int

    def alive(self) -> bool:
        # A pid is reused once its process is gone: the start time tells the two apart.
        return _start_ticks(self.pid) == self.start_ticks


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _proc_stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if this process started it, so it leaves no zombie behind."""
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]


def _wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def _gone(record: DaemonRecord) -> bool:
    """True once the daemon has exited (and is reaped, when this process started it)."""
    _reap(record.pid)
    return not record.alive()


def _stop(record: DaemonRecord, timeout_s: float) -> None:
    """SIGTERM the daemon, SIGKILL it if it is still there after ``timeout_s``; return once it is gone."""
    if _gone(record):
        return
    _kill([record.pid], signal.SIGTERM)
    if not _wait_until(lambda: _gone(record), timeout_s, 0.05):
        _kill([record.pid])
        _wait_until(lambda: _gone(record), 10, 0.05)


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _pick_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(*PORT_RANGE)
        if port not in ports and _port_is_free(port):
            ports.append(port)
    return ports


def _live_leases(folder: Path) -> list[Path]:
    """Session leases (named PID-STARTTICKS) in ``folder`` whose process still runs; stale ones are removed."""
    live = []
    for lease in folder.glob("[0-9]*-[0-9]*"):
        pid, _, ticks = lease.name.partition("-")
        if pid.isdigit() and ticks.isdigit() and _start_ticks(int(pid)) == int(ticks):
            live.append(lease)
        else:
            lease.unlink(missing_ok=True)
    return live


def _make_runtime_dir(paths: ClusterLayout) -> None:
    """Create the short runtime folder (sockets, slurmd spools), refusing one that someone else made."""
    runtime = paths.runtime_dir
    with contextlib.suppress(FileExistsError):
        runtime.mkdir(mode=0o755)
    info = runtime.lstat()
    # /tmp is writable by all: a folder or link planted there by another user must not receive our sockets.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ClusterError(
            f"{runtime}, the runtime folder of {paths.state_dir}, exists but is not a folder owned by this user. "
            "Remove it, or choose another state folder."
        )
    runtime.chmod(0o755)
    if paths.runtime_link.is_symlink() or paths.runtime_link.exists():
        if paths.runtime_link.is_symlink() and Path(os.readlink(paths.runtime_link)) == runtime:
            return
        paths.runtime_link.unlink()
    paths.runtime_link.symlink_to(runtime)


def _host_memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 16384


def _tail(path: Path, num_lines: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(lines[-num_lines:])


# --------------------------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------------------------


class LocalCluster:
    """A SLURM cluster of ``num_nodes`` nodes on this machine, living in ``state_dir``.

    ``up``, ``down`` and the node faults need root (munged runs as user munge, the fake GPUs are made with
    mknod); SLURM's commands, and submitit, find the cluster through the variables of :meth:`env`.
    """

    def __init__(self, state_dir: Path | str | None = None, num_nodes: int = 2) -> None:
        if state_dir is None:
            state_dir = os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        self.layout = ClusterLayout(Path(state_dir))
        self.node_names = node_names(num_nodes)
        self._last_client_error = ""

    @property
    def state_dir(self) -> Path:
        return self.layout.state_dir

    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    # Clients ---------------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment variables that point SLURM's commands (and submitit) at this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def run_client(self, args: Sequence[str], timeout_s: float = 30, check: bool = True) -> str:
        """Run a SLURM command such as ``["sinfo", "-N"]`` against this cluster and return its stdout.

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
                f"(cluster state in {self.state_dir}, logs in {self.layout.log_dir})"
            )
        return result.stdout

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` in the default partition as sinfo prints it (``idle``, ``mix``, ``down*``, ...)."""
        out = self.run_client(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t"], timeout_s=10)
        return dict(line.split() for line in out.splitlines() if line.strip())

    # State -----------------------------------------------------------------------------------------------------
    def daemons(self) -> list[DaemonRecord]:
        """The daemons recorded by the last ``up`` (and node restarts), in start order."""
        if not self.layout.pids_file.is_file():
            return []
        return [DaemonRecord(**entry) for entry in json.loads(self.layout.pids_file.read_text())]

    def _save_daemons(self, records: Sequence[DaemonRecord]) -> None:
        tmp = self.layout.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in records], indent=1))
        tmp.replace(self.layout.pids_file)

    def expected_daemons(self) -> list[str]:
        """Names of the daemons a running cluster has, in start order."""
        return ["munged", "mariadbd", "slurmdbd", "slurmctld", *(f"slurmd.{node}" for node in self.node_names)]

    def is_up(self) -> bool:
        """True when every daemon of a complete start is running."""
        records = self.daemons()
        return sorted(r.name for r in records) == sorted(self.expected_daemons()) and all(r.alive() for r in records)

    def status(self) -> dict[str, object]:
        """``state_dir``, ``slurm_conf``, ``up``, ``daemons`` (name, pid, alive) and ``sinfo``'s output."""
        daemons = [{"name": r.name, "pid": r.pid, "alive": r.alive()} for r in self.daemons()]
        sinfo = ""
        if any(d["alive"] and d["name"] == "slurmctld" for d in daemons):
            try:
                sinfo = self.run_client(["sinfo", "-N", "-o", "%N %P %t %c %G"], timeout_s=10, check=False)
            except subprocess.TimeoutExpired:
                sinfo = "(sinfo did not answer within 10 s)"
        return {
            "state_dir": str(self.state_dir),
            "slurm_conf": str(self.slurm_conf),
            "runtime_dir": str(self.layout.runtime_dir),
            "up": self.is_up(),
            "daemons": daemons,
            "sinfo": sinfo,
        }

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up, down and node restarts on this state folder across processes."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self.layout.lock_file.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # up ----------------------------------------------------------------------------------------------------------
    def up(self, max_array_size: int = 1001, timeout_s: float = 60, log: Callable[[str], None] = print) -> bool:
        """Start the cluster; return once every node is idle and sacct answers. Already up: say so, return.

        Returns True if this call started it. Raises ClusterError, naming the log to read, if a daemon dies or
        is not ready within ``timeout_s``; what was started is stopped again then.
        """
        with self._locked():
            started = self._up_locked(max_array_size, timeout_s, log)
            if started:
                # Started by hand: no test session may stop it.
                self.layout.session_started_marker.unlink(missing_ok=True)
            return started

    def _up_locked(
        self, max_array_size: int, timeout_s: float, log: Callable[[str], None], shared: bool = False
    ) -> bool:
        """Start what is needed; True if the whole cluster was started. ``shared``: others use it now."""
        alive = {r.name for r in self.daemons() if r.alive()}
        if set(self.expected_daemons()) - alive <= {f"slurmd.{node}" for node in self.node_names}:
            log(f"The local SLURM cluster is already up (SLURM_CONF={self.slurm_conf}).")
            if f"MaxArraySize={max_array_size}\n" not in self.slurm_conf.read_text():
                log(f"It was started with another MaxArraySize; `down` and `up` again to get {max_array_size}.")
            dead_nodes = [node for node in self.node_names if f"slurmd.{node}" not in alive]
            if dead_nodes and shared:
                # Another session may have killed it on purpose (a fault test): leave it to that session.
                log(f"Its slurmd of {', '.join(dead_nodes)} is not running; another session uses the cluster.")
            elif dead_nodes:
                log(f"Its slurmd of {', '.join(dead_nodes)} was not running: starting it again.")
                for node in dead_nodes:
                    self._await_node(self._respawn_slurmd_locked(node), node, time.monotonic() + timeout_s)
            return False
        missing = missing_packages()
        if missing:
            raise ClusterError(missing_packages_message(missing))
        if os.geteuid() != 0:
            raise ClusterError(
                "Starting the local SLURM cluster needs root (munged runs as user munge, the fake GPUs are "
                "made with mknod): run `gpudays cluster up` as root, e.g. with sudo."
            )
        if self.daemons():
            log("Some daemons of the last start are gone; stopping the others first.")
            self._down_locked(log=lambda _message: None)
        started = time.monotonic()
        spec = self._prepare(max_array_size)
        try:
            self._start_all(spec, deadline=started + timeout_s)
        except BaseException:
            self._down_locked(log=lambda _message: None)
            raise
        log(
            f"The local SLURM cluster is up in {time.monotonic() - started:.1f} s: nodes "
            f"{', '.join(spec.node_names)}, state in {self.state_dir}.\n"
            "Point SLURM's commands at it with:  eval $(gpudays cluster env)"
        )
        return True

    @contextlib.contextmanager
    def session(self, max_array_size: int = 1001, log: Callable[[str], None] = print) -> Iterator[LocalCluster]:
        """Use the cluster for the length of a ``with`` block (a test session), starting it if it is down.

        Several sessions, in several processes, may share one cluster. A cluster started by a session is
        stopped when the last session using it ends; one started otherwise (``gpudays cluster up``) is left up.
        """
        leases = self.layout.sessions_dir
        started_marker = self.layout.session_started_marker
        lease = leases / f"{os.getpid()}-{_start_ticks(os.getpid())}"
        with self._locked():
            leases.mkdir(exist_ok=True)
            started = self._up_locked(max_array_size, timeout_s=60, log=log, shared=bool(_live_leases(leases)))
            if started:
                started_marker.touch()
            lease.touch()
        try:
            yield self
        finally:
            with self._locked():
                lease.unlink(missing_ok=True)
                if started_marker.exists() and not _live_leases(leases):
                    self._down_locked(log=log)
                    started_marker.unlink(missing_ok=True)

    def _prepare(self, max_array_size: int) -> ClusterSpec:
        """Create the state folder; choose ports; write the configs and the fake GPU devices."""
        paths = self.layout
        # munged (as munge) and MariaDB (as mysql) must reach their folders inside the state folder.
        for parent in paths.state_dir.parents:
            if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
                raise ClusterError(
                    f"{parent} is not searchable by other users, so munged and MariaDB cannot reach "
                    f"{paths.state_dir}. Choose another folder with {STATE_DIR_ENV}."
                )
        for folder in (paths.etc_dir, paths.log_dir, paths.run_dir, paths.spool_dir):
            folder.mkdir(parents=True, exist_ok=True)
        paths.state_dir.chmod(0o755)
        _make_runtime_dir(paths)
        spec = ClusterSpec(
            layout=paths,
            hostname=socket.gethostname(),
            ports=self._choose_ports(),
            num_nodes=len(self.node_names),
            max_array_size=max_array_size,
            real_memory_mib=_host_memory_mib(),
        )
        paths.slurm_conf.write_text(render_slurm_conf(spec))
        paths.gres_conf.write_text(render_gres_conf(spec))
        # slurmdbd refuses a config (it holds the database password) that others may read.
        paths.slurmdbd_conf.touch(mode=0o600)
        paths.slurmdbd_conf.chmod(0o600)
        paths.slurmdbd_conf.write_text(render_slurmdbd_conf(spec))
        for node in spec.node_names:
            for device in paths.gpu_devices(node, spec.gpus_per_node):
                device.parent.mkdir(parents=True, exist_ok=True)
                # slurmd rejects regular files as GPU devices; a character device like /dev/null (1, 3) passes.
                if not device.is_char_device():
                    device.unlink(missing_ok=True)
                    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return spec

    def _choose_ports(self) -> ClusterPorts:
        num_nodes = len(self.node_names)
        if self.layout.ports_file.is_file():
            saved = json.loads(self.layout.ports_file.read_text())
            ports = ClusterPorts(saved["slurmctld"], saved["slurmdbd"], saved["mysql"], tuple(saved["slurmd"]))
            # The same ports keep slurmctld's saved node state valid; only a clash forces new ones.
            if len(ports.slurmd) == num_nodes and all(_port_is_free(p) for p in ports.all()):
                return ports
        chosen = _pick_free_ports(3 + num_nodes)
        ports = ClusterPorts(chosen[0], chosen[1], chosen[2], tuple(chosen[3:]))
        self.layout.ports_file.write_text(json.dumps(asdict(ports), indent=1))
        return ports

    def _start_all(self, spec: ClusterSpec, deadline: float) -> None:
        self._save_daemons([])
        self._start_munged(deadline)
        self._start_mariadb(spec, deadline)
        self._start_slurmdbd(spec, deadline)
        self._start_slurmctld(deadline)
        nodes = [self._spawn_slurmd(node) for node in spec.node_names]
        self._await(
            nodes,
            lambda: self._node_states_or_empty() == dict.fromkeys(spec.node_names, "idle"),
            f"nodes {', '.join(spec.node_names)} to be idle in sinfo",
            self.layout.daemon_log(f"slurmd.{spec.node_names[0]}"),
            deadline,
        )
        dbd = [r for r in self.daemons() if r.name == "slurmdbd"]
        self._await(
            dbd,
            lambda: self._client_ok(["sacct", "-n", "-X", "-a", "-S", "now-1hours", "-o", "JobID"]),
            "sacct to answer",
            self.layout.daemon_log("slurmdbd"),
            deadline,
        )

    def _spawn(self, name: str, argv: Sequence[str], cwd: Path | None = None, **popen_kwargs: object) -> DaemonRecord:
        """Start one daemon in the foreground of its own session; record it in pids.json at once."""
        with self.layout.daemon_stdout(name).open("ab") as out:
            proc = subprocess.Popen(  # type: ignore[call-overload]
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Never the caller's folder, which may be deleted under a running daemon.
                cwd=cwd or self.state_dir,
                env={**os.environ, **self.env()},
                **popen_kwargs,
            )
        _CHILDREN[proc.pid] = proc
        # The child exists once Popen returns; if it has already exited, -1 marks it dead.
        ticks = _start_ticks(proc.pid)
        record = DaemonRecord(name, proc.pid, ticks if ticks is not None else -1)
        self._save_daemons([*self.daemons(), record])
        return record

    def _await(
        self,
        records: Sequence[DaemonRecord],
        ready: Callable[[], bool],
        what: str,
        log_file: Path,
        deadline: float,
    ) -> None:
        """Wait until ``ready()``; fail with the tail of a log if one of ``records`` dies or time runs out."""
        self._last_client_error = ""
        while not ready():
            for record in records:
                if not record.alive():
                    _reap(record.pid)
                    log = self.layout.daemon_log(record.name)
                    raise ClusterError(
                        f"{record.name} exited while waiting for {what}. See {log}:\n{_tail(log)}\n"
                        f"and its stdout in {self.layout.daemon_stdout(record.name)}"
                    )
            if time.monotonic() > deadline:
                said = f"\nThe last command said: {self._last_client_error}" if self._last_client_error else ""
                raise ClusterError(f"Timed out waiting for {what}. See {log_file}:\n{_tail(log_file)}{said}")
            time.sleep(0.1)

    def _client_ok(self, args: Sequence[str]) -> bool:
        try:
            self.run_client(args, timeout_s=10)
        except (ClusterError, subprocess.TimeoutExpired) as error:
            self._last_client_error = str(error)
            return False
        return True

    def _node_states_or_empty(self) -> dict[str, str]:
        try:
            return self.node_states()
        except (ClusterError, subprocess.TimeoutExpired) as error:
            self._last_client_error = str(error)
            return {}

    def _start_munged(self, deadline: float) -> None:
        paths = self.layout
        for folder in (paths.munge_dir, paths.munge_socket.parent):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, "munge", "munge")
            # munged refuses a socket folder others cannot search; its key stays private (mode 600).
            folder.chmod(0o755)
        if not paths.munge_key.is_file():
            subprocess.run(
                [_program("mungekey"), "--create", f"--keyfile={paths.munge_key}"],
                check=True,
                capture_output=True,
                user="munge",
                group="munge",
                extra_groups=[],
            )
        record = self._spawn(
            "munged",
            [
                _program("munged"),
                "--foreground",
                f"--socket={paths.munge_socket}",
                f"--key-file={paths.munge_key}",
                f"--pid-file={paths.munge_dir / 'munged.pid'}",
                f"--log-file={paths.daemon_log('munged')}",
                f"--seed-file={paths.munge_dir / 'munged.seed'}",
            ],
            user="munge",
            group="munge",
            extra_groups=[],
        )
        munge = [_program("munge"), "-n", f"--socket={paths.munge_socket}"]
        self._await(
            [record],
            lambda: paths.munge_socket.exists() and subprocess.run(munge, capture_output=True).returncode == 0,
            "munged to answer on its socket",
            paths.daemon_log("munged"),
            deadline,
        )

    def _mariadb(self, sql: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_program("mariadb"), "--no-defaults", f"--socket={self.layout.mysql_socket}", "-uroot", "-e", sql],
            capture_output=True,
            text=True,
            check=False,
        )

    def _start_mariadb(self, spec: ClusterSpec, deadline: float) -> None:
        paths = self.layout
        for folder in (paths.mysql_dir, paths.mysql_socket.parent):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, "mysql", "mysql")
        if not (paths.mysql_data_dir / "mysql").is_dir():
            install = subprocess.run(
                [
                    _program("mariadb-install-db"),
                    "--no-defaults",
                    f"--datadir={paths.mysql_data_dir}",
                    "--user=mysql",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if install.returncode != 0:
                raise ClusterError(
                    f"mariadb-install-db failed in {paths.mysql_data_dir}:\n{install.stdout}{install.stderr}"
                )
        record = self._spawn(
            "mariadbd",
            [
                _program("mariadbd"),
                "--no-defaults",
                "--user=mysql",
                f"--datadir={paths.mysql_data_dir}",
                f"--socket={paths.mysql_socket}",
                f"--port={spec.ports.mysql}",
                "--bind-address=127.0.0.1",
                f"--pid-file={paths.mysql_dir / 'mysqld.pid'}",
                f"--log-error={paths.daemon_log('mariadbd')}",
                "--skip-name-resolve",
                # The sizes slurmdbd checks for at its start (it logs an error otherwise).
                "--innodb-buffer-pool-size=128M",
                "--innodb-log-file-size=64M",
                "--innodb-lock-wait-timeout=900",
            ],
        )
        self._await(
            [record],
            lambda: self._mariadb("SELECT 1").returncode == 0,
            "MariaDB to answer on its socket",
            paths.daemon_log("mariadbd"),
            deadline,
        )
        # Idempotent, so that a data folder kept from an earlier start needs nothing special.
        grant = self._mariadb(
            f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
        )
        if grant.returncode != 0:
            raise ClusterError(f"Could not create the accounting database in MariaDB: {grant.stderr}")

    def _start_slurmdbd(self, spec: ClusterSpec, deadline: float) -> None:
        record = self._spawn("slurmdbd", [_program("slurmdbd"), "-D"])
        list_clusters = ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"]
        self._await(
            [record],
            lambda: self._client_ok(list_clusters),
            "slurmdbd to answer sacctmgr",
            self.layout.daemon_log("slurmdbd"),
            deadline,
        )
        # slurmctld sends job records only for a cluster that slurmdbd knows.
        if spec.cluster_name not in self.run_client(list_clusters).split():
            self.run_client(["sacctmgr", "-i", "add", "cluster", spec.cluster_name])

    def _start_slurmctld(self, deadline: float) -> None:
        record = self._spawn("slurmctld", [_program("slurmctld"), "-D"])
        self._await(
            [record],
            lambda: self._client_ok(["scontrol", "ping"]),
            "slurmctld to answer `scontrol ping`",
            self.layout.daemon_log("slurmctld"),
            deadline,
        )

    def _spawn_slurmd(self, node: str) -> DaemonRecord:
        spool = self.layout.slurmd_spool(node)
        spool.mkdir(parents=True, exist_ok=True)
        # Its job steps (slurmstepd) inherit this working folder: that is how _job_step_pids finds them.
        return self._spawn(f"slurmd.{node}", [_program("slurmd"), "-D", "-N", node], cwd=spool)

    # Node faults (for tests) -------------------------------------------------------------------------------
    def kill_node(self, node: str, with_jobs: bool = True) -> None:
        """SIGKILL ``node``'s slurmd, and with ``with_jobs`` its job steps too, like a machine that died.

        slurmctld sets the node DOWN after SlurmdTimeout (20 s) and its jobs end NODE_FAIL (then they are
        requeued unless submitted with ``--no-requeue``).
        """
        self._check_node(node)
        records = [r for r in self.daemons() if r.name == f"slurmd.{node}" and r.alive()]
        if not records:
            raise ClusterError(f"{node} has no running slurmd (see {self.layout.pids_file}).")
        _kill([records[0].pid, *(self._job_step_pids(node) if with_jobs else [])])
        _wait_until(lambda: _gone(records[0]), 10, 0.05)

    def start_node(self, node: str, timeout_s: float = 30) -> None:
        """Start ``node``'s slurmd again (after :meth:`kill_node`) and wait until the node is back in service."""
        self._check_node(node)
        with self._locked():
            record = self._respawn_slurmd_locked(node)
        self._await_node(record, node, time.monotonic() + timeout_s)

    def _respawn_slurmd_locked(self, node: str) -> DaemonRecord:
        records = self.daemons()
        running = [r for r in records if r.name == f"slurmd.{node}" and r.alive()]
        if running:
            return running[0]
        self._save_daemons([r for r in records if r.name != f"slurmd.{node}"])
        return self._spawn_slurmd(node)

    def _await_node(self, record: DaemonRecord, node: str, deadline: float) -> None:
        in_service = ("idle", "mix", "alloc")
        self._await(
            [record],
            lambda: self._node_states_or_empty().get(node) in in_service,
            f"{node} to be back in service in sinfo",
            self.layout.daemon_log(f"slurmd.{node}"),
            deadline,
        )

    def _check_node(self, node: str) -> None:
        if node not in self.node_names:
            raise ClusterError(f"Unknown node {node!r}: this cluster has {', '.join(self.node_names)}.")

    def _job_step_pids(self, node: str) -> list[int]:
        """The slurmstepd processes of ``node``, found by their working folder, and all their descendants."""
        spool = str(self.layout.slurmd_spool(node))
        found: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().startswith("slurmstepd") and os.readlink(entry / "cwd") == spool:
                    found += [int(entry.name), *_descendants(int(entry.name))]
            except OSError:
                continue
        return found

    # down ----------------------------------------------------------------------------------------------------------
    def down(self, purge: bool = False, timeout_s: float = 30, log: Callable[[str], None] = print) -> None:
        """Cancel every job, stop every daemon ``up`` started (newest first) and wait until each has exited.

        ``purge`` also deletes the state folder: accounting, job ids, logs.
        """
        if self.state_dir.is_dir():
            with self._locked():
                self._down_locked(timeout_s, log)
        if purge and self.state_dir.exists():
            shutil.rmtree(self.layout.runtime_dir, ignore_errors=True)
            shutil.rmtree(self.state_dir)
            log(f"Deleted {self.state_dir}.")

    def _down_locked(self, timeout_s: float = 30, log: Callable[[str], None] = print) -> None:
        self.layout.session_started_marker.unlink(missing_ok=True)
        alive = [r for r in self.daemons() if r.alive()]
        if not alive:
            log(f"The local SLURM cluster is not running ({self.state_dir}).")
            self._save_daemons([])
            return
        started = time.monotonic()
        cancelled = self._cancel_all_jobs() if any(r.name == "slurmctld" for r in alive) else ""
        for record in reversed(alive):
            node = record.name.removeprefix("slurmd.") if record.name.startswith("slurmd.") else None
            _stop(record, timeout_s)
            # Job steps outlive their slurmd; a stopped cluster leaves none running.
            if node is not None:
                _kill(self._job_step_pids(node))
        self._save_daemons([])
        log(
            f"The local SLURM cluster is down: {cancelled}{len(alive)} daemons stopped "
            f"in {time.monotonic() - started:.1f} s."
        )

    def _cancel_all_jobs(self) -> str:
        """scancel every job and let the steps end, so that no slurmd is stopped under a running job.

        Returns what was done, for the log (empty when there was no job).
        """
        try:
            job_ids = self.run_client(["squeue", "-h", "-o", "%A"], timeout_s=10, check=False).split()
            if not job_ids:
                return ""
            started = time.monotonic()
            self.run_client(["scancel", "--full", *job_ids], timeout_s=10, check=False)
            # A step launched by srun may linger for seconds, retrying to reach its killed srun; what is still
            # there after a few seconds is killed with its slurmd.
            ended = _wait_until(
                lambda: self.run_client(["squeue", "-h", "-t", "R,CG", "-o", "%A"], 10, check=False).strip() == "",
                5,
                0.2,
            )
            waited = f"{time.monotonic() - started:.1f} s" if ended else "gave up waiting after 5 s"
            return f"cancelled {len(job_ids)} jobs ({waited}); "
        except subprocess.TimeoutExpired:
            return "squeue or scancel did not answer; "


# --------------------------------------------------------------------------------------------------------------
# Command line: gpudays cluster up | down | status | env
# --------------------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """``gpudays cluster SUBCOMMAND [OPTIONS]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="gpudays cluster",
        description="A throwaway real SLURM cluster on this machine, for trying and testing gpudays. "
        f"State in ${STATE_DIR_ENV} (default {DEFAULT_STATE_DIR}).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start munged, MariaDB, slurmdbd, slurmctld and the nodes")
    up.add_argument("--max-array-size", type=int, default=1001, help="SLURM's MaxArraySize (default 1001)")
    up.add_argument("--timeout-s", type=float, default=60, help="give up after this many seconds (default 60)")
    down = sub.add_parser("down", help="stop exactly what `up` started")
    down.add_argument("--purge", action="store_true", help="also delete the state folder (accounting, logs)")
    sub.add_parser("status", help="each daemon with pid and alive/dead, and sinfo; exit 1 when not up")
    sub.add_parser("env", help="print `export SLURM_CONF=...`; use as: eval $(gpudays cluster env)")
    args = parser.parse_args(argv)

    cluster = LocalCluster()
    try:
        if args.command == "up":
            cluster.up(max_array_size=args.max_array_size, timeout_s=args.timeout_s)
        elif args.command == "down":
            cluster.down(purge=args.purge)
        elif args.command == "env":
            for key, value in cluster.env().items():
                print(f"export {key}={value}")
        else:
            return _print_status(cluster.status())
    except (ClusterError, ValueError) as error:
        print(f"gpudays cluster {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


def _print_status(status: dict[str, object]) -> int:
    print(f"state folder: {status['state_dir']}")
    print(f"SLURM_CONF:   {status['slurm_conf']}")
    print(f"sockets in:   {status['runtime_dir']}")
    print(f"cluster:      {'up' if status['up'] else 'down'}")
    for daemon in status["daemons"]:  # type: ignore[attr-defined]
        print(f"  {daemon['name']:<14} pid {daemon['pid']:<8} {'alive' if daemon['alive'] else 'dead'}")
    if status["sinfo"]:
        print(str(status["sinfo"]).rstrip())
    return 0 if status["up"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
