"""A sweep folder anyone on the machine may write is refused before anything runs: its jobs load its pickles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.cli.errors import Exit, outcome_of
from orchestrator.store.paths import LooseSweepFolder, SweepPaths
from orchestrator.submission import launch, local


def test_a_world_writable_folder_is_refused_with_the_chmod_that_fixes_it(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(LooseSweepFolder) as caught:
        SweepPaths(root).check_not_loose()
    code, line = outcome_of(caught.value)
    assert code == Exit.BAD_INPUT and int(code) == 2
    assert str(root) in line and f"chmod o-w {root}" in line


def test_its_jobs_folder_counts_too(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    paths.jobs_dir.mkdir()
    os.chmod(paths.jobs_dir, 0o777)
    with pytest.raises(LooseSweepFolder, match="jobs"):
        paths.check_not_loose()


@pytest.mark.parametrize("mode", [0o755, 0o775, 0o1777])
def test_group_writable_or_sticky_folders_are_fine(tmp_path: Path, mode: int) -> None:
    os.chmod(tmp_path, mode)
    SweepPaths(tmp_path).check_not_loose()


@pytest.mark.parametrize("submit", [launch.submit_slurm, local.submit_local])
def test_submission_refuses_before_writing_anything(tmp_path: Path, submit: object) -> None:
    os.chmod(tmp_path, 0o777)
    with pytest.raises(LooseSweepFolder):
        submit(SweepPaths(tmp_path), {})  # type: ignore[operator]
    assert list(tmp_path.iterdir()) == []
