"""A job's SIGTERM is the time limit's only near its start plus its limit: scancel moves EndTime, not these."""

from __future__ import annotations

import datetime as dt

import pytest

from orchestrator.job import entry as jobside
from orchestrator.slurm import commands as slurm


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30:00", dt.timedelta(minutes=30)),
        ("1:00:00", dt.timedelta(hours=1)),
        ("2-03:04:05", dt.timedelta(days=2, hours=3, minutes=4, seconds=5)),
        ("1-02:03", dt.timedelta(days=1, hours=2, minutes=3)),
        ("UNLIMITED", None),
        ("NOT_SET", None),
    ],
)
def test_squeue_time_limits_are_read(text: str, expected: dt.timedelta | None) -> None:
    assert slurm.parse_time_limit(text) == expected


def test_a_cancel_is_not_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # What squeue says of a job scancelled 8 s into a 60-minute limit: EndTime is the cancel's moment, but its
    # start plus its limit is an hour away.
    now = dt.datetime.now().replace(microsecond=0)
    start = now - dt.timedelta(seconds=8)
    answers = {"%e": now.isoformat(), "%S|%l": f"{start.isoformat()}|1:00:00"}

    def fake_run(cmd, timeout_s=10):  # noqa: ANN001, ANN202 - stands in for slurm.run
        return type("Done", (), {"stdout": answers[cmd[-1]] + "\n"})()

    monkeypatch.setattr(slurm, "run", fake_run)
    assert jobside.seconds_left("7", 0.0) < jobside.SLURM_CHECK_INTERVAL_S, "EndTime alone calls it the limit"
    assert jobside.seconds_to_limit("7", 0.0) > 3500
    answers["%S|%l"] = f"{(now - dt.timedelta(minutes=60)).isoformat()}|1:00:00"
    assert jobside.seconds_to_limit("7", 0.0) < jobside.SLURM_CHECK_INTERVAL_S, "at the limit it is the limit"


def test_a_cancel_ends_every_rank_with_a_record_and_no_traceback(tmp_path, slurm_cell_job) -> None:
    # Rank 1 of two, cancelled while its probe runs: submitit's handler only logged the SIGTERM, so the rank ran on
    # until SLURM killed it, and a rank that did end raised RankEnded, a traceback in the job's log.
    import os
    import signal
    import threading
    import time

    from orchestrator.store.paths import SweepPaths
    from orchestrator.store.record import Record, read_record

    overrides = ("model=pythia-tiny", "gpu=cpu", "probe.kind=sleep", "probe.sleep_s=8", "num_gpus=2")
    job = slurm_cell_job(*overrides, rank=1, num_tasks=2, cancelled=True)
    paths = SweepPaths(tmp_path)
    submitit_warning = lambda signum, frame: None  # noqa: E731 - stands in for submitit's requeue handler
    signal.signal(signal.SIGUSR2, submitit_warning)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # submitit's: it only logs the signal
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        started = time.monotonic()
        timer.start()
        status = job()  # raised RankEnded for rank 0; slept on for rank 1
        took = time.monotonic() - started
        assert signal.getsignal(signal.SIGUSR2) is submitit_warning, "only rank 0 requeues"
    finally:
        timer.cancel()
    assert status == "cancelled" and took < 5, (status, took)
    record = read_record(paths.record("abc"), "abc")
    assert isinstance(record, Record) and record.status.value == "cancelled"
    assert record.environment["recorded_by_rank"] == 1
    assert (record.reason or "").startswith("the job was cancelled (scancel)"), record.reason
