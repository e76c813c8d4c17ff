"""Every path of a local cluster: its state folder, and the short runtime folder that holds its sockets."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("/tmp/gpudays-cluster")
STATE_DIR_ENV = "GPUDAYS_CLUSTER_DIR"
# Unix socket paths (sun_path) hold at most 107 bytes and a NUL. slurmstepd names its sockets
# SPOOL/NODE_JOBID.STEPID, with ids of up to 10 digits each: the spool folders must stay short.
MAX_SOCKET_PATH_BYTES = 107
RUNTIME_ROOT = Path("/tmp")


class ClusterError(RuntimeError):
    """The local cluster could not be started, stopped or queried; the message says why and where to look."""


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
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def mysql_dir(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def mysql_data_dir(self) -> Path:
        return self.mysql_dir / "data"

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
        """One empty file per process using the cluster through ``LocalCluster.session`` (named PID-STARTTIME)."""
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

    # The runtime folder --------------------------------------------------------------------------------------
    @property
    def runtime_dir(self) -> Path:
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:8]
        return self.runtime_root / f"gd-{digest}"

    @property
    def runtime_link(self) -> Path:
        """A symbolic link in the state folder to :attr:`runtime_dir`: where to find the sockets."""
        return self.state_dir / "runtime"

    @property
    def munge_socket(self) -> Path:
        return self.runtime_dir / "munge" / "munge.socket"

    @property
    def mysql_socket(self) -> Path:
        return self.runtime_dir / "mysql" / "mysqld.sock"

    def slurmd_spool(self, node: str) -> Path:
        return self.runtime_dir / "spool" / f"slurmd.{node}"

    def longest_socket_path(self, node: str) -> Path:
        """The longest socket path a job step on ``node`` may make (job and step ids of 10 digits)."""
        return self.slurmd_spool(node) / f"{node}_4294967294.4294967294"

    def make_runtime_dir(self) -> None:
        """Create the runtime folder and its link in the state folder; refuse one that someone else made."""
        runtime = self.runtime_dir
        with contextlib.suppress(FileExistsError):
            runtime.mkdir(mode=0o755)
        info = runtime.lstat()
        # /tmp is writable by all: a folder or link planted there by another user must not receive our sockets.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise ClusterError(
                f"{runtime}, the runtime folder of {self.state_dir}, exists but is not a folder owned by this "
                "user. Remove it, or choose another state folder."
            )
        runtime.chmod(0o755)
        link = self.runtime_link
        if link.is_symlink() and Path(os.readlink(link)) == runtime:
            return
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(runtime)
