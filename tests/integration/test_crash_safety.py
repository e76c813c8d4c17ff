"""gpudays itself killed, and a full disk, on the real local SLURM cluster (issue: crash-safe sweep folders).

- ``sweep`` and ``resume`` are SIGKILLed at every point of a submission (``orchestrator.submission.faults``: before the intent,
  before, during and after sbatch, after the job ids are written), each in a sweep folder of its own, all at once
  on one cluster; then the README's loop ``until gpudays status DIR --check; do gpudays resume DIR --wait; done``
  must end every cell ``ok``, with one record.json per cell and exactly one job per attempt in ``sacct``; a job
  the killed command had sent is adopted, never submitted again.
- A sweep folder with a line of attempts.jsonl cut short, a cell folder that is a link to another cell, a file and
  a folder without cell.yaml under cells/, and a record that is a FIFO: every command names them, none is
  followed, nothing is submitted twice, nothing hangs.
- A small tmpfs, filled to within a few pages of full: ``sweep``, ``report`` and ``resume --only ok`` exit 5
  (naming the file) or succeed, and never leave a half-written file or move a record; once space is freed, the
  loop ends every cell ok.

A local cell's job left running by a killed gpudays: tests/integration/test_local_concurrency.py.

Cells sleep a second (``probe.kind=sleep``); each case's cells have their own job names (``name=``), by which
``sacct`` tells its jobs from the others'.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from benchmark_loader import load_benchmark
from waiting import wait_until

from orchestrator.cluster import LocalCluster
from orchestrator.store.attempts import read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_record
from orchestrator.store.states import State
from orchestrator.submission import faults, status

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLEEP = ["model=pythia-tiny", "gpu=cpu", "cluster.cpus_per_gpu=1", "probe.kind=sleep", "probe.sleep_s=1"]
# Three cells in two arrays (2 + 1), so that a kill at the first array leaves a second never sent.
SLURM = ["cluster=slurm", *SLEEP, "cluster.time_limit_min=5", "cluster.max_array_size=2"]
CELLS = "model.seq_length=33,34,35"
POINTS = ("before-intent", "before-sbatch", "during-sbatch", "after-sbatch", "after-attempt")
CASES = [(command, point) for command in ("sweep", "resume") for point in POINTS]
# The loop prints how often it resumed, then the states the moment it ended.
UNTIL_LOOP = (
    'n=0; until {gd} status "$1" --check >/dev/null; do n=$((n+1)); {gd} resume "$1" --wait --interval 1; done; '
    'echo "loops=$n"; {gd} status "$1" --summary'
)


def load_soak() -> ModuleType:
    """benchmarks/soak.py, whose check_jobs counts each attempt's jobs in sacct."""
    return load_benchmark("soak")


def gpudays(
    args: list[str],
    fault: str | None = None,
    timeout_s: float = 300,
    log: Path | None = None,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own, as a user runs it (``fault``: where it SIGKILLs itself). Its
    output is captured, or written to ``log``: a local job it leaves running holds a pipe open until it ends."""
    env = {k: v for k, v in os.environ.items() if k != faults.FAULT_ENV} | (env_extra or {})
    if fault:
        env[faults.FAULT_ENV] = fault
    command = [sys.executable, "-m", "orchestrator.cli.main", *args]
    if log is not None:
        with open(log, "w") as out:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=out, timeout=timeout_s).returncode
        return subprocess.CompletedProcess(command, code, log.read_text(), "")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def until_loop(folder: Path) -> subprocess.Popen[str]:
    """The README's loop on ``folder``, started (it prints ``loops=N`` when it ends)."""
    gd = f"{sys.executable} -m orchestrator.cli"
    return subprocess.Popen(
        ["bash", "-c", UNTIL_LOOP.format(gd=gd), "loop", str(folder)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_until_loops(folders: list[Path], timeout_s: float = 400) -> dict[Path, str]:
    """The README's loop on every folder at once, until each ends; what each printed."""
    loops = {folder: until_loop(folder) for folder in folders}
    out = {}
    deadline = time.monotonic() + timeout_s
    for folder, proc in loops.items():
        try:
            out[folder] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            for p in loops.values():
                p.kill()
            pytest.fail(f"the until-loop on {folder} did not end within {timeout_s:.0f} s")
        assert proc.returncode == 0, out[folder]
    return out


def sweep_args(folder: Path, name: str, *extra: str) -> list[str]:
    return ["sweep", "--dir", str(folder), "--no-report", f"name={name}", *SLURM, CELLS, *extra]


def every_cell_ok_once(paths: SweepPaths) -> dict[str, list[int]]:
    """Assert every cell ok, its record.json from its latest attempt, attempts numbered 1..n; the attempts."""
    states = status.cell_states(paths)
    assert [s.state for s in states] == [State.OK] * 3, [(s.cell_id, s.state, s.reason) for s in states]
    out = {}
    for cid in paths.cell_ids():
        numbers = [a.attempt for a in read_attempts(paths, cid)]
        assert numbers == list(range(1, len(numbers) + 1)), (cid, numbers)
        record = read_record(paths.record(cid), cid)
        assert isinstance(record, Record) and record.attempt == numbers[-1], (cid, record)
        assert str(record.environment.get("job_id")) == read_attempts(paths, cid)[-1].job_id
        others = sorted(p.name for p in paths.cell_dir(cid).glob("record*.json") if p.name != "record.json")
        assert len(others) <= len(numbers) - 1, (cid, others)
        out[cid] = numbers
    return out


def one_job_per_attempt(cluster: LocalCluster, paths: SweepPaths, since_s: float, name: str) -> None:
    problems = load_soak().check_jobs(cluster, paths, since_s, f"gpudays-{name}-")
    assert problems == [], problems


# ---- SIGKILL at every point of a submission ----------------------------------------------------------------


@dataclass
class Killed:
    folder: Path
    name: str
    returncode: int
    intents_at_kill: dict[str, list[int]]
    """Cell id -> the attempt numbers attempts.jsonl held when the command died."""
    states_after: dict[str, tuple[State, str | None]] = field(default_factory=dict)
    """Each cell's state as the first command after the kill saw it."""
    loop_output: str = ""


@dataclass
class KilledRun:
    since_s: float
    cases: dict[tuple[str, str], Killed]


def intents(paths: SweepPaths) -> dict[str, list[int]]:
    return {cid: [a.attempt for a in read_attempts(paths, cid)] for cid in paths.cell_ids()}


@pytest.fixture(scope="module")
def killed(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilledRun]:
    root = tmp_path_factory.mktemp("killed")
    since_s = time.time() - 1
    names = {case: f"crash-{case[0]}-{case[1]}" for case in CASES}
    folders = {case: root / f"{case[0]}-{case[1]}" for case in CASES}
    # The resume cases: three cells that fail (probe.kind=fail), then are fixed by sweeping them again with the
    # sleep probe (which rewrites cell.yaml and submits nothing): resume has three failed cells to resubmit.
    for case in CASES:
        if case[0] == "resume":
            done = gpudays(sweep_args(folders[case], names[case], "probe.kind=fail"))
            assert done.returncode == 0, done.stdout + done.stderr
    for case in CASES:
        if case[0] == "resume":
            paths = SweepPaths(folders[case])
            wait_until(lambda p=paths: status.is_done(status.cell_states(p)), 120, f"{paths.root}'s failing cells")
            again = gpudays(sweep_args(folders[case], names[case]))
            # Exit 1: nothing was submitted, and three cells need a rerun.
            assert again.returncode == 1 and "3 cell(s) already in this sweep" in again.stdout, again.stdout
    # "During sbatch" is made to last: an sbatch that submits, then waits 3 s before it answers, and gpudays killed
    # 1 s after it called it. The scheduler has the job; gpudays never learnt its id (nor moved its pickle).
    slow = root / "slow-sbatch"
    slow.mkdir()
    real = shutil.which("sbatch")
    assert real, "sbatch is not on PATH"
    (slow / "sbatch").write_text(f'#!/bin/sh\nout=$({real} "$@")\ncode=$?\nsleep 3\necho "$out"\nexit $code\n')
    (slow / "sbatch").chmod(0o755)
    during = {"PATH": f"{slow}{os.pathsep}{os.environ['PATH']}", "GPUDAYS_FAULT_DELAY_S": "1"}
    cases = {}
    for case in CASES:
        command, point = case
        args = sweep_args(folders[case], names[case]) if command == "sweep" else ["resume", str(folders[case])]
        cut = gpudays(args, fault=point, env_extra=during if point == "during-sbatch" else None)
        k = cases[case] = Killed(folders[case], names[case], cut.returncode, intents(SweepPaths(folders[case])))
        # The next command, at once (as the README's loop would): it adopts the job the killed one sent, and
        # writes the pickle submitit had not moved into place, which the job waits a minute for when it starts.
        if SweepPaths(k.folder).cell_ids():
            k.states_after = {s.cell_id: (s.state, s.reason) for s in status.cell_states(SweepPaths(k.folder))}
    for folder, said in run_until_loops([k.folder for k in cases.values() if SweepPaths(k.folder).cell_ids()]).items():
        next(k for k in cases.values() if k.folder == folder).loop_output = said
    # A sweep killed before any cell was written is run again, as its user would.
    for k in cases.values():
        if not SweepPaths(k.folder).cell_ids():
            again = gpudays(sweep_args(k.folder, k.name))
            assert again.returncode == 0, again.stdout + again.stderr
            k.loop_output = run_until_loops([k.folder])[k.folder]
    yield KilledRun(since_s, cases)


@pytest.mark.parametrize(("command", "point"), CASES, ids=[f"{c}-{p}" for c, p in CASES])
def test_a_killed_submission_ends_every_cell_ok_with_one_job_per_attempt(
    killed: KilledRun, slurm_cluster: LocalCluster, command: str, point: str
) -> None:
    k = killed.cases[(command, point)]
    assert k.returncode == -signal.SIGKILL, f"gpudays {command} was to be killed at {point}"
    paths = SweepPaths(k.folder)
    numbers = every_cell_ok_once(paths)
    one_job_per_attempt(slurm_cluster, paths, killed.since_s, k.name)
    # A cell whose job may exist is never `new`, and is never submitted again while it does.
    for cid, (state, reason) in k.states_after.items():
        if k.intents_at_kill.get(cid):
            assert state is not State.NEW, (cid, reason)
    first = 1 if command == "sweep" else 2  # the attempt the killed command was submitting
    cut_short = [cid for cid, n in k.intents_at_kill.items() if n and n[-1] == first]
    if point in ("before-intent", "before-sbatch"):
        assert len(cut_short) == (0 if point == "before-intent" else 2), k.intents_at_kill
        for cid in cut_short:  # never reached the scheduler: lost, and submitted again as the next attempt
            assert k.states_after[cid][0] is State.LOST, k.states_after[cid]
            assert numbers[cid] == [*range(1, first + 1), first + 1], numbers[cid]
    if point == "during-sbatch":  # the first array's intents were written; its job was adopted, or never was
        assert len(cut_short) == 2, k.intents_at_kill
        for cid in cut_short:
            assert k.states_after[cid][0] in (State.PENDING, State.RUNNING, State.OK, State.LOST), k.states_after
    if point in ("after-sbatch", "after-attempt"):
        # The killed command's first array was sent: adopted by its name, its cells never submitted again.
        assert len(cut_short) == 2, k.intents_at_kill
        for cid in cut_short:
            assert k.states_after[cid][0] in (State.PENDING, State.RUNNING, State.OK), k.states_after[cid]
            assert numbers[cid] == list(range(1, first + 1)), numbers[cid]
    if command == "resume":  # the failed attempt's record is kept under its name, never lost
        for cid in paths.cell_ids():
            kept = read_record(paths.cell_dir(cid) / "record.attempt1.json", cid)
            assert isinstance(kept, Record) and kept.status.value == "failed", (cid, kept)


def test_the_until_loop_ends_only_when_the_last_cell_has(killed: KilledRun) -> None:
    # Each loop ran while cells were queued (the killed command's own, or those it left to resume); it ended with
    # every cell ok (checked above), after at least one resume where something was left to submit.
    for case, k in killed.cases.items():
        loops, _, after = k.loop_output.rpartition("loops=")[2].partition("\n")
        assert loops.isdigit() and int(loops) >= 1, (case, k.loop_output)
        assert "3 cell(s): ok 3" in after, (case, k.loop_output)


# ---- a damaged sweep folder -----------------------------------------------------------------------------------


def test_a_torn_attempt_line_links_stray_entries_and_a_fifo_record_are_named_and_never_run_twice(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    since_s, name = time.time() - 1, "crash-damaged"
    folder = tmp_path / "sweep"
    paths = SweepPaths(folder)
    # The cells sleep 20 s: `status --check` below must find the torn cell's job still pending or running, after
    # two commands' start-up on a busy machine (6 s was once not enough: every cell had ended).
    done = gpudays(sweep_args(folder, name, "probe.sleep_s=20", "cluster.max_array_size=3"))
    assert done.returncode == 0, done.stdout + done.stderr
    torn, linked, fifo = paths.cell_ids()
    # A resume killed mid-way through writing attempt 2's intent (never submitted: sbatch comes after it).
    with open(paths.attempts(torn), "a") as f:
        f.write(f'{{"attempt": 2, "backend": "slurm", "cell_id": "{torn}", "tok')
    cells = paths.cells_dir
    (cells / "alias").symlink_to(cells / linked)  # a cell folder that is a link to another cell
    (cells / "stray").write_text("x")  # a folder that became a file
    (cells / "noconfig").mkdir()  # a folder that lost its cell.yaml
    (cells / "noconfig" / "record.json").write_text("{}")
    named = (
        "cells/alias is a link",
        "cells/stray is a file",
        "cells/noconfig has no cell.yaml",
        f"cells/{torn}/attempts.jsonl: 1 line(s) cut short",
    )

    checked = gpudays(["status", str(folder), "--check"])
    assert checked.returncode == 4, checked.stdout + checked.stderr  # pending or running: the loop goes on
    assert all(n in checked.stderr for n in named), checked.stderr
    states = {s.cell_id: s for s in status.cell_states(paths)}
    assert states[torn].state in (State.PENDING, State.RUNNING) and states[torn].attempt == 1, states[torn]
    resumed = gpudays(["resume", str(folder)])
    assert resumed.returncode == 0 and "nothing to resume" in resumed.stdout, resumed.stdout + resumed.stderr
    assert all(n in resumed.stderr for n in named), resumed.stderr
    shown = gpudays(["show", str(folder), torn])
    assert all(n in shown.stderr for n in named), shown.stderr
    reported = gpudays(["report", str(folder)])
    assert reported.returncode == 0 and all(n in reported.stdout for n in named), reported.stdout
    run_until_loops([folder])
    assert [a.attempt for a in read_attempts(paths, torn)] == [1], "the torn line's attempt was never submitted"
    assert "alias" not in paths.attempts(linked).read_text()
    assert not any(p.name != "record.json" for p in paths.cell_dir(linked).glob("record*")), "the target is intact"

    # A record that is a FIFO: status answers (corrupt), and the loop reruns the cell.
    paths.record(fifo).unlink()
    os.mkfifo(paths.record(fifo))
    answered = gpudays(["status", str(folder), "--summary"], timeout_s=60)
    assert "corrupt 1" in answered.stdout, answered.stdout + answered.stderr
    run_until_loops([folder])
    numbers = every_cell_ok_once(paths)
    assert numbers == {torn: [1], linked: [1], fifo: [1, 2]}, numbers
    assert (paths.cell_dir(fifo) / "record.corrupt-attempt1.json").is_fifo()
    one_job_per_attempt(slurm_cluster, paths, since_s, name)


# ---- a full disk ---------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (this test runs as root, as the local cluster needs)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, free_bytes: int) -> None:
    """Leave ``free_bytes`` free on ``disk`` (a filler file takes the rest)."""
    filler = disk / "filler"
    filler.unlink(missing_ok=True)
    stat = os.statvfs(disk)
    take = stat.f_bavail * stat.f_frsize - free_bytes
    if take > 0:
        with open(filler, "wb") as f:
            f.write(b"\0" * take)


def gpudays_files(folder: Path) -> dict[Path, bytes]:
    """Every file gpudays itself writes in a sweep folder (not submitit's under jobs/), with its bytes."""
    found = [p for p in folder.rglob("*") if p.is_file() and not p.is_relative_to(folder / "jobs")]
    return {p: p.read_bytes() for p in found if p.name != ".submit.lock"}


def assert_whole(folder: Path) -> None:
    """No file half-written: none empty, every JSON, JSON-lines and YAML file parses, no temporary file left."""
    for path, data in gpudays_files(folder).items():
        assert not path.name.startswith(".") and ".writing." not in str(path), f"left over: {path}"
        assert data, f"{path} is empty"
        if path.suffix == ".json" and path.name != "sweep.json":
            json.loads(data)
        elif path.suffix == ".jsonl" or path.name == "sweep.json":  # sweep.json: a line per sweep command
            assert data.endswith(b"\n"), f"{path} ends mid-line"
            for line in data.splitlines():
                json.loads(line)
        elif path.suffix == ".yaml":
            assert isinstance(yaml.safe_load(data), dict), path
        elif path.suffix == ".csv":
            assert data.endswith(b"\n"), f"{path} ends mid-line"


def test_a_full_disk_never_leaves_a_half_written_file_and_exits_5(
    slurm_cluster: LocalCluster, small_disk: Path
) -> None:
    since_s = time.time() - 1
    # The sweep on a disk with 0, 1, 3... pages free, until it fits (about 15 pages: sweep.json, then each cell's
    # cell.yaml and intent, then submitit's pickles): each run exits 5 naming the file it could not write, or 0,
    # and leaves every file whole.
    folders: list[Path] = []
    codes: list[int] = []
    for pages in (0, 1, 3, 5, 8, 11, 14, 18, 24, 32, 48):
        if codes and codes[-1] == 0:
            break
        folder = small_disk / f"sweep{len(folders)}"
        fill(small_disk, 4096 * pages)
        cut = gpudays(sweep_args(folder, f"crash-disk{len(folders)}"))
        folders.append(folder)
        codes.append(cut.returncode)
        assert cut.returncode in (0, 5), cut.stdout + cut.stderr
        if cut.returncode == 5:
            assert f"cannot write {folder}" in cut.stderr and "No space left" in cut.stderr, cut.stderr
        if folder.exists():
            assert_whole(folder)
    assert codes[-1] == 0 and codes.count(5) >= 3, codes

    # Space again: each sweep run again, as its user would, then the README's loop: every cell ok, once.
    fill(small_disk, 1 << 30)
    for i, folder in enumerate(folders):
        again = gpudays(sweep_args(folder, f"crash-disk{i}"))
        assert again.returncode in (0, 1), again.stdout + again.stderr
    run_until_loops(folders)
    for i, folder in enumerate(folders):
        every_cell_ok_once(SweepPaths(folder))
        one_job_per_attempt(slurm_cluster, SweepPaths(folder), since_s, f"crash-disk{i}")

    # The report on a full disk: exit 5 naming the file; the old report is kept whole.
    paths = SweepPaths(folders[-1])
    assert gpudays(["report", str(paths.root)]).returncode == 0
    before = gpudays_files(paths.root)
    assert paths.output("cells.csv") in before
    fill(small_disk, 0)
    full = gpudays(["report", str(paths.root)])
    assert full.returncode == 5 and f"cannot write {paths.root}" in full.stderr, full.stdout + full.stderr
    assert gpudays_files(paths.root) == before
    assert_whole(paths.root)

    # resume --only ok on a full disk: exit 5, and every cell still ok with its record where it was.
    resumed = gpudays(["resume", str(paths.root), "--only", "ok"])
    assert resumed.returncode == 5 and f"cannot write {paths.root}" in resumed.stderr, resumed.stdout + resumed.stderr
    assert "sbatch" not in resumed.stderr, "the disk, not the scheduler, refused"
    assert gpudays_files(paths.root) == before
    assert [s.state for s in status.cell_states(paths)] == [State.OK] * 3
    fill(small_disk, 1 << 30)
    one_job_per_attempt(slurm_cluster, paths, since_s, f"crash-disk{len(folders) - 1}")
    assert [s.state for s in status.cell_states(paths)] == [State.OK] * 3
