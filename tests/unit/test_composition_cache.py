"""A plan composes afresh, each distinct composition once; where plans keep Hydra's compositions (the tests' session,
``tests/conftest.py``), nothing a user could change between two plans goes stale."""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from orchestrator.planning import compose_cache
from orchestrator.planning import plan as plan_mod
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


def _hydra_compositions(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, ...]]:
    """Every composition Hydra itself makes from here on, by its overrides."""
    made: Counter[tuple[str, ...]] = Counter()
    real = plan_mod.compose

    def counted(config_name: str, overrides: Sequence[str], return_hydra_config: bool) -> DictConfig:
        made[tuple(overrides)] += 1
        return real(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)

    monkeypatch.setattr(plan_mod, "compose", counted)
    return made


def test_a_plan_composes_afresh_and_what_it_composes_twice_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a gpudays command does: one plan, nothing kept from an earlier one in the process.
    monkeypatch.setattr(compose_cache, "KEPT_BETWEEN_PLANS", False)
    made = _hydra_compositions(monkeypatch)
    overrides = ["model=pythia-70m,pythia-160m", "gpu=a100-80gb", "num_gpus=1,2"]
    first = plan(overrides, sweep_dir=None)
    # The hydra node (the first model) is the first cell's composition too: two compositions for two models.
    assert sum(made.values()) == len(made) == 2
    second = plan(overrides, sweep_dir=None)
    assert sum(made.values()) == 4, "a second plan reads the config files again"
    assert [c.config for c in first.cells] == [c.config for c in second.cells]


def test_kept_compositions_are_shared_between_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose_cache, "KEPT_BETWEEN_PLANS", True)
    made = _hydra_compositions(monkeypatch)
    overrides = ["model=pythia-70m", "gpu=a100-80gb", "num_gpus=1,2", "+cluster.env.KEPT=kept-test"]
    plan(overrides, sweep_dir=None)
    plan(overrides, sweep_dir=None)
    assert sum(made.values()) <= 1, "the second plan composes nothing again"


def test_a_swept_value_is_checked_on_a_copy_of_its_section_not_of_the_whole_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each distinct value of a swept key was checked on a deep copy of the whole config: most of planning's time.
    copied: list[object] = []
    real = plan_mod.copy.deepcopy

    def deepcopy(obj: object, *args: object, **kwargs: object) -> object:
        if sys._getframe(1).f_globals.get("__name__") == plan_mod.__name__:  # planning's own copies
            copied.append(obj)
        return real(obj, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_mod.copy, "deepcopy", deepcopy)
    cells = plan(["model=pythia-tiny", "gpu=cpu", "probe.kind=sleep", "model.seq_length=range(64,74)"]).cells
    assert len(cells) == 10
    whole = [
        c
        for c in copied
        if isinstance(c, DictConfig) and not c._is_none() and {"model", "cluster"} <= set(c) and "hydra" not in c
    ]
    assert not whole and len(copied) >= 10
    with pytest.raises(plan_mod.SweepError, match="unknown key 'model.nonexistent'"):
        plan(["model=pythia-tiny", "gpu=cpu", "model.nonexistent=3"])
