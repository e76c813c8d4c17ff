"""The local cluster's generated configuration and its messages; no SLURM needed."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from orchestrator.cluster import (
    APT_INSTALL_COMMAND,
    DEFAULT_STATE_DIR,
    REQUIRED_PROGRAMS,
    ClusterLayout,
    ClusterPorts,
    ClusterSpec,
    LocalCluster,
    main,
    missing_packages,
    missing_packages_message,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
)

STATE_DIR = Path("/srv/gpudays-state")
PORTS = ClusterPorts(slurmctld=21001, slurmdbd=21002, mysql=21003, slurmd=(21004, 21005))


def make_spec(**overrides: object) -> ClusterSpec:
    fields: dict[str, object] = {"layout": ClusterLayout(STATE_DIR), "hostname": "box", "ports": PORTS}
    fields.update(overrides)
    return ClusterSpec(**fields)  # type: ignore[arg-type]


def settings(text: str) -> dict[str, str]:
    """``Key=value`` lines of a SLURM config (not the node and partition lines), as a dict."""
    pairs = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "NodeName=", "PartitionName=")):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def test_slurm_conf_has_two_nodes_on_their_own_ports_with_four_gpus() -> None:
    text = render_slurm_conf(make_spec())
    node_lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert node_lines == [
        "NodeName=node1 NodeHostname=box NodeAddr=127.0.0.1 Port=21004 CPUs=8 RealMemory=16384 "
        "Gres=gpu:a100:4 State=UNKNOWN",
        "NodeName=node2 NodeHostname=box NodeAddr=127.0.0.1 Port=21005 CPUs=8 RealMemory=16384 "
        "Gres=gpu:a100:4 State=UNKNOWN",
    ]
    partitions = [line for line in text.splitlines() if line.startswith("PartitionName=")]
    assert partitions[0].startswith("PartitionName=debug Nodes=node1,node2 Default=YES ")
    assert partitions[1].startswith("PartitionName=urgent Nodes=node1,node2 ")
    assert "Default=YES" not in partitions[1]


def test_slurm_conf_points_every_daemon_at_the_private_ports_and_paths() -> None:
    conf = settings(render_slurm_conf(make_spec()))
    assert conf["ClusterName"] == "gpudays"
    assert conf["SlurmctldHost"] == "box(127.0.0.1)"
    assert conf["SlurmctldPort"] == "21001"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["AccountingStoragePort"] == "21002"
    # Daemons and clients must both find the private munged, for slurmctld and for slurmdbd connections.
    runtime = ClusterLayout(STATE_DIR).runtime_dir
    assert conf["AuthInfo"].split(",")[0] == f"socket={runtime}/munge/munge.socket"
    assert conf["AccountingStoragePass"] == f"{runtime}/munge/munge.socket"
    # Several slurmd on one host need their own spool, pid and log files.
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        assert "%n" in conf[key]
    for key in ("StateSaveLocation", "SlurmctldPidFile", "SlurmctldLogFile", "SlurmdLogFile"):
        assert conf[key].startswith(f"{STATE_DIR}/"), key
    # Job steps make their sockets in the spool folder: it lives in the short runtime folder.
    assert conf["SlurmdSpoolDir"] == f"{runtime}/spool/slurmd.%n"
    assert conf["SlurmUser"] == "root" and conf["SlurmdUser"] == "root"


def test_slurm_conf_allows_overcommit_gpus_and_hard_short_time_limits() -> None:
    conf = settings(render_slurm_conf(make_spec()))
    assert conf["SlurmdParameters"] == "config_overrides"
    assert conf["GresTypes"] == "gpu"
    assert conf["MaxArraySize"] == "1001"
    assert conf["OverTimeLimit"] == "0"
    assert int(conf["KillWait"]) <= 5
    assert int(conf["SlurmdTimeout"]) <= 30
    assert conf["ReturnToService"] == "2"


def test_slurm_conf_follows_the_spec() -> None:
    spec = make_spec(
        num_nodes=3,
        ports=ClusterPorts(21001, 21002, 21003, (21004, 21005, 21006)),
        max_array_size=11,
        cpus_per_node=4,
        gpu_type="h100",
        gpus_per_node=2,
    )
    text = render_slurm_conf(spec)
    assert settings(text)["MaxArraySize"] == "11"
    assert re.search(r"^NodeName=node3 .* Port=21006 CPUs=4 .* Gres=gpu:h100:2 ", text, re.MULTILINE)
    assert "PartitionName=debug Nodes=node1,node2,node3 " in text


def test_gres_conf_lists_character_device_files_per_node() -> None:
    assert render_gres_conf(make_spec()).splitlines()[1:] == [
        "AutoDetect=off",
        f"NodeName=node1 Name=gpu Type=a100 File={STATE_DIR}/dev/node1/gpu[0-3]",
        f"NodeName=node2 Name=gpu Type=a100 File={STATE_DIR}/dev/node2/gpu[0-3]",
    ]
    single = render_gres_conf(make_spec(gpus_per_node=1))
    assert f"File={STATE_DIR}/dev/node1/gpu0\n" in single
    assert ClusterLayout(STATE_DIR).gpu_devices("node2", 2) == [
        STATE_DIR / "dev/node2/gpu0",
        STATE_DIR / "dev/node2/gpu1",
    ]


def test_slurmdbd_conf_uses_mysql_on_the_private_port() -> None:
    conf = settings(render_slurmdbd_conf(make_spec()))
    assert conf["StorageType"] == "accounting_storage/mysql"
    assert conf["StorageHost"] == "127.0.0.1"
    assert conf["StoragePort"] == "21003"
    assert conf["DbdPort"] == "21002"
    assert conf["DbdHost"] == "box"
    assert conf["AuthInfo"] == f"socket={ClusterLayout(STATE_DIR).runtime_dir}/munge/munge.socket"
    assert conf["LogFile"] == f"{STATE_DIR}/log/slurmdbd.log"


@pytest.mark.parametrize(
    ("ports", "num_nodes", "message"),
    [
        (ClusterPorts(21001, 21001, 21003, (21004, 21005)), 2, "distinct"),
        (ClusterPorts(21001, 21002, 21003, (21004,)), 2, "2 slurmd ports"),
        (PORTS, 0, "at least 1"),
    ],
)
def test_spec_rejects_inconsistent_ports_and_nodes(ports: ClusterPorts, num_nodes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_spec(ports=ports, num_nodes=num_nodes)


def test_job_ids_stay_in_the_clusters_own_range() -> None:
    conf = settings(render_slurm_conf(make_spec()))
    assert (conf["FirstJobId"], conf["MaxJobId"]) == ("1", "67043328")
    conf = settings(render_slurm_conf(make_spec(job_ids=(4001, 8000))))
    assert (conf["FirstJobId"], conf["MaxJobId"]) == ("4001", "8000")


@pytest.mark.parametrize("job_ids", [(0, 10), (10, 10), (10, 5), (1, 67_043_329)])
def test_spec_rejects_a_job_id_range_slurm_does_not_accept(job_ids: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="job_ids"):
        make_spec(job_ids=job_ids)


def test_spec_rejects_a_max_array_size_slurm_does_not_accept() -> None:
    with pytest.raises(ValueError, match="max_array_size"):
        make_spec(max_array_size=0)


def test_sockets_stay_short_whatever_the_length_of_the_state_folder() -> None:
    short, long = ClusterLayout(Path("/srv/s")), ClusterLayout(Path("/srv/" + "deep-folder/" * 20 + "state"))
    assert len(str(long.state_dir)) > 200
    assert long.runtime_dir.parent == Path("/tmp") and re.fullmatch(r"gd-[0-9a-f]{8}", long.runtime_dir.name)
    # One runtime folder per state folder, the same at every start.
    assert long.runtime_dir != short.runtime_dir
    assert long.runtime_dir == ClusterLayout(Path("/srv/" + "deep-folder/" * 20 + "state")).runtime_dir
    for path in (long.munge_socket, long.mysql_socket, long.longest_socket_path("node2")):
        assert path.is_relative_to(long.runtime_dir)
        assert len(str(path).encode()) <= 107, path
    # A job step's socket: NODE_JOBID.STEPID with ids of up to 10 digits.
    assert long.longest_socket_path("node2").name == "node2_4294967294.4294967294"
    make_spec(layout=long)


def test_spec_refuses_a_runtime_folder_whose_sockets_would_be_too_long() -> None:
    layout = ClusterLayout(STATE_DIR, runtime_root=Path("/run/" + "x" * 60))
    with pytest.raises(ValueError, match=r"too long.*limit of 107 bytes of a Unix socket path"):
        make_spec(layout=layout)


def test_missing_packages_names_the_debian_package_of_each_missing_program(tmp_path: Path) -> None:
    assert missing_packages(bin_dirs=[str(tmp_path)]) == [
        "mariadb-client",
        "mariadb-server",
        "munge",
        "slurm-client",
        "slurm-wlm",
        "slurmdbd",
    ]
    # Every program present but slurmdbd: only its package is missing.
    for program in REQUIRED_PROGRAMS:
        if program != "slurmdbd":
            path = tmp_path / program
            path.write_text("#!/bin/sh\n")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
    assert missing_packages(bin_dirs=[str(tmp_path)]) == ["slurmdbd"]


def test_missing_packages_message_names_packages_and_the_install_command() -> None:
    message = missing_packages_message(["munge", "slurmdbd"])
    assert "munge, slurmdbd" in message
    assert APT_INSTALL_COMMAND in message
    assert APT_INSTALL_COMMAND == "apt-get install -y slurm-wlm slurmdbd munge mariadb-server"


def test_state_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUDAYS_CLUSTER_DIR", raising=False)
    assert LocalCluster().state_dir == DEFAULT_STATE_DIR
    monkeypatch.setenv("GPUDAYS_CLUSTER_DIR", str(tmp_path))
    cluster = LocalCluster()
    assert cluster.state_dir == tmp_path
    assert cluster.env() == {"SLURM_CONF": str(tmp_path / "etc" / "slurm.conf")}


def test_command_line_env_prints_an_export_line_for_eval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUDAYS_CLUSTER_DIR", str(tmp_path))
    assert main(["env"]) == 0
    assert capsys.readouterr().out == f"export SLURM_CONF={tmp_path}/etc/slurm.conf\n"


def test_status_of_a_cluster_never_started_says_down(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUDAYS_CLUSTER_DIR", str(tmp_path))
    assert main(["status"]) == 3  # the scheduler cannot be asked (README's exit codes)
    assert "cluster:      down" in capsys.readouterr().out
    assert LocalCluster().status()["daemons"] == []
    assert not LocalCluster().is_up()


def test_cluster_up_with_packages_missing_exits_as_the_readme_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It exited 1, which the README gives to "a cell needs a rerun": a cluster that cannot start is the scheduler's 3.
    from orchestrator.cli.errors import Exit
    from orchestrator.cluster import cli as cluster_cli
    from orchestrator.cluster import lifecycle as cluster_lifecycle

    assert (cluster_cli.EXIT_SCHEDULER, cluster_cli.EXIT_BAD_INPUT) == (Exit.SCHEDULER, Exit.BAD_INPUT)
    monkeypatch.setenv("GPUDAYS_CLUSTER_DIR", str(tmp_path))
    monkeypatch.setattr(cluster_lifecycle, "missing_packages", lambda: ["slurmdbd"])
    assert main(["up"]) == Exit.SCHEDULER
    assert "slurmdbd" in capsys.readouterr().err
