"""plan() keeps Hydra's compositions for the process; nothing a user could change between two plans goes stale."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.planning.plan import CONF_DIR, plan


def _one(overrides: list[str], search_dirs: tuple[Path, ...] = ()) -> dict:
    p = plan(overrides, search_dirs=search_dirs, sweep_dir=None)
    cells = p.cells + p.skipped
    assert len(cells) == 1
    return cells[0].config


def test_an_edited_config_file_is_read_again_even_at_the_same_size(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    mine = tmp_path / "model" / "mine.yaml"
    text = (CONF_DIR / "model" / "pythia-tiny.yaml").read_text().replace("name: pythia-tiny", "name: mine")
    assert "train_steps: 2000" in text
    mine.write_text(text)
    assert _one(["model=mine"], (tmp_path,))["model"]["train_steps"] == 2000
    # Same path, same size, written within the same clock tick: only the bytes differ.
    mine.write_text(text.replace("train_steps: 2000", "train_steps: 3000"))
    assert _one(["model=mine"], (tmp_path,))["model"]["train_steps"] == 3000
    mine.unlink()
    with pytest.raises(Exception, match="mine"):
        _one(["model=mine"], (tmp_path,))


def test_a_config_file_added_to_a_search_folder_is_found(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="late"):
        _one(["model=late"], (tmp_path,))
    (tmp_path / "model").mkdir()
    text = (CONF_DIR / "model" / "pythia-tiny.yaml").read_text().replace("name: pythia-tiny", "name: late")
    (tmp_path / "model" / "late.yaml").write_text(text)
    assert _one(["model=late"], (tmp_path,))["model"]["name"] == "late"


def test_interpolations_are_resolved_afresh_for_every_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDAYS_CACHE_TEST", "first")
    overrides = ["+cluster.env.FROM_ENV=${oc.env:GPUDAYS_CACHE_TEST}"]
    assert _one(overrides)["cluster"]["env"]["FROM_ENV"] == "first"
    monkeypatch.setenv("GPUDAYS_CACHE_TEST", "second")
    assert _one(overrides)["cluster"]["env"]["FROM_ENV"] == "second"


def test_the_sweep_folder_is_resolved_afresh_for_every_plan() -> None:
    # Like ${now:...} in conf/config.yaml, a resolver whose value OmegaConf caches on the config it resolves.
    counter = itertools.count()
    OmegaConf.register_new_resolver("gpudays_cache_test_tick", lambda: str(next(counter)), use_cache=True)
    try:
        overrides = ["hydra.sweep.dir=sweeps/${gpudays_cache_test_tick:}"]
        first = plan(overrides).sweep_dir
        second = plan(overrides).sweep_dir
    finally:
        OmegaConf.clear_resolver("gpudays_cache_test_tick")
    assert first != second
