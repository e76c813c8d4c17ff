"""The cluster's daemons: munged, MariaDB, slurmdbd, slurmctld and one slurmd per node.

Each is started in the foreground of its own session and recorded at once in ``pids.json`` (pid and start time),
which is what ``down`` stops; each start waits until the daemon answers, and fails with the tail of its log if
it dies or does not answer in time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orchestrator.cluster.processes as processes
from orchestrator.cluster.client import SlurmClient
from orchestrator.cluster.config import DB, ClusterSpec
from orchestrator.cluster.layout import ClusterError, ClusterLayout
from orchestrator.cluster.packages import program
from orchestrator.cluster.processes import DaemonRecord
from orchestrator.store.durable import write_json_atomic

IN_SERVICE_STATES = ("idle", "mix", "alloc")


class DaemonSet:
    """Starts the daemons of one cluster and keeps their records."""

    def __init__(self, layout: ClusterLayout, client: SlurmClient) -> None:
        self.layout = layout
        self.client = client

    # Records ---------------------------------------------------------------------------------------------------
    def records(self) -> list[DaemonRecord]:
        """The daemons recorded by the last ``up`` (and node restarts), in start order."""
        if not self.layout.pids_file.is_file():
            return []
        return [DaemonRecord.from_json(entry) for entry in json_list(self.layout.pids_file)]

    def save(self, records: Sequence[DaemonRecord]) -> None:
        write_json_atomic(self.layout.pids_file, [asdict(r) for r in records])

    def spawn(self, name: str, argv: Sequence[str], cwd: Path | None = None, **popen_kwargs: Any) -> DaemonRecord:
        """Start one daemon; record it in pids.json at once."""
        pid, started_at = processes.spawn(
            list(argv),
            stdout=self.layout.daemon_stdout(name),
            # Never the caller's folder, which may be deleted under a running daemon.
            cwd=cwd or self.layout.state_dir,
            env={**os.environ, **self.client.env()},
            **popen_kwargs,
        )
        record = DaemonRecord(name, pid, started_at)
        self.save([*self.records(), record])
        return record

    def await_ready(
        self, records: Sequence[DaemonRecord], ready: Callable[[], bool], what: str, log_file: Path, deadline: float
    ) -> None:
        """Wait until ``ready()``; fail with the tail of a log if one of ``records`` dies or time runs out."""
        self.client.last_error = ""
        while not ready():
            for record in records:
                if not record.alive():
                    processes.reap(record.pid)
                    log = self.layout.daemon_log(record.name)
                    raise ClusterError(
                        f"{record.name} exited while waiting for {what}. See {log}:\n{processes.tail(log)}\n"
                        f"and its stdout in {self.layout.daemon_stdout(record.name)}"
                    )
            if time.monotonic() > deadline:
                said = f"\nThe last command said: {self.client.last_error}" if self.client.last_error else ""
                raise ClusterError(f"Timed out waiting for {what}. See {log_file}:\n{processes.tail(log_file)}{said}")
            time.sleep(0.1)

    # Starting everything ---------------------------------------------------------------------------------------
    def start_all(self, spec: ClusterSpec, deadline: float) -> list[str]:
        """Start every daemon in order; return once every node is idle and sacct answers.

        Returns the ids of the jobs that a cluster stopped without ``down`` (killed, or its machine restarted) had
        left queued or running, which slurmctld recovered and this start cancelled.
        """
        self.save([])
        self.start_munged(deadline)
        self.start_mariadb(spec, deadline)
        self.start_slurmdbd(spec, deadline)
        self.start_slurmctld(deadline)
        left_behind = self.cancel_jobs_left_behind(spec)
        nodes = [self.spawn_slurmd(node) for node in spec.node_names]
        self.await_ready(
            nodes,
            lambda: self.client.node_states_or_empty() == dict.fromkeys(spec.node_names, "idle"),
            f"nodes {', '.join(spec.node_names)} to be idle in sinfo",
            self.layout.daemon_log(f"slurmd.{spec.node_names[0]}"),
            deadline,
        )
        dbd = [r for r in self.records() if r.name == "slurmdbd"]
        self.await_ready(
            dbd,
            lambda: self.client.ok(["sacct", "-n", "-X", "-a", "-S", "now-1hours", "-o", "JobID"]),
            "sacct to answer",
            self.layout.daemon_log("slurmdbd"),
            deadline,
        )
        return left_behind

    def cancel_jobs_left_behind(self, spec: ClusterSpec) -> list[str]:
        """Cancel every job slurmctld recovered from its saved state, before any slurmd has registered.

        Such jobs belong to a cluster that was not stopped with ``down``: their processes died with it, or are
        killed here (job steps outlive their slurmd). Left alone, a recovered job holds its node until SLURM gives
        up on it, and a recovered pending job would start on the new cluster. Cancelled, each ends CANCELLED in
        sacct, and job ids go on from where they were.
        """
        for node in spec.node_names:
            processes.kill(self.job_step_pids(node))
        job_ids = self.client.run(["squeue", "-h", "-o", "%A"], timeout_s=10).split()
        if job_ids:
            self.client.run(["scancel", *job_ids], timeout_s=10, check=False)
        return job_ids

    def start_munged(self, deadline: float) -> None:
        paths = self.layout
        for folder in (paths.munge_dir, paths.munge_socket.parent):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, "munge", "munge")
            # munged refuses a socket folder others cannot search; its key stays private (mode 600).
            folder.chmod(0o755)
        if not paths.munge_key.is_file():
            subprocess.run(
                [program("mungekey"), "--create", f"--keyfile={paths.munge_key}"],
                check=True,
                capture_output=True,
                user="munge",
                group="munge",
                extra_groups=[],
            )
        record = self.spawn(
            "munged",
            [
                program("munged"),
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
        munge = [program("munge"), "-n", f"--socket={paths.munge_socket}"]
        self.await_ready(
            [record],
            lambda: paths.munge_socket.exists() and subprocess.run(munge, capture_output=True).returncode == 0,
            "munged to answer on its socket",
            paths.daemon_log("munged"),
            deadline,
        )

    def mariadb(self, sql: str) -> subprocess.CompletedProcess[str]:
        """Run ``sql`` as MariaDB's root, over its socket."""
        return subprocess.run(
            [program("mariadb"), "--no-defaults", f"--socket={self.layout.mysql_socket}", "-uroot", "-e", sql],
            capture_output=True,
            text=True,
            check=False,
        )

    def start_mariadb(self, spec: ClusterSpec, deadline: float) -> None:
        paths = self.layout
        for folder in (paths.mysql_dir, paths.mysql_socket.parent):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, "mysql", "mysql")
        if not (paths.mysql_data_dir / "mysql").is_dir():
            install = subprocess.run(
                [
                    program("mariadb-install-db"),
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
        record = self.spawn(
            "mariadbd",
            [
                program("mariadbd"),
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
        self.await_ready(
            [record],
            lambda: self.mariadb("SELECT 1").returncode == 0,
            "MariaDB to answer on its socket",
            paths.daemon_log("mariadbd"),
            deadline,
        )
        # Idempotent, so that a data folder kept from an earlier start needs nothing special.
        grant = self.mariadb(
            f"CREATE DATABASE IF NOT EXISTS {DB.name}; "
            f"CREATE USER IF NOT EXISTS '{DB.user}'@'127.0.0.1' IDENTIFIED BY '{DB.password}'; "
            f"GRANT ALL ON {DB.name}.* TO '{DB.user}'@'127.0.0.1';"
        )
        if grant.returncode != 0:
            raise ClusterError(f"Could not create the accounting database in MariaDB: {grant.stderr}")

    def start_slurmdbd(self, spec: ClusterSpec, deadline: float) -> None:
        record = self.spawn("slurmdbd", [program("slurmdbd"), "-D"])
        list_clusters = ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"]
        self.await_ready(
            [record],
            lambda: self.client.ok(list_clusters),
            "slurmdbd to answer sacctmgr",
            self.layout.daemon_log("slurmdbd"),
            deadline,
        )
        # slurmctld sends job records only for a cluster that slurmdbd knows.
        if spec.cluster_name not in self.client.run(list_clusters).split():
            self.client.run(["sacctmgr", "-i", "add", "cluster", spec.cluster_name])

    def start_slurmctld(self, deadline: float) -> None:
        record = self.spawn("slurmctld", [program("slurmctld"), "-D"])
        self.await_ready(
            [record],
            lambda: self.client.ok(["scontrol", "ping"]),
            "slurmctld to answer `scontrol ping`",
            self.layout.daemon_log("slurmctld"),
            deadline,
        )

    # Nodes -----------------------------------------------------------------------------------------------------
    def spawn_slurmd(self, node: str) -> DaemonRecord:
        spool = self.layout.slurmd_spool(node)
        spool.mkdir(parents=True, exist_ok=True)
        # Its job steps (slurmstepd) inherit this working folder: that is how job_step_pids finds them.
        return self.spawn(f"slurmd.{node}", [program("slurmd"), "-D", "-N", node], cwd=spool)

    def respawn_slurmd(self, node: str) -> DaemonRecord:
        """Start ``node``'s slurmd unless it runs; replaces its record (call with the state folder locked)."""
        records = self.records()
        running = [r for r in records if r.name == f"slurmd.{node}" and r.alive()]
        if running:
            return running[0]
        self.save([r for r in records if r.name != f"slurmd.{node}"])
        return self.spawn_slurmd(node)

    def await_node(self, record: DaemonRecord, node: str, deadline: float) -> None:
        self.await_ready(
            [record],
            lambda: self.client.node_states_or_empty().get(node) in IN_SERVICE_STATES,
            f"{node} to be back in service in sinfo",
            self.layout.daemon_log(f"slurmd.{node}"),
            deadline,
        )

    def job_step_pids(self, node: str, spool: Path | None = None) -> list[int]:
        """The slurmstepd processes of ``node``, found by their working folder, and all their descendants.

        ``spool``: the folder its slurmd runs in, when known (a cluster started by an earlier version kept it in
        the state folder); by default the one of :class:`ClusterLayout`.
        """
        return processes.processes_in(spool or self.layout.slurmd_spool(node), "slurmstepd")


def json_list(path: Path) -> list[dict[str, Any]]:
    entries = json.loads(path.read_text())
    if not isinstance(entries, list):
        raise ClusterError(f"{path} should hold a list of daemons; remove it if no daemon of it runs.")
    return entries
