"""SLURM's time-limit warning may reach a job in its first second (one 30-second tick checks every job's limit;
a limit under the 90-s warning window is warned at the first tick): the job's first Python holds it, instead of
dying of it, and the cell's own handler takes it up once in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.job import entry as jobside
from orchestrator.job import start

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_runner_and_its_arguments_are_read_from_submitits_command() -> None:
    assert start.runner(["-u", "-m", "submitit.core._submit", "/sweep/jobs/%j"]) == (
        "submitit.core._submit",
        ["/sweep/jobs/%j"],
    )
    with pytest.raises(SystemExit, match="usage"):
        start.runner(["/sweep/jobs/%j"])


def test_a_warning_before_any_handler_is_held_not_fatal(tmp_path) -> None:
    # A job runner that is warned before it could install anything: the process lives, and the warning is held.
    (tmp_path / "warned_runner.py").write_text(
        "import os, signal, sys\n"
        "from orchestrator.job import start\n"
        "os.kill(os.getpid(), start.WARNING)\n"
        "print('held', start.held_warning() is not None, start.held_warning(), sys.argv[1:])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    done = subprocess.run(
        [sys.executable, "-u", "-m", "orchestrator.job.start", "-u", "-m", "warned_runner", "FOLDER"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "held True None ['FOLDER']", done.stdout  # held once, then taken


def test_the_job_python_starts_with_the_holder(make_typed) -> None:
    from orchestrator.submission import launch

    executor = launch.slurm_executor(launch.resources(make_typed("cluster=slurm", "gpu=cpu")), "/sweep/jobs/%j")
    assert " -u -m orchestrator.job.start -u -m submitit.core._submit " in executor._submitit_command_str


class Requeued(SystemExit):
    """What submitit's handler ends the process with once it has asked SLURM to requeue the job."""


@pytest.mark.parametrize("held", [True, False])
def test_a_held_warning_is_taken_up_by_the_cells_handler(
    slurm_cell_job, monkeypatch: pytest.MonkeyPatch, capsys, held: bool
) -> None:
    overrides = ("model=pythia-tiny", "gpu=cpu", "probe.kind=sleep", "probe.sleep_s=0.1", "cluster.time_limit_min=1")
    job = slurm_cell_job(*overrides)
    monkeypatch.setattr(jobside, "seconds_left", lambda job_id, fallback_end: 10.0)  # under REQUEUE_MARGIN_S
    asked: list[int] = []

    def submitit_warning(signum, frame):  # noqa: ANN001, ANN202 - stands in for submitit's requeue handler
        asked.append(signum)
        job.checkpoint()
        raise Requeued(0)

    signal.signal(signal.SIGUSR2, submitit_warning)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    monkeypatch.setattr(start, "_held", time.time() - 1.5 if held else None)
    if held:
        with pytest.raises(Requeued):
            job()
    else:
        assert job() == "ok"
    assert asked == ([signal.SIGUSR2] if held else [])
    assert job.requeues.get("timeout", 0) == (1 if held else 0), job.requeues
    assert start.held_warning() is None
    if held:
        said = capsys.readouterr()
        assert "before this handler: taken up now" in said.out + said.err
