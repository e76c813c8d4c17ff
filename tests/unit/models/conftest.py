"""Measurements of a real transformers module that the family tests compare their formulas with."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.config.schema import ModelConfig, to_config
from orchestrator.planning.plan import plan


@cache
def _shipped_model(name: str) -> ModelConfig:
    """The ModelConfig of ``conf/model/<name>.yaml``, composed as a user's command composes it."""
    p = plan([f"model={name}"], sweep_dir=None)
    return to_config((p.cells + p.skipped)[0].config).model


def _training_flops(module: torch.nn.Module, vocab_size: int, batch: int, seq: int) -> int:
    """FLOPs that ``torch.utils.flop_counter`` counts in one forward and backward of ``module`` on random tokens."""
    module.train()
    tokens = torch.randint(0, vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        module(input_ids=tokens, labels=tokens).loss.backward()
    return int(counter.get_total_flops())


def _saved_bytes_per_token(module: torch.nn.Module, layer: torch.nn.Module, vocab_size: int, seq: int) -> float:
    """Bytes per token that ``layer`` hands autograd to keep for backward, parameters excluded.

    Measured at two batch sizes and differenced, so that what does not grow with the batch (the rotary cos/sin
    tables, shared by every sequence and layer) drops out. Tensors are told apart by their storage, as autograd
    keeps one storage once however many views of it it saves.
    """
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}
    inside = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    hooks = [
        layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
        layer.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    totals = []
    module.train()
    try:
        for batch in (2, 4):
            seen.clear()
            tokens = torch.randint(0, vocab_size, (batch, seq))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                module(input_ids=tokens, labels=tokens)
            totals.append(sum(seen.values()))
    finally:
        for hook in hooks:
            hook.remove()
    return (totals[1] - totals[0]) / (2 * seq)


@pytest.fixture
def shipped_model() -> Callable[[str], ModelConfig]:
    """``shipped_model(name)``: the ModelConfig of ``conf/model/<name>.yaml``, composed once per session."""
    return _shipped_model


@pytest.fixture
def training_flops() -> Callable[[torch.nn.Module, int, int, int], int]:
    """``training_flops(module, vocab_size, batch, seq)``: FlopCounterMode's count of one training step."""
    return _training_flops


@pytest.fixture
def saved_bytes_per_token() -> Callable[[torch.nn.Module, torch.nn.Module, int, int], float]:
    """``saved_bytes_per_token(module, layer, vocab_size, seq)``: what ``layer`` keeps for backward, per token."""
    return _saved_bytes_per_token
