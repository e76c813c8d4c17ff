"""DeepSpeed's "built successfully" line, which its communication backends print on every rank of every cell, is
dropped where it is printed; what else they print, and a failed build, are kept."""

from __future__ import annotations

from types import ModuleType

import pytest

from orchestrator.engines.deepspeed.engine import quiet_op_builds


@pytest.fixture
def ds_torch() -> ModuleType:
    """DeepSpeed's torch backend, imported by the tests that patch it (not at collection, on both xdist workers)."""
    return pytest.importorskip("deepspeed.comm.torch")


def test_the_op_build_line_is_dropped_and_the_rest_kept(ds_torch, monkeypatch, capsys) -> None:
    def build_shm_op() -> str:
        print("[WARNING] a compiler warning")
        print("DeepSpeed shm_comm_op built successfully")
        return "op"

    monkeypatch.setattr(ds_torch, "build_shm_op", build_shm_op)
    quiet_op_builds()
    quiet_op_builds()  # once per engine: wrapping again changes nothing
    assert ds_torch.build_shm_op() == "op"
    assert capsys.readouterr().out == "[WARNING] a compiler warning\n"


def test_a_failed_build_still_raises_with_what_it_printed(ds_torch, monkeypatch, capsys) -> None:
    def build_shm_op() -> None:
        print("ninja: build stopped")
        raise RuntimeError("Error building extension 'shm_comm_op'")

    monkeypatch.setattr(ds_torch, "build_shm_op", build_shm_op)
    quiet_op_builds()
    with pytest.raises(RuntimeError, match="Error building extension"):
        ds_torch.build_shm_op()
    assert capsys.readouterr().out == "ninja: build stopped\n"
