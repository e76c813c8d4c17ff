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
