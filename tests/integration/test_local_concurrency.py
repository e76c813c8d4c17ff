"""Two commands on one sweep folder at once, on this machine (real processes, cluster=local, a probe that returns at
once): each cell is submitted once, each failed cell rerun once, and the failed attempt's record is kept. And a
local cell's job left running by a killed gpudays is waited for before the next cell starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_crash_safety import SLEEP, gpudays

from orchestrator.cli import main as cli
from orchestrator.store.attempts import read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_record
from orchestrator.store.states import State
from orchestrator.submission import status

REPO = Path(__file__).resolve().parents[2]


def _gpudays(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.main", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_two_resumes_at_once_rerun_each_failed_cell_once(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "s"
    common = ["--dir", str(sweep_dir), "model.seq_length=32,48,64"]
    # probe.kind=fail raises in the job: three cells fail for real.
    assert cli.main(["sweep", *common, "probe.kind=fail", "--no-report"]) == 1
    paths = SweepPaths(sweep_dir)
    cells = paths.cell_ids()
    assert len(cells) == 3
    assert all(json.loads(paths.record(c).read_text())["status"] == "failed" for c in cells)
    assert "InjectedFailure" in json.loads(paths.record(cells[0]).read_text())["traceback"]
    # Remove the fault: the same sweep again with a good setting rewrites the cells' configs (the probe's settings
    # are not part of a cell's identity) and submits nothing. Then resume twice at once.
    capsys.readouterr()
    assert cli.main(["sweep", *common, "probe.kind=sleep", "probe.sleep_s=0", "--no-report"]) == 1
    assert "3 cell(s) already in this sweep" in capsys.readouterr().out
    assert all("sleep_s: 0.0" in paths.cell_config(c).read_text() for c in cells)

    procs = [_gpudays("resume", str(sweep_dir)) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("resubmitting 3 cell(s)" in out for out in outputs) == 1, outputs
    assert sum("nothing to resume" in out for out in outputs) == 1, outputs
    for c in cells:
        # One submission per attempt (its intent and its start merged into one, as every reader sees them).
        assert [a.attempt for a in read_attempts(paths, c)] == [1, 2]
        record = json.loads(paths.record(c).read_text())
        assert (record["status"], record["attempt"]) == ("ok", 2)
        # The failed attempt's record is kept under its attempt's name.
        assert json.loads(paths.cell_dir(c).joinpath("record.attempt1.json").read_text())["status"] == "failed"


def test_two_sweeps_at_once_into_one_folder_submit_each_cell_once(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    args = ["sweep", "--dir", str(sweep_dir), "probe.kind=sleep", "model.seq_length=32,48", "--no-report"]
    procs = [_gpudays(*args) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("2 cell(s) already in this sweep" in out for out in outputs) == 1, outputs
    paths = SweepPaths(sweep_dir)
    for c in paths.cell_ids():
        assert len(read_attempts(paths, c)) == 1


def test_ctrl_c_during_a_local_sweep_ends_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    # Exit 130 and `gpudays: error: interrupted`, then submitit's controller printed its KeyboardInterrupt traceback.
    import time

    sweep_dir = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.main", "sweep", "--dir", str(sweep_dir), "probe.kind=sleep",
         "probe.sleep_s=120", "--no-report"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's Ctrl-C, not ignored
    )  # fmt: skip
    paths = SweepPaths(sweep_dir)
    deadline = time.monotonic() + 120
    # The job has said where it runs: its handler for Ctrl-C is in place (one that came sooner would be held).
    while not list(sweep_dir.glob("cells/*/ranks/attempt*-rank0.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "the cell did not start"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches every process of the terminal's group
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "gpudays: error: interrupted" in out and "Traceback" not in out and "KeyboardInterrupt" not in out, out
    # The interrupted cell is `cancelled`, interrupted, not `failed: KeyboardInterrupt` (or `lost`, its record cut
    # off by the SIGINT submitit's controller forwards); `resume` reruns it.
    (cid,) = paths.cell_ids()
    deadline = time.monotonic() + 60  # its own minute: a slow start must not eat the record's time
    while not paths.record(cid).exists():  # the job's last second, after gpudays itself has exited
        assert time.monotonic() < deadline, "the interrupted cell wrote no record"
        time.sleep(0.2)
    record = json.loads(paths.record(cid).read_text())
    assert record["status"] == "cancelled", record
    assert record["reason"].startswith("interrupted (Ctrl-C: SIGINT at "), record["reason"]


def test_a_local_cell_left_running_by_a_killed_sweep_is_waited_for_before_the_next_starts(tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    paths = SweepPaths(folder)
    args = ["sweep", "--dir", str(folder), "--no-report", "cluster=local", *SLEEP, "probe.sleep_s=12"]
    # Killed right after the first cell's job started, before its process id was written: the job runs on.
    cut = gpudays([*args, "model.seq_length=33,34"], fault="local-started", log=tmp_path / "killed.log")
    assert cut.returncode == -signal.SIGKILL, cut.stdout + cut.stderr
    states = {s.cell_id: s for s in status.cell_states(paths)}
    (first,) = [c for c, s in states.items() if s.attempt == 1]
    assert states[first].state is State.RUNNING, (states[first].state, states[first].reason)
    (second,) = set(states) - {first}
    assert states[second].state is State.NEW
    resumed = gpudays(["resume", str(folder), "--wait", "--interval", "1"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [s.state for s in status.cell_states(paths)] == [State.OK, State.OK]
    records = {cid: read_record(paths.record(cid), cid) for cid in (first, second)}
    assert all(isinstance(r, Record) and r.attempt == 1 for r in records.values()), records
    ran_first, ran_second = records[first], records[second]
    assert isinstance(ran_first, Record) and isinstance(ran_second, Record)
    assert (ran_first.finished_at or "") <= (ran_second.started_at or ""), "the two cells ran side by side"
    # The orphan was adopted with its process id, never started again.
    assert [a.attempt for a in read_attempts(paths, first)] == [1]
    assert read_attempts(paths, first)[0].job_id == str(ran_first.environment.get("job_id"))
