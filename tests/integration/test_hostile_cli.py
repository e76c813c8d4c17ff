"""Every hostile override of tests/unit/test_hostile_input.py in every key, through ``plan`` and through
``sweep --dry-run`` (about a second each: too slow for the unit tier, which takes each injection once)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _corpus():  # the unit tier's corpus and checks, loaded by path (tests/ is not a package)
    import importlib.util

    where = Path(__file__).resolve().parents[1] / "unit" / "test_hostile_input.py"
    spec = importlib.util.spec_from_file_location("hostile_corpus", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_run, hostile_overrides = _corpus()._run, _corpus().hostile_overrides


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "canary"


@pytest.mark.parametrize("command", [["plan"], ["sweep", "--dry-run"]])
def test_every_hostile_override_writes_and_runs_nothing(canary: Path, tmp_path: Path, capsys, command) -> None:
    sweep_dir = tmp_path / "planned"
    for override in hostile_overrides(canary):
        _run(capsys, [*command, "--dir", str(sweep_dir), "probe.kind=sleep", override])
        assert not sweep_dir.exists(), (command, override)
    assert not canary.exists(), "an override ran a command"
