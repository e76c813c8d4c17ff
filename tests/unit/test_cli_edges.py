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


@pytest.mark.parametrize("lines", [1, 5_000])  # 5,000 lines: 90 KB, more than a pipe holds
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


@pytest.mark.parametrize(
    "command", ["sweep", "plan", "status", "show", "resume", "cancel", "report", "budget", "shortest"]
)
def test_every_commands_help_has_a_description_and_the_exit_codes(command: str, capsys) -> None:
    assert cli.main([command, "--help"]) == Exit.OK
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    assert rest.split("\n\n")[0].strip() and not rest.startswith("options:"), "a description under the usage"
    assert "exit codes:" in rest and all(f"  {code.value} " in rest for code in Exit)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--gpu-hours", "1M"], "What 1,000,000 GPU-hours trains"),
        (["--usd", "100k"], "What $100,000 of cloud GPU time trains"),
        (["--gpu-hours", "2.5e4"], "What 25,000 GPU-hours trains"),
    ],
)
def test_budget_amounts_take_the_suffixes_token_budgets_take(flags: list[str], says: str, capsys) -> None:
    assert cli.main(["budget", *flags, "--gpu", "h100-80gb", "--size", "1B"]) == Exit.OK
    assert says in capsys.readouterr().out


def test_one_reader_of_suffixed_numbers_for_sizes_tokens_and_budgets() -> None:
    from analysis.planners.budget import amount, parse_size
    from analysis.predict.estimates import parse_token_budget

    for text, value in (("300B", 300e9), ("100k", 1e5), ("1.5T", 1.5e12), ("2G", 2e9), ("7e9", 7e9), ("3m", 3e6)):
        assert parse_size(text) == amount("--usd", text) == parse_token_budget(text).value == value, text
    with pytest.raises(ValueError, match=r"--gpu-hours 1Q: give an amount above 0"):
        amount("--gpu-hours", "1Q")
    with pytest.raises(ValueError, match=r"--usd -5"):
        amount("--usd", "-5")


def test_budget_with_sizes_alone_lists_those_models_only(capsys) -> None:
    assert cli.main(["budget", "--gpu-hours", "1e4", "--gpu", "h100-80gb", "--size", "7B,70B", "--format", "json"]) == 0
    import json

    models = {row["model"] for row in json.loads(capsys.readouterr().out)["models"]}
    assert len(models) == 2 and not any(m.startswith("pythia") for m in models), models


def test_dir_and_a_different_hydra_sweep_dir_are_refused_naming_both(tmp_path, capsys) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    argv = ["--dir", str(one), f"hydra.sweep.dir={two}", "model=pythia-tiny", "gpu=cpu"]
    for command in ("plan", "sweep"):
        assert cli.main([command, *argv]) == Exit.BAD_INPUT
        err = capsys.readouterr().err
        assert f"--dir {one} and hydra.sweep.dir={two}" in err
    assert not one.exists() and not two.exists()
    # The same folder both ways is no conflict.
    assert cli.main(["plan", "--dir", str(one), f"hydra.sweep.dir='{one}'", "model=pythia-tiny", "gpu=cpu"]) == 0
