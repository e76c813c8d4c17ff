"""What a user hits at the edges of the command line: a closed stdout, suffixed amounts, help text, conflicting
folder flags. Each runs the command line in this process, except where the process's own stdout is the point."""

from __future__ import annotations

import os
import sys

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
