"""A torch-extension lock left by a killed job is removed, and a wait for one ends, instead of hanging every cell."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.job import op_lock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _baton(tmp_path: Path, holder: dict[str, object] | None) -> Path:
    path = tmp_path / "deepspeed_shm_comm" / "lock"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(holder) if holder is not None else "")
    return path


def test_a_lock_whose_holder_died_is_removed_and_said(tmp_path: Path) -> None:
    path = _baton(tmp_path, {"pid": _dead_pid(), "host": socket.gethostname(), "started": 1.0})
    said: list[str] = []
    assert op_lock.clear_stale_batons(tmp_path, said.append) == [path]
    assert not path.exists()
    assert "removed the stale op build lock" in said[0] and "is gone" in said[0]


def test_an_old_lock_is_removed_even_from_another_host(tmp_path: Path) -> None:
    path = _baton(tmp_path, None)  # torch's own empty baton
    old = time.time() - 7200
    os.utime(path, (old, old))
    said: list[str] = []
    assert op_lock.clear_stale_batons(tmp_path, said.append, max_age_s=1800) == [path]
    assert "older" in said[0] or "old" in said[0]


def test_a_live_holder_keeps_its_lock(tmp_path: Path) -> None:
    path = _baton(tmp_path, json.loads(op_lock.holder_text()))
    assert op_lock.clear_stale_batons(tmp_path, lambda _: None) == []
    assert path.exists()
    other_host = _baton(tmp_path / "b", {"pid": 1, "host": "elsewhere", "started": 1.0})
    assert op_lock.clear_stale_batons(tmp_path / "b", lambda _: None) == []
    assert other_host.exists()


def test_torch_waits_say_so_and_end_on_a_stale_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.file_baton import FileBaton

    monkeypatch.setattr(FileBaton, "try_acquire", FileBaton.try_acquire)
    monkeypatch.setattr(FileBaton, "wait", FileBaton.wait)
    monkeypatch.setattr(op_lock, "JUDGE_EVERY_S", 0.05)
    said: list[str] = []
    op_lock.guard_op_builds(tmp_path, said.append)
    try:
        builder = FileBaton(str(tmp_path / "op" / "lock"))
        (tmp_path / "op").mkdir()
        assert builder.try_acquire()
        assert json.loads((tmp_path / "op" / "lock").read_text())["pid"] == os.getpid()
        # The holder is killed mid-build: its record now names a dead process.
        (tmp_path / "op" / "lock").write_text(
            json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "started": 1.0})
        )
        waiter = FileBaton(str(tmp_path / "op" / "lock"), wait_seconds=0.01)
        assert not waiter.try_acquire()
        ended: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.wait()
            except op_lock.StaleOpBuild as exc:
                ended.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(10)
        assert not thread.is_alive() and ended
        assert not (tmp_path / "op" / "lock").exists()
        assert any("waiting" in line for line in said) and any("removed" in line for line in said)
    finally:
        FileBaton._gpudays_guarded = False  # type: ignore[attr-defined]
