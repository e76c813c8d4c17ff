"""Hostile input through the whole command line: shell metacharacters and newlines in every string that reaches a
command or a file name, non-UTF-8 bytes, truncated files, wrong types and huge numbers in a sweep folder.

Every case goes through ``cli.main`` as a user's command would. None may end in a traceback or an internal error,
run injected code (a canary file that must not appear), or lose or overwrite a record. One real cell runs (a
sleep probe, a few seconds); resuming damaged folders uses a stand-in for the local run, so the unit tier stays
fast (real resumes of failed cells run in tests/integration/test_local_concurrency.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli.errors import Exit
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import local

ACCEPTED = {Exit.OK, Exit.CELLS_FAILED, Exit.BAD_INPUT, Exit.SCHEDULER}


def _injections(canary: Path) -> list[str]:
    """Ways a string could run ``touch CANARY`` if it ever reached a shell unquoted."""
    touch = f"touch {canary}"
    return [f"$({touch})", f"`{touch}`", f";{touch}", f"\n{touch}", f"' ; {touch} ; '", f"| {touch}"]


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "canary"


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert code in ACCEPTED, (argv, code, err)
    if code == Exit.BAD_INPUT:
        assert err.startswith("gpudays: error: "), (argv, err)
    return code, out, err


KEYS = ("model.seq_length=32", "probe.sleep_s=", "model=pythia-tiny", "+cluster.env.X=", "hydra.sweep.dir=/tmp/x")
ODD_VALUES = (
    "num_gpus=99999999999999999999999999",
    "num_gpus=-3",
    "num_gpus=banana",
    "model.seq_length=1e309",
    "cluster.time_limit_min=1e400",
    "model=../../../etc/passwd",
    "gpu=cpu,../x",
    "model=\udcff\udcfe",  # what Python makes of non-UTF-8 bytes on the command line
    "+experiment=demo\x00",
    "=",
    "model.seq_length=${oc.env:HOME}",
)


def hostile_overrides(canary: Path, every: bool = True) -> list[str]:
    """Every injection in every key (``every``), or each injection once, in turn in each key (the unit tier)."""
    injections = _injections(canary)
    if every:
        return [key + inj for key in KEYS for inj in injections] + list(ODD_VALUES)
    return [KEYS[i % len(KEYS)] + inj for i, inj in enumerate(injections)] + list(ODD_VALUES[:4]) + [ODD_VALUES[7]]


def test_hostile_overrides_through_plan_write_and_run_nothing(canary: Path, tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "planned"
    for override in hostile_overrides(canary, every=False):
        _run(capsys, ["plan", "--dir", str(sweep_dir), "probe.kind=sleep", override])
        assert not sweep_dir.exists(), override
    assert not canary.exists(), "an override ran a command"


@pytest.mark.parametrize("flags", [["--margin", "nan"], ["--margin", "-1"], ["--margin", "1e999"], ["--interval", "0"]])
def test_hostile_numbers_in_flags_are_bad_input(capsys, flags: list[str]) -> None:
    command = ["sweep", "--dry-run"] if "--interval" not in flags else ["sweep"]
    code, _, err = _run(capsys, [*command, "probe.kind=sleep", *flags])
    assert code in (Exit.BAD_INPUT, Exit.OK), err


@pytest.fixture(scope="module")
def measured_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real cell (sleep probe) in a folder whose name is itself hostile."""
    base = tmp_path_factory.mktemp("hostile")
    # Relative to the folder the command runs in (a name may not hold a slash, nor be over 255 bytes).
    sweep_dir = base / ("a b " + "".join(_injections(Path("canary"))))
    cwd = os.getcwd()
    os.chdir(base)
    try:
        code = cli.main(["sweep", "--dir", str(sweep_dir), "probe.kind=sleep", "probe.sleep_s=0", "--no-report"])
    finally:
        os.chdir(cwd)
    assert code == 0
    assert not (base / "canary").exists()
    return sweep_dir


def test_a_sweep_folder_with_a_hostile_name_works_through_every_command(measured_sweep: Path, capsys) -> None:
    paths = SweepPaths(measured_sweep)
    (cid,) = paths.cell_ids()
    record = paths.record(cid).read_bytes()
    for argv in (
        ["status", str(measured_sweep)],
        ["status", str(measured_sweep), "--check"],
        ["show", str(measured_sweep), cid],
        ["report", str(measured_sweep), "--no-plots"],
        ["resume", str(measured_sweep)],
        ["sweep", "--dir", str(measured_sweep), "probe.kind=sleep", "probe.sleep_s=0", "--no-report"],
    ):
        code, out, _ = _run(capsys, argv)
        assert code == Exit.OK, (argv, out)
    assert paths.record(cid).read_bytes() == record
    assert not (measured_sweep.parent / "canary").exists()


def _record_of(cid: str, **fields: object) -> bytes:
    return json.dumps({"status": "ok", "cell_id": cid, "attempt": 1, **fields}).encode()


DAMAGE: dict[str, Callable[[SweepPaths, str], None]] = {
    "record not UTF-8": lambda p, c: p.record(c).write_bytes(b'\xff\xfe{"status": "ok"}'),
    "record truncated": lambda p, c: p.record(c).write_bytes(p.record(c).read_bytes()[:40]),
    "record empty": lambda p, c: p.record(c).write_bytes(b""),
    "record a list": lambda p, c: p.record(c).write_bytes(b"[1, 2, 3]"),
    "record with wrong types": lambda p, c: p.record(c).write_bytes(
        _record_of(c, status=5, attempt="x", metrics=[1, 2], environment="nope", config=7, settings=None)
    ),
    "record with huge numbers": lambda p, c: p.record(c).write_bytes(
        _record_of(c, metrics={"step_time_s": 1e308, "tokens_per_s": -1e308, "micro_batch_size": 10**40})
    ),
    "record with NaN and strings": lambda p, c: p.record(c).write_bytes(
        b'{"status": "ok", "cell_id": "%s", "attempt": 1, "metrics": {"step_time_s": NaN, "mfu": "high"}}' % c.encode()
    ),
    "record with a hostile reason": lambda p, c: p.record(c).write_bytes(
        _record_of(c, status="failed", reason="[bold red]$(touch canary)[/] `id`\n\x1b[31m", traceback="T\n" * 99)
    ),
    "attempts not UTF-8": lambda p, c: p.attempts(c).write_bytes(b"\xff\xfe\n"),
    "attempts with wrong types": lambda p, c: p.attempts(c).write_text(
        '{"job_id": null, "attempt": "x"}\n{"job_id": "$(touch canary)", "attempt": 99, "backend": "slurm"}\n'
    ),
    "attempts truncated": lambda p, c: p.attempts(c).write_bytes(p.attempts(c).read_bytes()[:15]),
    "cell config not UTF-8": lambda p, c: p.cell_config(c).write_bytes(b"\xff\xfe: x"),
    "cell config truncated": lambda p, c: p.cell_config(c).write_bytes(p.cell_config(c).read_bytes()[:30]),
    "cell config a list": lambda p, c: p.cell_config(c).write_text("- 1\n- 2\n"),
    "sweep log garbage": lambda p, c: p.sweep_log.write_bytes(b"\x00\xff garbage"),
    "skipped garbage": lambda p, c: p.skipped.write_bytes(b'{"cell_id": 5}\n\xff\n'),
}


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (root / "cells").rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "damage",
    list(DAMAGE),
)
def test_damaged_sweep_folders_give_clear_answers_and_keep_every_record(
    measured_sweep: Path, tmp_path: Path, canary: Path, capsys, monkeypatch, damage: str
) -> None:
    sweep_dir = tmp_path / "damaged"
    shutil.copytree(measured_sweep, sweep_dir)
    paths = SweepPaths(sweep_dir)
    (cid,) = paths.cell_ids()
    DAMAGE[damage](paths, cid)
    before = _files(sweep_dir)
    reruns: list[str] = []
    # Resume's local run is stood in for: what it would rerun is recorded, nothing runs.
    monkeypatch.setattr(local, "submit_local", lambda paths, configs, **kw: reruns.extend(configs) or [])
    for argv in (
        ["status", str(sweep_dir)],
        ["status", str(sweep_dir), "--check", "--state", "ok,corrupt,failed"],
        ["show", str(sweep_dir), cid[:4]],
        ["report", str(sweep_dir), "--no-plots", "--tokens", "20x"],
        ["resume", str(sweep_dir)],
    ):
        _run(capsys, argv)
    after = _files(sweep_dir)
    kept = set(after.values())
    lost = [p for p, data in before.items() if data not in kept]
    assert not lost, f"{damage}: lost or overwrote {lost}"
    assert not canary.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "DIR", "--tokens", "banana"],
        ["report", "DIR", "--tokens", "0"],
        ["report", "DIR", "--tokens=-5x"],
        ["report", "DIR", "--tokens", "1e999"],
        ["report", "DIR", "--out", "DIR/cells/CID/record.json/y"],
        ["show", "DIR", "nope"],
        ["show", "DIR", ""],
        ["status", "DIR", "--state", "ok;rm -rf /"],
        ["resume", "DIR", "--time-factor", "nan"],
        ["resume", "DIR", "--time-limit", "99999999999999999999"],
        ["status", "DIR/cells"],
        ["report", "DIR/sweep.json"],
    ],
)
def test_bad_flags_and_folders_are_refused_cleanly(measured_sweep: Path, tmp_path: Path, capsys, argv) -> None:
    sweep_dir = tmp_path / "copy"
    shutil.copytree(measured_sweep, sweep_dir)
    (sweep_dir / "cells.csv").unlink(missing_ok=True)  # another test may have reported on the measured sweep
    before = _files(sweep_dir)
    (cid,) = SweepPaths(sweep_dir).cell_ids()
    code, _, _ = _run(capsys, [a.replace("DIR", str(sweep_dir)).replace("CID", cid) for a in argv])
    assert code != Exit.OK or argv[-1].startswith("9999"), argv
    assert _files(sweep_dir) == before
    assert not (sweep_dir / "cells.csv").exists(), "a refused report wrote its tables"
