"""The local SLURM cluster (`gpudays cluster`), run for real: nodes, srun across nodes, accounting, GPUs,
time limits, preemption, node faults, and a full up/down of a second cluster in its own folder."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.cluster import LocalCluster, main

pytestmark = pytest.mark.slurm

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


def sbatch(cluster: LocalCluster, script: str, *options: str, wait: bool = True, timeout_s: float = 60) -> str:
    """Submit ``script`` (bash) with ``options``; with ``wait``, return only once the job has left the queue."""
    argv = ["sbatch", "--parsable", *options, "--wrap", script]
    result = subprocess.run(argv, env={**os.environ, **cluster.env()}, capture_output=True, text=True, check=False)
    job_id = result.stdout.strip().split(";")[0]
    assert job_id, f"sbatch {' '.join(options)} submitted nothing: {result.stderr}"
    # Not `sbatch --wait`: it polls at growing intervals (up to 30 s apart), which makes slow tests slower.
    deadline = time.monotonic() + timeout_s
    while wait and cluster.run_client(["squeue", "-h", "-j", job_id, "-o", "%A"], check=False).strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued or running after {timeout_s} s"
        time.sleep(0.5)
    return job_id


def sacct(cluster: LocalCluster, job_id: str, fields: str, timeout_s: float = 20) -> list[dict[str, str]]:
    """sacct's rows for ``job_id``, every attempt (-D), each allocation before its steps, as ``{field: value}``.

    Returns once an allocation row has a final state: slurmctld sends job records to slurmdbd asynchronously,
    so a job that just ended may need a moment. ``fields`` must include JobID and State.
    """
    deadline = time.monotonic() + timeout_s
    names = fields.split(",")
    while True:
        out = cluster.run_client(["sacct", "-n", "-P", "-D", "-j", job_id, "-o", fields])
        rows = [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines() if line]
        final = [r for r in rows if r["JobID"] == job_id and r["State"].split()[0] in TERMINAL_STATES]
        if final:
            return rows
        assert time.monotonic() < deadline, f"sacct has no final state for job {job_id} after {timeout_s} s: {rows}"
        time.sleep(0.5)


def wait_for_idle_nodes(cluster: LocalCluster, timeout_s: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while (states := cluster.node_states()) != {"node1": "idle", "node2": "idle"} and time.monotonic() < deadline:
        time.sleep(0.5)
    return states


def test_both_nodes_are_idle_with_four_fake_gpus(slurm_cluster: LocalCluster) -> None:
    assert wait_for_idle_nodes(slurm_cluster) == {"node1": "idle", "node2": "idle"}
    out = slurm_cluster.run_client(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N|%c|%G|%P"])
    rows = [line.split("|") for line in out.splitlines()]
    assert [row[0] for row in rows] == ["node1", "node2"]
    for _node, cpus, gres, partition in rows:
        assert int(cpus) >= 4
        assert gres == "gpu:a100:4"
        assert partition == "debug*"  # the default partition


def test_up_again_is_a_no_op_and_status_lists_every_daemon(slurm_cluster: LocalCluster) -> None:
    pids_before = [r.pid for r in slurm_cluster.daemons()]
    messages: list[str] = []
    slurm_cluster.up(log=messages.append)
    assert "already up" in messages[0]
    assert [r.pid for r in slurm_cluster.daemons()] == pids_before

    status = slurm_cluster.status()
    assert status["up"] is True
    names = [d["name"] for d in status["daemons"]]  # type: ignore[attr-defined]
    assert names == ["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd.node1", "slurmd.node2"]
    assert all(d["alive"] for d in status["daemons"])  # type: ignore[attr-defined]
    assert "node1" in str(status["sinfo"]) and "node2" in str(status["sinfo"])


def test_two_node_job_runs_one_task_per_node_that_can_reach_each_other(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    # Rank 0 listens on SLURM_LAUNCH_NODE_IPADDR, rank 1 connects to it: what multi-node probes rely on.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    task = tmp_path / "task.py"
    task.write_text(
        f"""
import json, os, socket, time
keys = ["SLURM_PROCID", "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_JOB_NODELIST",
        "SLURM_NTASKS", "SLURM_NODEID"]
seen = {{k: os.environ.get(k) for k in keys}}
addr, port = os.environ["SLURM_LAUNCH_NODE_IPADDR"], {port}
if seen["SLURM_PROCID"] == "0":
    server = socket.create_server((addr, port))
    server.settimeout(30)
    conn, _ = server.accept()
    seen["received"] = conn.recv(100).decode()
else:
    for _ in range(100):
        try:
            conn = socket.create_connection((addr, port))
            break
        except OSError:
            time.sleep(0.1)
    conn.sendall(("hello from " + os.environ["SLURMD_NODENAME"]).encode())
with open("{tmp_path}/rank" + seen["SLURM_PROCID"] + ".json", "w") as f:
    json.dump(seen, f)
"""
    )
    job_id = sbatch(
        slurm_cluster, f"srun -N2 -n2 {sys.executable} {task}", "-N2", "-n2", "--time=2", f"--output={tmp_path}/out"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["SLURMD_NODENAME"] for r in ranks] == ["node1", "node2"]
    assert [r["SLURM_LOCALID"] for r in ranks] == ["0", "0"]
    assert [r["SLURM_NODEID"] for r in ranks] == ["0", "1"]
    assert {r["SLURM_JOB_NODELIST"] for r in ranks} == {"node[1-2]"}
    assert {r["SLURM_NTASKS"] for r in ranks} == {"2"}
    assert ranks[0]["SLURM_LAUNCH_NODE_IPADDR"] == ranks[1]["SLURM_LAUNCH_NODE_IPADDR"]
    assert ranks[0]["received"] == "hello from node2"

    # For a second or two after a short job ends, sacct may name only the first node of the allocation.
    deadline = time.monotonic() + 10
    while (rows := sacct(slurm_cluster, job_id, "JobID,State,NodeList,ExitCode"))[0]["NodeList"] != "node[1-2]":
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    allocation = rows[0]
    assert allocation["JobID"] == job_id
    assert allocation["State"] == "COMPLETED"
    assert allocation["NodeList"] == "node[1-2]"
    step = next(r for r in rows if r["JobID"] == f"{job_id}.0")
    assert step["State"] == "COMPLETED" and step["ExitCode"] == "0:0"


def test_one_node_runs_four_tasks(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    """The host may have 2 cores; the overcommitted nodes still take a 4-GPU cell's 4 ranks."""
    out = tmp_path / "out"
    job_id = sbatch(
        slurm_cluster,
        "srun -n4 bash -c 'echo $SLURMD_NODENAME $SLURM_PROCID $SLURM_LOCALID'",
        "-N1",
        "-n4",
        "-w",
        "node1",
        "--time=1",
        f"--output={out}",
    )
    lines = sorted(out.read_text().splitlines())
    assert lines == [f"node1 {rank} {rank}" for rank in range(4)]
    assert sacct(slurm_cluster, job_id, "JobID,State")[0]["State"] == "COMPLETED"


def test_gpu_gres_is_scheduled_and_accounted(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = sbatch(slurm_cluster, "echo $CUDA_VISIBLE_DEVICES", "--gres=gpu:a100:2", "--time=1", f"--output={out}")
    assert out.read_text().split() == ["0,1"]
    rows = sacct(slurm_cluster, job_id, "JobID,State,AllocTRES")
    assert rows[0]["State"] == "COMPLETED"
    assert "gres/gpu=2" in rows[0]["AllocTRES"]

    # More GPUs than any node has: refused at submission, not left pending forever.
    refused = subprocess.run(
        ["sbatch", "--gres=gpu:a100:5", "--wrap", "true"],
        env={**os.environ, **slurm_cluster.env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr


def test_job_in_urgent_partition_preempts_and_requeues_a_debug_job(slurm_cluster: LocalCluster) -> None:
    victim = sbatch(slurm_cluster, "sleep 120", "-N2", "--exclusive", "--output=/dev/null", wait=False)
    try:
        deadline = time.monotonic() + 60
        while slurm_cluster.run_client(["squeue", "-h", "-j", victim, "-o", "%T"]).strip() != "RUNNING":
            assert time.monotonic() < deadline, "the job to be preempted never started"
            time.sleep(0.2)
        urgent = sbatch(slurm_cluster, "true", "-p", "urgent", "-N1", "--time=1", "--output=/dev/null")
        assert sacct(slurm_cluster, urgent, "JobID,State")[0]["State"] == "COMPLETED"
        # -D keeps every attempt: the first one ended PREEMPTED, and the job went back to the queue.
        states = [row["State"] for row in sacct(slurm_cluster, victim, "JobID,State") if row["JobID"] == victim]
        assert states[0] == "PREEMPTED"
        assert slurm_cluster.run_client(["squeue", "-h", "-j", victim, "-o", "%T"]).strip() in {"PENDING", "RUNNING"}
    finally:
        slurm_cluster.run_client(["scancel", victim])


def test_killed_node_can_be_started_again(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    before = next(r for r in slurm_cluster.daemons() if r.name == "slurmd.node2")
    # Its job steps (other sessions may share this cluster) survive and are found again by the new slurmd.
    slurm_cluster.kill_node("node2", with_jobs=False)
    assert not before.alive()
    assert not slurm_cluster.is_up()

    slurm_cluster.start_node("node2")
    after = next(r for r in slurm_cluster.daemons() if r.name == "slurmd.node2")
    assert after.pid != before.pid and after.alive()
    assert slurm_cluster.is_up()
    out = tmp_path / "out"
    job_id = sbatch(slurm_cluster, "echo $SLURMD_NODENAME", "-w", "node2", "--time=1", f"--output={out}")
    assert out.read_text().strip() == "node2"
    assert sacct(slurm_cluster, job_id, "JobID,State")[0]["State"] == "COMPLETED"


def test_private_cluster_starts_and_stops_without_leaving_a_process(slurm_cluster: LocalCluster) -> None:
    """A second cluster in its own folder, next to the session's: up, MaxArraySize, down, nothing left."""
    # Not pytest's tmp_path: its parent is private to root, and munged and MariaDB run as other users.
    state_dir = Path(tempfile.mkdtemp(prefix="gpudays-cluster-test-", dir="/tmp"))
    cluster = LocalCluster(state_dir)

    def quiet(_message: str) -> None:
        pass

    others_before = [r for r in slurm_cluster.daemons() if r.alive()]
    try:
        started = time.monotonic()
        with cluster.session(max_array_size=11, log=quiet):
            up_s = time.monotonic() - started
            assert cluster.is_up()
            config = cluster.run_client(["scontrol", "show", "config"])
            assert any(line.split() == ["MaxArraySize", "=", "11"] for line in config.splitlines())
            assert cluster.node_states() == {"node1": "idle", "node2": "idle"}
            daemons = cluster.daemons()
            assert [d.name for d in daemons] == cluster.expected_daemons()
            started = time.monotonic()
        # The session started the cluster and nobody else uses it: it is stopped, every process gone.
        down_s = time.monotonic() - started
        print(f"fresh private cluster: up {up_s:.1f} s, down {down_s:.1f} s")
        assert not any(d.alive() for d in daemons)
        folders = (str(state_dir), str(cluster.layout.runtime_dir))
        leftovers = [p.info for p in psutil.process_iter(["pid", "cmdline", "cwd"]) if _uses(p.info, folders)]
        assert leftovers == [], f"processes still running from {folders}: {leftovers}"
        assert cluster.daemons() == []
        # Stopping one cluster never touches another.
        assert all(r.alive() for r in others_before)

        # Started by hand, a cluster outlives the sessions that use it.
        assert cluster.up(log=quiet) is True
        with cluster.session(log=quiet):
            pass
        assert cluster.is_up()
    finally:
        cluster.down(purge=True, log=quiet)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_cluster_killed_under_its_jobs_starts_again_with_idle_nodes_and_those_jobs_cancelled(
    slurm_cluster: LocalCluster,
) -> None:
    """Every daemon SIGKILLed with two jobs running and one queued (a killed session, a machine restart): the
    next ``up`` finds slurmctld's saved jobs, cancels them before the nodes register, and the nodes are idle.

    Without that, the recovered jobs held both nodes and ``up`` timed out waiting for idle nodes.
    """
    state_dir = Path(tempfile.mkdtemp(prefix="gpudays-cluster-test-", dir="/tmp"))
    cluster = LocalCluster(state_dir)
    said: list[str] = []
    try:
        assert cluster.up(log=said.append) is True
        job_ids = [sbatch(cluster, "sleep 300", "-c", "8", "--output=/dev/null", wait=False) for _ in range(3)]
        submitted = time.time()
        deadline = time.monotonic() + 30
        job_state = cluster.layout.slurmctld_state_dir / "job_state"
        # slurmctld saves its jobs every few seconds; wait for a save that holds all three.
        while (
            len(cluster.run_client(["squeue", "-h", "-t", "R", "-o", "%A"]).split()) < 2
            or not job_state.is_file()
            or job_state.stat().st_mtime <= submitted
        ):
            assert time.monotonic() < deadline, cluster.run_client(["squeue", "-o", "%A %T %N"])
            time.sleep(0.2)
        for record in cluster.daemons():
            os.kill(record.pid, 9)
        for record in cluster.daemons():
            assert processes_gone(record.pid), record

        said.clear()
        assert cluster.up(log=said.append) is True
        assert cluster.node_states() == {"node1": "idle", "node2": "idle"}
        assert cluster.run_client(["squeue", "-h", "-o", "%A"]).strip() == ""
        assert any("cancelled the 3 jobs" in line for line in said), said
        for job_id in job_ids:
            rows = sacct(cluster, job_id, "JobID,State")
            assert [r["State"].split()[0] for r in rows if r["JobID"] == job_id] == ["CANCELLED"], rows
        assert int(sbatch(cluster, "true", "--output=/dev/null")) > max(int(j) for j in job_ids)
    finally:
        cluster.down(purge=True, log=lambda _message: None)
        shutil.rmtree(state_dir, ignore_errors=True)


def processes_gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cluster_in_a_long_folder_runs_jobs_whose_ids_have_two_digits(slurm_cluster: LocalCluster) -> None:
    """A state folder of 80+ characters: job steps' sockets (NODE_JOBID.STEPID in slurmd's spool) stay short.

    With the spool inside such a folder, job 10 onwards could not be launched: the socket path passed 107 bytes,
    SLURM requeued and held each job. A second cluster next to the session's, on its own ports.
    """
    parent = Path(tempfile.mkdtemp(prefix="gpudays-cluster-test-", dir="/tmp"))
    parent.chmod(0o755)  # munged and MariaDB, other users, reach their folders inside it
    state_dir = parent / "a-state-folder-whose-name-is-long-enough-to-matter"
    assert len(str(state_dir)) >= 80
    cluster = LocalCluster(state_dir)

    def quiet(_message: str) -> None:
        pass

    try:
        with cluster.session(log=quiet):
            runtime = cluster.layout.runtime_dir
            assert (state_dir / "runtime").resolve() == runtime
            job_ids = [sbatch(cluster, "true", "--output=/dev/null", wait=False) for _ in range(12)]
            assert int(job_ids[-1]) >= 10, f"a fresh cluster numbers jobs from 1, got {job_ids}"
            deadline = time.monotonic() + 90
            while cluster.run_client(["squeue", "-h", "-o", "%A %T %r"]).strip():
                assert time.monotonic() < deadline, cluster.run_client(["squeue", "-o", "%A %T %r"])
                time.sleep(0.5)
            for job_id in job_ids:
                # -D lists every attempt: a job requeued after a failed launch would show two.
                rows = sacct(cluster, job_id, "JobID,State")
                assert [r["State"] for r in rows if r["JobID"] == job_id] == ["COMPLETED"], rows
            sockets = [p for p in runtime.rglob("*") if p.is_socket()]
            assert cluster.layout.munge_socket in sockets and cluster.layout.mysql_socket in sockets
            assert all(len(str(p).encode()) <= 107 for p in sockets), sockets
        assert not cluster.is_up()
    finally:
        cluster.down(purge=True, log=quiet)
        shutil.rmtree(parent, ignore_errors=True)
    assert not cluster.layout.runtime_dir.exists()


def test_command_line_env_and_status(
    slurm_cluster: LocalCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDAYS_CLUSTER_DIR", str(slurm_cluster.state_dir))
    assert main(["env"]) == 0
    assert capsys.readouterr().out == f"export SLURM_CONF={slurm_cluster.slurm_conf}\n"
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "cluster:      up" in out
    assert "slurmctld" in out and "alive" in out and "dead" not in out


def _uses(info: dict[str, object], folders: tuple[str, ...]) -> bool:
    """True if a process (psutil's ``info``) runs in or names one of ``folders``."""
    text = " ".join([*(info.get("cmdline") or []), str(info.get("cwd") or "")])  # type: ignore[misc]
    return any(folder in text for folder in folders)
