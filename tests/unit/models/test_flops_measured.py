"""FLOPs per token against what torch counts on the real transformers module in a training step.

``torch.utils.flop_counter.FlopCounterMode`` counts every matrix product the forward and backward run, including
the forwards that activation checkpointing reruns (transformers checkpoints each layer with torch's non-reentrant
checkpoint). Eager attention runs its products as ``bmm``, which the counter sees; PyTorch's CPU kernel for SDPA
has no FLOP formula registered, so on the CPU SDPA's products are missing from the count (on CUDA the flash,
efficient and cuDNN kernels are counted), which the SDPA case below shows term for term.
"""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.schema import ModelConfig
from orchestrator.models import enable_activation_checkpointing, gpt_neox

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
flop_counter = pytest.importorskip("torch.utils.flop_counter")

SMALL = ModelConfig(name="small", num_layers=2, hidden_size=64, num_heads=4, vocab_size=512, seq_length=128)
BATCH = 2


def counted_flops_per_token(model: ModelConfig, attention: str, checkpointing: bool) -> float:
    """FLOPs FlopCounterMode counts in one forward and backward of a training step, per token."""
    torch.manual_seed(0)
    module = gpt_neox.build_model(model, attention, torch.float32, torch.device("cpu"))
    module.train()
    if checkpointing:
        enable_activation_checkpointing(module)
    ids = torch.randint(0, model.vocab_size, (BATCH, model.seq_length))
    counter = flop_counter.FlopCounterMode(display=False)
    with counter:
        module(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / (BATCH * model.seq_length)


@pytest.mark.parametrize("width", [None, 96])
def test_training_flops_match_the_count_exactly(width: int | None) -> None:
    model = dataclasses.replace(SMALL, intermediate_size=width)
    assert counted_flops_per_token(model, "eager", False) == gpt_neox.flops_per_token(model)


def test_checkpointing_recomputes_each_layer_but_its_last_product() -> None:
    # Measured: +196,608 FLOPs a token for SMALL, 75% of one more forward of the layers (262,144), not 100%:
    # non-reentrant checkpointing stops rebuilding once the backward has every saved tensor, so the MLP's
    # output projection (2hf a token and layer) is never rerun; the logits are outside the checkpoints.
    counted = counted_flops_per_token(SMALL, "eager", True)
    assert counted == gpt_neox.flops_per_token(SMALL, recompute=True)
    whole_forward = SMALL.num_layers * gpt_neox.layer_forward_flops_per_token(SMALL)
    assert counted - gpt_neox.flops_per_token(SMALL) == pytest.approx(0.75 * whole_forward)
    # The blanket 4/3 of every FLOP would overcount by 9% here, and by 9% for pythia-1.4b too.
    assert 4 / 3 * gpt_neox.flops_per_token(SMALL) > 1.08 * counted


def test_sdpa_on_the_cpu_is_counted_without_its_attention_products() -> None:
    attention = 3 * SMALL.num_layers * 4 * SMALL.seq_length * SMALL.hidden_size  # 4sh a token, forward x3
    assert counted_flops_per_token(SMALL, "sdpa", False) == gpt_neox.flops_per_token(SMALL) - attention
