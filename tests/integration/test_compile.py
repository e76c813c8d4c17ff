"""Regional compilation on the CPU: one block's compiled code serves every block, whatever the depth, and the loss
is a region of its own; the compiled model computes what the eager one does."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from orchestrator.config.schema import ModelConfig
from orchestrator.engines.compiling import compile_regions, compiled_regions
from orchestrator.models import FAMILIES

TINY = ModelConfig(
    name="tiny", family="gpt_neox", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32
)  # fmt: skip


def graphs_and_loss(model: ModelConfig, compiled: bool) -> tuple[int, list[float]]:
    """Graphs Dynamo compiled for two training steps' forward and backward (0 uncompiled) and the two losses."""
    torch._dynamo.reset()
    counters.clear()
    family = FAMILIES[model.family]
    torch.manual_seed(0)
    module = family.build_model(model, "sdpa", torch.float32, torch.device("cpu"))
    module.train()
    if compiled:
        compile_regions(module, family.blocks(module))
        assert compiled_regions(module)
    batch = family.synthetic_batch(model, 2, torch.Generator().manual_seed(1), torch.float32)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        loss = module(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return int(counters["stats"]["unique_graphs"]), losses


def test_one_block_is_compiled_for_every_layer_and_the_loss_is_its_own_region() -> None:
    graphs_2, losses_2 = graphs_and_loss(TINY, compiled=True)
    deep = dataclasses.replace(TINY, num_layers=6)
    graphs_6, losses_6 = graphs_and_loss(deep, compiled=True)
    # Two regions (a block, the loss): six layers compile no more graphs than two.
    assert graphs_2 == graphs_6 == 2, (graphs_2, graphs_6)
    _, eager_6 = graphs_and_loss(deep, compiled=False)
    assert losses_6 == pytest.approx(eager_6, rel=1e-4), "compiled and eager steps compute the same losses"
    assert losses_2 != pytest.approx(losses_6, rel=1e-4), "the two depths are different models"
