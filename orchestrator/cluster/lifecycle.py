"""The local cluster's life: ``up``, ``down``, shared use by test sessions, and node faults for tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
from filelock import FileLock

import orchestrator.cluster.processes as processes
from orchestrator.cluster.client import SlurmClient
from orchestrator.cluster.config import (
    MAX_JOB_ID,
    ClusterSpec,
    node_names,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
)
from orchestrator.cluster.daemons import DaemonSet
from orchestrator.cluster.layout import DEFAULT_STATE_DIR, STATE_DIR_ENV, ClusterError, ClusterLayout
from orchestrator.cluster.packages import missing_packages, missing_packages_message
from orchestrator.cluster.ports import choose_ports
from orchestrator.cluster.processes import DaemonRecord
from orchestrator.store.durable import write_text_atomic


def _quiet(_message: str) -> None:
    pass


class LocalCluster:
    """A SLURM cluster of ``num_nodes`` nodes on this machine, living in ``state_dir``.

    ``up``, ``down`` and the node faults need root (munged runs as user munge, the fake GPUs are made with
    mknod); SLURM's commands, and submitit, find the cluster through the variables of :meth:`env`.
    """

    def __init__(
        self, state_dir: Path | str | None = None, num_nodes: int = 2, job_ids: tuple[int, int] = (1, MAX_JOB_ID)
    ) -> None:
        if state_dir is None:
            state_dir = os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        self.layout = ClusterLayout(Path(state_dir))
        self.node_names = node_names(num_nodes)
        self.job_ids = job_ids
        """Its jobs' ids (:attr:`ClusterSpec.job_ids`): clusters sharing this host get ranges of their own."""
        self.client = SlurmClient(self.layout)
        self._daemons = DaemonSet(self.layout, self.client)

    @property
    def state_dir(self) -> Path:
        return self.layout.state_dir

    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    # Clients ---------------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment variables that point SLURM's commands (and submitit) at this cluster."""
        return self.client.env()

    def run_client(self, args: Sequence[str], timeout_s: float = 30, check: bool = True) -> str:
        """Run a SLURM command such as ``["sinfo", "-N"]`` against this cluster and return its stdout.

        With ``check``, a non-zero exit raises ClusterError with the command's stderr.
        """
        return self.client.run(args, timeout_s=timeout_s, check=check)

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` in the default partition as sinfo prints it (``idle``, ``mix``, ``down*``, ...)."""
        return self.client.node_states()

    # State -----------------------------------------------------------------------------------------------------
    def daemons(self) -> list[DaemonRecord]:
        """The daemons recorded by the last ``up`` (and node restarts), in start order."""
        return self._daemons.records()

    def expected_daemons(self) -> list[str]:
        """Names of the daemons a running cluster has, in start order."""
        return ["munged", "mariadbd", "slurmdbd", "slurmctld", *(f"slurmd.{node}" for node in self.node_names)]

    def is_up(self) -> bool:
        """True when every daemon of a complete start is running."""
        records = self.daemons()
        return sorted(r.name for r in records) == sorted(self.expected_daemons()) and all(r.alive() for r in records)

    def status(self) -> dict[str, object]:
        """``state_dir``, ``slurm_conf``, ``runtime_dir``, ``up``, ``daemons`` (name, pid, alive; in the order a
        complete start starts them, whichever node was restarted since), ``sinfo``."""
        order = {name: i for i, name in enumerate(self.expected_daemons())}
        records = sorted(self.daemons(), key=lambda r: order.get(r.name, len(order)))
        daemons = [{"name": r.name, "pid": r.pid, "alive": r.alive()} for r in records]
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
        with FileLock(self.layout.lock_file):
            yield

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
            self._say_already_up(alive, max_array_size, timeout_s, log, shared)
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
            self._down_locked(log=_quiet)
        started = time.monotonic()
        spec = self._prepare(max_array_size)
        try:
            left_behind = self._daemons.start_all(spec, deadline=started + timeout_s)
        except BaseException:
            self._down_locked(log=_quiet)
            raise
        if left_behind:
            log(
                f"The cluster was last stopped without `gpudays cluster down`: cancelled the {len(left_behind)} "
                f"jobs it had left queued or running ({', '.join(left_behind[:10])}"
                f"{', ...' if len(left_behind) > 10 else ''})."
            )
        log(
            f"The local SLURM cluster is up in {time.monotonic() - started:.1f} s: nodes "
            f"{', '.join(spec.node_names)}, state in {self.state_dir}, sockets in {self.layout.runtime_dir}.\n"
            "Point SLURM's commands at it with:  eval $(gpudays cluster env)"
        )
        return True

    def _say_already_up(
        self, alive: set[str], max_array_size: int, timeout_s: float, log: Callable[[str], None], shared: bool
    ) -> None:
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
                record = self._daemons.respawn_slurmd(node)
                self._daemons.await_node(record, node, time.monotonic() + timeout_s)

    @contextlib.contextmanager
    def session(self, max_array_size: int = 1001, log: Callable[[str], None] = print) -> Iterator[LocalCluster]:
        """Use the cluster for the length of a ``with`` block (a test session), starting it if it is down.

        Several sessions, in several processes, may share one cluster. A cluster started by a session is
        stopped when the last session using it ends; one started otherwise (``gpudays cluster up``) is left up.
        """
        leases = self.layout.sessions_dir
        started_marker = self.layout.session_started_marker
        lease = leases / _lease_name(os.getpid())
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
        """Create the state and runtime folders; choose ports; write the configs and the fake GPU devices."""
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
        paths.make_runtime_dir()
        spec = ClusterSpec(
            layout=paths,
            hostname=socket.gethostname(),
            ports=choose_ports(paths, len(self.node_names)),
            num_nodes=len(self.node_names),
            max_array_size=max_array_size,
            real_memory_mib=processes.host_memory_mib(),
            job_ids=self.job_ids,
        )
        write_text_atomic(paths.slurm_conf, render_slurm_conf(spec))
        write_text_atomic(paths.gres_conf, render_gres_conf(spec))
        # slurmdbd refuses a config (it holds the database password) that others may read.
        paths.slurmdbd_conf.touch(mode=0o600)
        paths.slurmdbd_conf.chmod(0o600)
        write_text_atomic(paths.slurmdbd_conf, render_slurmdbd_conf(spec))
        for node in spec.node_names:
            for device in paths.gpu_devices(node, spec.gpus_per_node):
                device.parent.mkdir(parents=True, exist_ok=True)
                # slurmd rejects regular files as GPU devices; a character device like /dev/null (1, 3) passes.
                if not device.is_char_device():
                    device.unlink(missing_ok=True)
                    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return spec

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
        spool = processes.working_folder(records[0].pid)
        processes.kill([records[0].pid, *(self._daemons.job_step_pids(node, spool) if with_jobs else [])])
        processes.wait_until(lambda: processes.gone(records[0]), 10, 0.05)

    def start_node(self, node: str, timeout_s: float = 30) -> None:
        """Start ``node``'s slurmd again (after :meth:`kill_node`) and wait until the node is back in service."""
        self._check_node(node)
        with self._locked():
            record = self._daemons.respawn_slurmd(node)
        self._daemons.await_node(record, node, time.monotonic() + timeout_s)

    def _check_node(self, node: str) -> None:
        if node not in self.node_names:
            raise ClusterError(f"Unknown node {node!r}: this cluster has {', '.join(self.node_names)}.")

    # down ----------------------------------------------------------------------------------------------------------
    def down(self, purge: bool = False, timeout_s: float = 30, log: Callable[[str], None] = print) -> None:
        """Cancel every job, stop every daemon ``up`` started (newest first) and wait until each has exited.

        ``purge`` also deletes the state folder (accounting, job ids, logs) and the runtime folder.
        """
        if self.state_dir.is_dir():
            with self._locked():
                self._down_locked(timeout_s, log)
        if purge and self.state_dir.exists():
            if not self.layout.runtime_dir.is_symlink():
                shutil.rmtree(self.layout.runtime_dir, ignore_errors=True)
            shutil.rmtree(self.state_dir)
            log(f"Deleted {self.state_dir}.")

    def _down_locked(self, timeout_s: float = 30, log: Callable[[str], None] = print) -> None:
        self.layout.session_started_marker.unlink(missing_ok=True)
        alive = [r for r in self.daemons() if r.alive()]
        if not alive:
            log(f"The local SLURM cluster is not running ({self.state_dir}).")
            self._daemons.save([])
            return
        started = time.monotonic()
        cancelled = self._cancel_all_jobs() if any(r.name == "slurmctld" for r in alive) else ""
        for record in reversed(alive):
            spool = processes.working_folder(record.pid)
            processes.stop(record, timeout_s)
            # Job steps outlive their slurmd; a stopped cluster leaves none running.
            if record.name.startswith("slurmd."):
                processes.kill(self._daemons.job_step_pids(record.name.removeprefix("slurmd."), spool))
        self._daemons.save([])
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
            ended = processes.wait_until(
                lambda: self.run_client(["squeue", "-h", "-t", "R,CG", "-o", "%A"], 10, check=False).strip() == "",
                5,
                0.2,
            )
            waited = f"{time.monotonic() - started:.1f} s" if ended else "gave up waiting after 5 s"
            return f"cancelled {len(job_ids)} jobs ({waited}); "
        except subprocess.TimeoutExpired:
            return "squeue or scancel did not answer; "


def _lease_name(pid: int) -> str:
    """A session's lease: its pid and start time (whole seconds), so that a reused pid is not taken for it."""
    started_at = processes.start_time(pid)
    return f"{pid}-{int(started_at or 0)}"


def _live_leases(folder: Path) -> list[Path]:
    """Session leases (named PID-STARTTIME) in ``folder`` whose process still runs; stale ones are removed."""
    live = []
    for lease in folder.glob("[0-9]*-[0-9]*"):
        pid, _, started = lease.name.partition("-")
        if pid.isdigit() and started.isdigit() and _lease_is_live(int(pid), int(started)):
            live.append(lease)
        else:
            lease.unlink(missing_ok=True)
    return live


def _lease_is_live(pid: int, started: int) -> bool:
    # The name keeps whole seconds: a start within a second of it is the same process. Leases written by an
    # earlier version hold clock ticks since boot instead; a session of that version may share the cluster.
    since_boot = psutil.boot_time() + started / os.sysconf("SC_CLK_TCK")
    return processes.is_running(pid, started + 0.5) or processes.is_running(pid, since_boot)
