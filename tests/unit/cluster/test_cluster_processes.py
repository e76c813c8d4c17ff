"""The local cluster's bookkeeping without SLURM: daemon records, session leases, ports, the runtime folder,
the command line's help and the packaged templates."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.cluster import ClusterError, ClusterLayout, main
from orchestrator.cluster.config import TEMPLATES_DIR
from orchestrator.cluster.lifecycle import _lease_name, _live_leases
from orchestrator.cluster.ports import choose_ports
from orchestrator.cluster.processes import DaemonRecord, descendants, start_time

ROOT = Path(__file__).resolve().parents[3]


def test_a_daemon_record_is_alive_only_for_its_own_start() -> None:
    me = os.getpid()
    started_at = start_time(me)
    assert started_at is not None
    assert DaemonRecord("x", me, started_at).alive()
    # The same pid with another start time is another process (a reused pid).
    assert not DaemonRecord("x", me, started_at - 3600).alive()
    assert not DaemonRecord("x", me, -1.0).alive()


def test_an_exited_child_is_dead_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started_at = start_time(child.pid)
    assert started_at is not None
    for _ in range(200):
        if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    assert not DaemonRecord("x", child.pid, started_at).alive()
    child.wait()
    assert start_time(child.pid) is None


def test_records_of_an_earlier_version_in_clock_ticks_are_read() -> None:
    me = os.getpid()
    ticks = int(Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert DaemonRecord.from_json({"name": "munged", "pid": me, "start_ticks": ticks}).alive()
    assert not DaemonRecord.from_json({"name": "munged", "pid": me, "start_ticks": -1}).alive()


def test_descendants_are_the_whole_process_tree() -> None:
    shell = subprocess.Popen(["bash", "-c", "sleep 30 & (sleep 30 & wait) & wait"])
    try:
        for _ in range(100):
            if len(descendants(shell.pid)) == 3:
                break
            time.sleep(0.05)
        below = descendants(shell.pid)
        assert len(below) == 3
        assert sorted(psutil.Process(pid).name() for pid in below) == ["bash", "sleep", "sleep"]
    finally:
        for proc in [*psutil.Process(shell.pid).children(recursive=True), psutil.Process(shell.pid)]:
            proc.kill()
        shell.wait()


def test_leases_of_gone_processes_are_removed(tmp_path: Path) -> None:
    mine = tmp_path / _lease_name(os.getpid())
    mine.touch()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = tmp_path / _lease_name(child.pid)
    child.wait()
    gone.touch()
    (tmp_path / f"{os.getpid()}-1000").touch()  # this pid, but a start long ago: another process
    assert _live_leases(tmp_path) == [mine]
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]
    # A lease of an earlier version, in clock ticks since boot, of a session that still runs, is kept.
    ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
    legacy = tmp_path / f"{os.getpid()}-{ticks}"
    legacy.touch()
    assert sorted(_live_leases(tmp_path)) == sorted([mine, legacy])


def test_ports_are_chosen_once_and_reused_while_free(tmp_path: Path) -> None:
    layout = ClusterLayout(tmp_path)
    first = choose_ports(layout, 2)
    assert len(set(first.all())) == 5 and all(20000 <= p < 32000 for p in first.all())
    assert layout.ports_file.is_file()
    assert choose_ports(layout, 2) == first
    # Another number of nodes needs other ports.
    assert len(choose_ports(layout, 3).slurmd) == 3


def test_runtime_folder_is_made_and_linked_from_the_state_folder(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "rt").mkdir()
    layout = ClusterLayout(tmp_path / "state", runtime_root=tmp_path / "rt")
    layout.make_runtime_dir()
    assert layout.runtime_dir.is_dir() and layout.runtime_link.resolve() == layout.runtime_dir
    layout.make_runtime_dir()  # again: nothing changes
    assert layout.runtime_link.resolve() == layout.runtime_dir


def test_runtime_folder_planted_by_someone_else_is_refused(tmp_path: Path) -> None:
    for folder in ("state", "rt", "elsewhere"):
        (tmp_path / folder).mkdir()
    layout = ClusterLayout(tmp_path / "state", runtime_root=tmp_path / "rt")
    layout.runtime_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ClusterError, match="not a folder owned by this user"):
        layout.make_runtime_dir()


def test_help_lists_every_verb_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for verb in ("up", "down", "status", "env"):
        described = [line for line in lines if line.split()[:1] == [verb]]
        assert len(described) == 1 and len(described[0].split()) > 3, (verb, lines)


def test_config_templates_are_package_data() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["orchestrator.cluster"]
    shipped = {p for pattern in patterns for p in (ROOT / "orchestrator" / "cluster").glob(pattern)}
    assert {p.name for p in TEMPLATES_DIR.iterdir()} == {"slurm.conf.j2", "gres.conf.j2", "slurmdbd.conf.j2"}
    assert set(TEMPLATES_DIR.iterdir()) <= shipped
