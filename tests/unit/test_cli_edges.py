"""What a user hits at the edges of the command line: a closed stdout, suffixed amounts, help text, conflicting
folder flags. Each runs the command line in this process, except where the process's own stdout is the point."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli.display import console
from orchestrator.cli.errors import Exit


@pytest.mark.parametrize("lines", [1, 100_000])
def test_a_closed_stdout_ends_quietly_with_sigpipes_status(monkeypatch, capsys, lines: int) -> None:
    """``gpudays ... | head`` once head has gone: stdout is a pipe whose reader is closed."""
    read, write = os.pipe()
    os.close(read)
    monkeypatch.setattr(sys, "stdout", open(write, "w"))  # noqa: SIM115 - closed below

    def handler(args: object) -> int:
        console.out("a line of a table\n" * lines)
        return int(Exit.CELLS_FAILED)

    monkeypatch.setitem(cli.HANDLERS, "show", handler)
    try:
        code = cli.main(["show", "somewhere", "cell"])
    finally:
        sys.stdout.close()
    assert code == Exit.STDOUT_CLOSED == 128 + 13, "SIGPIPE's status, not the command's (it says nothing of cells)"
    assert capsys.readouterr().err == "", "no error line, no traceback"


def test_a_broken_pipe_of_the_commands_own_is_an_error_not_a_closed_stdout(monkeypatch, capsys) -> None:
    def handler(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.HANDLERS, "show", handler)
    code = cli.main(["show", "somewhere", "cell"])
    assert code not in (Exit.OK, Exit.STDOUT_CLOSED, Exit.CELLS_FAILED)
    assert "Broken pipe" in capsys.readouterr().err


def test_a_new_sweep_of_cells_measured_beside_it_says_where_and_goes_on(tmp_path, monkeypatch, capsys) -> None:
    from orchestrator.cli import flow
    from orchestrator.planning.plan import plan
    from orchestrator.store.paths import SweepPaths

    overrides = ["model=pythia-tiny", "gpu=cpu", "num_gpus=1"]
    earlier = SweepPaths(tmp_path / "2026-01-01_10-00-00")
    earlier.record(plan(overrides).cells[0].cell_id).parent.mkdir(parents=True)
    earlier.record(plan(overrides).cells[0].cell_id).write_text("{}")
    started: list[Path] = []
    monkeypatch.setattr(flow, "start", lambda p, **kw: started.append(p.sweep_dir) or 0)
    new = tmp_path / "2026-01-01_11-00-00"
    assert cli.main(["sweep", "--dir", str(new), *overrides]) == Exit.OK
    err = capsys.readouterr().err
    assert f"1 of these 1 cell(s) were measured already in {earlier.root}" in err
    assert f"gpudays report {earlier.root}" in err and f"gpudays resume {earlier.root}" in err
    assert started == [new], "the sweep still runs"
    # Into the folder that holds them, or where no folder beside it does: nothing to say.
    assert cli.main(["sweep", "--dir", str(tmp_path / "elsewhere" / "s"), *overrides]) == Exit.OK
    assert "measured already" not in capsys.readouterr().err
