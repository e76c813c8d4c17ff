"""A cell's identity covers the architecture fields of every family without moving any Pythia cell's id."""

from __future__ import annotations

from orchestrator.cells.cell import cell_id, identity
from orchestrator.config.schema import Config, to_config
from orchestrator.planning.plan import plan


def cell(*overrides: str) -> Config:
    p = plan(list(overrides), sweep_dir=None)
    cells = p.cells + p.skipped
    assert len(cells) == 1
    return to_config(cells[0].config)


def test_a_pythia_cell_keeps_its_id() -> None:
    # The id of the cell pythia-160m on 8 h100-80gb with the default method, computed before the architecture
    # fields of the other families existed. Records on disk are matched by this id: it must never move.
    assert cell_id(cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8")) == "3702d9be51bd"
    assert cell_id(cell("model=pythia-tiny")) == "e0caa2381a3b"  # pythia-tiny on the cpu "gpu", same rule


def test_pythia_identity_has_no_architecture_keys_at_their_defaults() -> None:
    ident = identity(cell("model=pythia-1b"))
    assert not {"model.family", "model.num_kv_heads", "model.tie_word_embeddings"} & set(ident)


def test_other_families_carry_what_sets_them_apart() -> None:
    ident = identity(cell("model=llama-3.2-1b"))
    assert ident["model.family"] == "llama" and ident["model.num_kv_heads"] == 8
    assert ident["model.tie_word_embeddings"] is True and ident["model.rope_theta"] == 500_000.0


def test_an_architecture_field_changes_the_id() -> None:
    base = cell_id(cell("model=smollm2-135m"))
    assert cell_id(cell("model=smollm2-135m", "model.num_kv_heads=9", "model.num_parameters=null")) != base
    assert cell_id(cell("model=smollm2-135m", "model.tie_word_embeddings=false", "model.num_parameters=null")) != base
    assert cell_id(cell("model=smollm2-135m")) == base
