"""The command line's answers: refusals of bad folders and flags, exit codes, plan without a scheduler, ``show``,
pasteable hints, per-cell times, every file written, cost columns. Sweep folders are written by hand here
(config, attempts, record), so nothing runs."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import synthetic

from orchestrator.cli import flow as lifecycle
from orchestrator.cli import main as cli
from orchestrator.cli.display import console
from orchestrator.cli.errors import Exit
from orchestrator.config.schema import to_config
from orchestrator.store.attempts import next_attempt, read_attempts
from orchestrator.store.durable import append_jsonl
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import RECORD_SCHEMA_VERSION, Metrics
from orchestrator.submission import launch, local


@pytest.fixture(scope="module")
def tiny_config() -> dict[str, Any]:
    from orchestrator.planning.plan import plan

    return plan(["model=pythia-tiny", "gpu=cpu", "num_gpus=1"]).cells[0].config


def _cell(sweep_dir: Path, config: dict[str, Any], status: str, **record: Any) -> str:
    """A cell as a finished local attempt leaves it: config, one attempt, a record and task 0's log."""
    paths = SweepPaths(sweep_dir)
    cid = f"{status}{len(paths.cell_ids())}"
    launch.write_cell(paths, cid, to_config(config))
    job = "999999999"  # no such process: a local attempt that has ended
    append_jsonl(paths.attempts(cid), {"cell_id": cid, "attempt": 1, "job_id": job, "backend": "local"})
    paths.job_dir(job).mkdir(parents=True, exist_ok=True)
    (paths.job_dir(job) / f"{job}_0_log.err").write_text("a log line\n")
    payload = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "status": status,
        "cell_id": cid,
        "attempt": 1,
        "config": config,
    }
    payload.update(metrics={}, environment={})
    paths.record(cid).write_text(json.dumps({**payload, **record}))
    return cid


@pytest.mark.parametrize("make", ["missing", "empty", "file", "no cells"])
def test_report_refuses_a_folder_that_is_not_a_sweep_and_creates_nothing(tmp_path: Path, capsys, make: str) -> None:
    target = tmp_path / "typo"
    if make in ("empty", "no cells"):
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    if make == "no cells":
        (target / "cells").mkdir()
    code = cli.main(["report", str(target)])
    out, err = capsys.readouterr()
    assert code == Exit.BAD_INPUT
    assert "sweep.json" in err and "cells/<cell_id>/cell.yaml" in err, "says what a sweep folder holds"
    assert "calibration" not in out + err
    before = {"missing": [], "empty": ["typo"], "file": ["typo"], "no cells": ["cells", "typo"]}[make]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("tokens", ["banana", "0", "-3x", "1e999"])
def test_a_bad_token_budget_is_bad_input_and_writes_nothing(tmp_path, tiny_config, capsys, tokens: str) -> None:
    _cell(tmp_path, tiny_config, "ok")
    code = cli.main(["report", str(tmp_path), f"--tokens={tokens}", "--no-plots"])
    err = capsys.readouterr().err
    assert code == Exit.BAD_INPUT
    assert err.startswith(f"gpudays: error: --tokens {tokens}") and "Traceback" not in err
    assert not (tmp_path / "cells.csv").exists()


def test_plan_exits_0_when_no_cell_would_fit_and_says_so_on_stderr(tmp_path: Path, capsys) -> None:
    code = cli.main(["plan", "--dir", str(tmp_path / "p"), "model=pythia-12b", "gpu=a100-80gb", "num_gpus=1"])
    out, err = capsys.readouterr()
    assert code == Exit.OK
    assert "predicted not to fit" in out and "no cell of this plan would run" in err


def test_plan_on_a_slurm_cluster_asks_no_scheduler(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, sbatch or sacct to be found
    args = ["--dir", str(tmp_path / "p"), "cluster=slurm", "gpu=a100-80gb", "model=pythia-70m", "num_gpus=2"]
    assert cli.main(["plan", *args]) == Exit.OK
    out, err = capsys.readouterr()
    assert "pythia-70m on 2 × A100-80GB: " in out and "sinfo" not in out + err
    # Submission, and the dry run that checks with the scheduler, say the scheduler is missing, in one line.
    assert cli.main(["sweep", "--dry-run", *args]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert "is not on PATH" in err and "Traceback" not in err


def test_a_gpu_type_the_cluster_does_not_map_stops_the_sweep_before_anything_is_written(tmp_path, capsys) -> None:
    sweep_dir = tmp_path / "s"
    argv = ["sweep", "--dir", str(sweep_dir), "cluster=example-university", "gpu=h200", "model=pythia-70m"]
    assert cli.main([*argv, "num_gpus=4"]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert "gpu=h200" in err and "gres_by_gpu" in err and "constraint_by_gpu" in err and "h100-80gb" in err
    assert not sweep_dir.exists()


def test_plan_of_a_gpu_type_the_cluster_does_not_map_warns_and_exits_0(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # plan asks no scheduler
    sweep_dir = tmp_path / "s"
    argv = ["plan", "--dir", str(sweep_dir), "cluster=example-university", "gpu=h200", "model=pythia-70m"]
    assert cli.main([*argv, "num_gpus=4"]) == Exit.OK
    out, err = capsys.readouterr()
    assert "pythia-70m on 4 × H200: " in out, "the plan and its answer are printed"
    assert "warning: `gpudays sweep` of this plan would be refused" in err and "gres_by_gpu" in err
    assert "error" not in err
    assert f"sweep folder a sweep of these cells would use (not created): {sweep_dir}" in out
    assert not sweep_dir.exists()


def test_an_untyped_gpu_request_is_warned_before_submission(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    argv = ["plan", "--dir", str(tmp_path / "s"), "cluster=slurm", "gpu=h100-80gb", "model=pythia-70m", "num_gpus=1"]
    assert cli.main(argv) == Exit.OK
    err = capsys.readouterr().err
    assert "gpu=h100-80gb is requested as an untyped --gres=gpu:N" in err and "only one" in err
    # A cluster config that maps the type asks for it by name: no warning.
    argv = ["plan", "--dir", str(tmp_path / "s"), "cluster=example-university", "gpu=h100-80gb", "model=pythia-70m"]
    assert cli.main(argv) == Exit.OK
    assert "untyped" not in capsys.readouterr().err


def test_status_check_exits_1_while_a_cell_needs_a_rerun(tmp_path: Path, tiny_config, capsys) -> None:
    _cell(tmp_path, tiny_config, "ok")
    assert cli.main(["status", str(tmp_path), "--check"]) == Exit.OK
    _cell(tmp_path, tiny_config, "failed", reason="boom")
    assert cli.main(["status", str(tmp_path)]) == Exit.OK, "without --check, status only shows"
    assert cli.main(["status", str(tmp_path), "--check"]) == Exit.CELLS_FAILED
    assert cli.main(["status", str(tmp_path), "--check", "--summary"]) == Exit.CELLS_FAILED
    assert "failed 1" in capsys.readouterr().out


def test_show_prints_state_reason_traceback_attempts_and_logs(tmp_path: Path, tiny_config, capsys) -> None:
    frames = "".join(f'  File "probe.py", line {i}, in step\n' for i in range(40))
    traceback = f"Traceback (most recent call last):\n{frames}ValueError: boom at the end\n"
    cid = _cell(tmp_path, tiny_config, "failed", reason="ValueError: boom", traceback=traceback)
    _cell(tmp_path, tiny_config, "ok")
    assert cli.main(["show", str(tmp_path), cid[:4]]) == Exit.CELLS_FAILED
    out = capsys.readouterr().out
    assert cid in out and "failed" in out and "ValueError: boom" in out
    assert "ValueError: boom at the end" in out and "line 39" in out, "the traceback's tail"
    assert "line 3," not in out, "only the tail of a long traceback"
    assert "999999999" in out and "local" in out, "the attempt and its job"
    assert str(SweepPaths(tmp_path).job_dir("999999999") / "999999999_0_log.err") in out
    assert cli.main(["show", str(tmp_path), "zzz"]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert cid in err, "an unknown cell lists the sweep's cells"
    assert f"no cell of {tmp_path} matches 'zzz'" in err


def test_hints_to_the_user_can_be_pasted_into_a_shell(tmp_path: Path, tiny_config, capsys) -> None:
    sweep_dir = tmp_path / "my sweep $(date) it's; &"
    _cell(sweep_dir, tiny_config, "failed", reason="boom")
    assert lifecycle.finish(SweepPaths(sweep_dir), report=False) == Exit.CELLS_FAILED
    out = capsys.readouterr().out
    hints = [part for part in out.split("`") if part.startswith("gpudays ")]
    assert [shlex.split(h) for h in hints] == [
        ["gpudays", "status", str(sweep_dir)],
        ["gpudays", "resume", str(sweep_dir)],
    ]


def test_status_finish_and_resume_print_the_same_counts(tmp_path: Path, tiny_config, capsys) -> None:
    for state in ("ok", "does_not_fit", "invalid"):
        _cell(tmp_path, tiny_config, state, reason=None if state == "ok" else "why")
    assert cli.main(["status", str(tmp_path), "--summary"]) == Exit.OK
    (line,) = capsys.readouterr().out.splitlines()
    assert line == "3 cell(s): ok 1, does_not_fit 1, invalid 1", "in the order of the states, not of the cells"
    assert lifecycle.finish(SweepPaths(tmp_path), report=False) == Exit.CELLS_FAILED
    assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["resume", str(tmp_path)]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == [f"nothing to resume: {line}"]


def test_after_a_sweep_every_file_written_is_listed(tmp_path: Path, tiny_config, capsys) -> None:
    _cell(tmp_path, tiny_config, "ok", metrics={"step_time_s": 0.2, "tokens_per_s": 100.0})
    assert lifecycle.finish(SweepPaths(tmp_path), report=True) == Exit.OK
    out = capsys.readouterr().out
    written = {line.removeprefix("wrote ").strip() for line in out.splitlines() if line.startswith("wrote ")}
    outputs = {str(p) for p in tmp_path.iterdir() if p.is_file() and p.suffix in (".csv", ".png", ".md")}
    assert written == outputs and {"cells.csv", "best.csv", "report.md"} <= {Path(p).name for p in written}


def test_version_and_help_list_every_command_and_the_exit_codes(capsys) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("gpudays ")
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("sweep", "plan", "status", "show", "resume", "report", "cluster"):
        assert any(line.split()[:1] == [command] and len(line.split()) > 2 for line in out.splitlines()), command
    for code in Exit:
        assert f"  {code.value} " in out, code


def test_a_local_run_shows_each_cells_own_time(tmp_path: Path, capsys) -> None:
    progress = console.LocalProgress(2)
    progress.QUIET_S = 0  # piped: a line at every poll, not every 30 s
    stdout, stderr = tmp_path / "log.out", tmp_path / "log.err"
    stdout.write_text("submitit INFO starting\n")
    stderr.write_text("\nloading the model\n\n")  # the newer of the two logs is shown
    with progress:
        for cid, took_s in (("first", 100), ("second", 3)):
            run = local.LocalRun(cid, "tiny", "1", time.monotonic() - took_s, (stdout, stderr))
            progress.start(run)
            progress.poll(run)
            progress.done(
                SimpleNamespace(cell_id=cid, state="ok", reason=None, record=SimpleNamespace(metrics=Metrics()))
            )
    out = capsys.readouterr().out
    assert "[1/2] first tiny: running, 100 s  | loading the model" in out
    assert "[1/2] first ok in 100 s" in out
    assert "[2/2] second ok in 3 s" in out, "the second cell's time is its own, not the sum"


def test_cost_and_energy_columns_are_shown_where_the_frame_has_them(capsys) -> None:
    cell = SimpleNamespace(
        cell_id="c1",
        label="pythia-70m h100-80gb x1 zero0 bf16 mb=auto",
        typed=to_config(synthetic.cell_config("pythia-70m", "h100-80gb")),  # the plan's row is the typed cell's
        prediction={"predicted_fits": True, "predicted_step_time_s": 0.5, "predicted_gpu_hours": 10.0},
    )
    plan = SimpleNamespace(cells=[cell], skipped=[])
    c = console.make_console()
    c.print(console.plan_table(plan))
    header = capsys.readouterr().out.splitlines()[0].split()
    assert "gpu_h" in header and "usd_cloud" not in header
    cell.prediction |= {
        "predicted_cost_usd_cloud": 12.5,
        "predicted_cost_usd_amortised": 3.0,
        "predicted_energy_kwh": 7,
    }
    c.print(console.plan_table(plan))
    header = capsys.readouterr().out.splitlines()[0].split()
    assert {"usd_cloud", "usd_amortised", "kwh"} <= set(header)
    frame = pd.DataFrame(
        [{"cell_id": "c1", "status": "ok", "gpu_hours": 1.0, "cost_usd_cloud": 2.0, "energy_kwh": 3.0}]
    )
    c.print(console.cells_table(frame))
    assert {"gpu_h", "usd_cloud", "kwh"} <= set(capsys.readouterr().out.splitlines()[0].split())


def test_cluster_help_lists_its_verbs(capsys) -> None:
    from orchestrator.cli import main as cli

    with pytest.raises(SystemExit) as ended:
        cli.main(["cluster", "--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    for verb in ("up", "down", "status", "env"):
        assert f"    {verb} " in out, out


def _running(sweep_dir: Path, config: dict[str, Any]) -> str:
    """A local cell whose job is still running: its attempt names this test's own (live) process."""
    import os

    paths = SweepPaths(sweep_dir)
    cid = f"running{len(paths.cell_ids())}"
    launch.write_cell(paths, cid, to_config(config))
    append_jsonl(paths.attempts(cid), {"cell_id": cid, "attempt": 1, "job_id": str(os.getpid()), "backend": "local"})
    return cid


def test_a_local_cell_that_ends_while_status_looks_is_ok_not_lost(
    tmp_path: Path, tiny_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The record is read first, the process asked after: a job that writes its record and ends in between was
    # called lost ("no record, and its process is gone").
    from orchestrator.submission import intents, status

    ended = _cell(tmp_path, tiny_config, "ok")
    paths = SweepPaths(tmp_path)
    record = paths.record(ended).read_text()
    paths.record(ended).unlink()

    def ends_now(pid: int, started: float | None) -> bool:
        paths.record(ended).write_text(record)  # the job writes its record and ends as it is asked about
        return False

    monkeypatch.setattr(intents, "process_alive", ends_now)
    (state,) = status.cell_states(paths)
    assert state.state == "ok", (state.state, state.reason)


def test_status_check_exits_non_zero_while_a_cell_is_still_running(tmp_path: Path, tiny_config, capsys) -> None:
    _cell(tmp_path, tiny_config, "ok")
    _running(tmp_path, tiny_config)
    assert cli.main(["status", str(tmp_path), "--check", "--summary"]) == Exit.ACTIVE
    _cell(tmp_path, tiny_config, "failed", reason="boom")
    assert cli.main(["status", str(tmp_path), "--check", "--summary"]) == Exit.CELLS_FAILED, "a rerun comes first"


def test_resume_wait_with_nothing_to_resubmit_waits_for_the_running_cells(
    tmp_path: Path, tiny_config, capsys, monkeypatch
) -> None:
    _cell(tmp_path, tiny_config, "ok")
    _running(tmp_path, tiny_config)
    waited: list[Path] = []
    monkeypatch.setattr(lifecycle, "wait_for", lambda paths, interval_s=5.0, waves=None: waited.append(paths.root))
    cli.main(["resume", str(tmp_path), "--wait"])
    assert waited == [tmp_path], "--wait waits for every active cell, whoever submitted it"


def test_ctrl_c_while_waiting_says_the_jobs_keep_running_and_how_to_follow_them(
    tmp_path: Path, tiny_config, capsys, monkeypatch
) -> None:
    from orchestrator.cli import folder

    _running(tmp_path, tiny_config)

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(folder.time, "sleep", ctrl_c)
    assert cli.main(["resume", str(tmp_path), "--wait"]) == Exit.INTERRUPTED
    err = capsys.readouterr().err
    assert "stopped waiting, not the jobs" in err and "keep running" in err
    for hint in (["status", str(tmp_path), "--watch"], ["cancel", str(tmp_path)]):
        assert shlex.join(["gpudays", *hint]) in err


def test_a_failed_submission_leaves_every_record_where_it_was(tmp_path: Path, tiny_config, capsys, monkeypatch) -> None:
    cid = _cell(tmp_path, tiny_config, "failed", reason="boom")
    paths = SweepPaths(tmp_path)
    before = paths.record(cid).read_bytes()

    def refused(*args: Any, **kwargs: Any) -> list[Any]:
        raise OSError("No space left on device")

    monkeypatch.setattr(local, "submit_local", refused)
    assert cli.main(["resume", str(tmp_path)]) != Exit.OK
    assert paths.record(cid).read_bytes() == before, "the failed attempt's record stays until a new one is on its way"
    assert [p.name for p in paths.cell_dir(cid).glob("record*")] == ["record.json"]


def test_a_local_job_a_full_disk_kept_from_starting_leaves_the_cell_as_it_was(
    tmp_path: Path, tiny_config, capsys, monkeypatch
) -> None:
    import errno

    import submitit

    cid = _cell(tmp_path, tiny_config, "failed", reason="boom")
    paths = SweepPaths(tmp_path)
    record, attempts = paths.record(cid).read_bytes(), paths.attempts(cid).read_bytes()

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(paths.jobs_dir / "x_submitted.pkl"))

    monkeypatch.setattr(submitit.LocalExecutor, "submit", full)
    assert cli.main(["resume", str(tmp_path)]) == Exit.WRITE_FAILED
    assert "x_submitted.pkl: No space left on device; the cell was not started" in capsys.readouterr().err
    assert paths.record(cid).read_bytes() == record, "the record is moved aside only once a job has started"
    assert paths.attempts(cid).read_bytes() == attempts, "the intent of a job that never started is taken back"


def test_entries_that_are_not_cells_are_said_by_status_show_and_resume_and_never_followed(
    tmp_path: Path, tiny_config, capsys
) -> None:
    good = _cell(tmp_path, tiny_config, "failed", reason="boom")
    cells = SweepPaths(tmp_path).cells_dir
    (cells / "alias").symlink_to(cells / good)  # a link to another cell
    (cells / "stray").write_text("x")  # a file
    (cells / "noconfig").mkdir()  # a folder that lost its cell.yaml
    (cells / "noconfig" / "record.json").write_text("{}")
    assert SweepPaths(tmp_path).cell_ids() == [good]
    for argv in (["status", str(tmp_path)], ["show", str(tmp_path), good]):
        cli.main(argv)
        err = capsys.readouterr().err
        assert "cells/alias is a link" in err and "not followed" in err, argv
        assert "cells/stray is a file" in err and "cells/noconfig has no cell.yaml (it holds record.json)" in err
    before = (cells / good / "record.json").read_bytes()
    cli.main(["resume", str(tmp_path), "--only", "timeout"])  # nothing selected: the link's target is left alone
    assert "cells/alias is a link" in capsys.readouterr().err
    assert (cells / good / "record.json").read_bytes() == before
    assert not (cells / good / "attempts.jsonl").read_text().count("alias")


def test_a_torn_attempt_line_is_said_by_status_show_resume_and_report(tmp_path: Path, tiny_config, capsys) -> None:
    from analysis.sweeps.records import load_cells

    cid = _cell(tmp_path, tiny_config, "ok")
    paths = SweepPaths(tmp_path)
    with open(paths.attempts(cid), "a") as f:
        f.write('{"attempt": 2, "backend": "slurm", "tok')  # a crash mid-append
    said = f"cells/{cid}/attempts.jsonl: 1 line(s) cut short or unreadable, skipped"
    for argv in (["status", str(tmp_path)], ["show", str(tmp_path), cid], ["resume", str(tmp_path)]):
        cli.main(argv)
        assert said in capsys.readouterr().err, argv
    assert any(said in p for p in load_cells([tmp_path]).problems)
    assert [a.attempt for a in read_attempts(paths, cid)] == [1] and next_attempt(paths, cid) == 3


def test_a_record_that_is_a_fifo_is_corrupt_and_never_waited_on(tmp_path: Path, tiny_config, capsys) -> None:
    import os

    from orchestrator.store.record import BadRecord, read_record

    cid = _cell(tmp_path, tiny_config, "ok")
    paths = SweepPaths(tmp_path)
    paths.record(cid).unlink()
    os.mkfifo(paths.record(cid))  # a reader that opened this to read would wait for a writer forever
    found = read_record(paths.record(cid), cid)
    assert isinstance(found, BadRecord) and "FIFO" in found.reason
    assert cli.main(["status", str(tmp_path), "--summary"]) == Exit.OK
    assert "corrupt 1" in capsys.readouterr().out


def test_report_names_entries_that_are_not_cells_and_does_not_follow_links(tmp_path: Path, tiny_config) -> None:
    from analysis.sweeps.records import load_cells

    good = _cell(tmp_path, tiny_config, "ok")
    cells = SweepPaths(tmp_path).cells_dir
    (cells / "alias").symlink_to(cells / good)
    loaded = load_cells([tmp_path])
    assert list(loaded.frame["cell_id"]) == [good], "the link's target is one cell, read once"
    assert any("cells/alias is a link" in p for p in loaded.problems)


def test_show_prints_the_tail_of_both_the_jobs_output_and_its_error(tmp_path: Path, tiny_config, capsys) -> None:
    # A full disk's "No space left on device" came on the job's output while show printed only its empty error log.
    cid = _cell(tmp_path, tiny_config, "failed", reason="the job ended without a record")
    job = SweepPaths(tmp_path).job_dir("999999999")
    steps = "".join(f"step {i}\n" for i in range(40))
    (job / "999999999_0_log.out").write_text(f"{steps}cp: error writing 'x.pt': No space left on device\n")
    (job / "999999999_0_log.err").write_text("")
    assert cli.main(["show", str(tmp_path), cid]) == Exit.CELLS_FAILED
    out = capsys.readouterr().out
    assert "No space left on device" in out and "step 39" in out and "step 3\n" not in out, out
    assert "999999999_0_log.out (tail" in out and "999999999_0_log.err (tail" not in out, "an empty log: no tail"
    (job / "999999999_0_log.err").write_text("Traceback (most recent call last):\nOSError: [Errno 28]\n")
    assert cli.main(["show", str(tmp_path), cid]) == Exit.CELLS_FAILED
    out = capsys.readouterr().out
    assert "No space left on device" in out and "OSError: [Errno 28]" in out, "both logs' tails"


def test_a_slurm_sweep_in_a_folder_whose_path_holds_a_line_break_is_refused_as_bad_input(
    tmp_path: Path, tiny_config, capsys
) -> None:
    # sbatch reads the job script, which names the folder, a line at a time: resume exited 70, "a bug in gpudays".
    # (A local sweep there works: tests/unit/test_hostile_input.py.)
    folder = tmp_path / "a\nb"
    code = cli.main(["sweep", "--dir", str(folder), "cluster=slurm", "model=pythia-tiny", "gpu=cpu"])
    assert code == Exit.BAD_INPUT and "whose path holds a line break" in capsys.readouterr().err
    assert not folder.exists(), "nothing written"
    slurm = json.loads(json.dumps(tiny_config))
    slurm["cluster"]["backend"] = "slurm"
    _cell(folder, slurm, "failed", reason="boom")
    assert cli.main(["resume", str(folder)]) == Exit.BAD_INPUT
    assert "SLURM cells cannot be submitted from a folder whose path holds a line break" in capsys.readouterr().err
