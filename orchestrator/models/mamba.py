"""Mamba (Gu and Dao 2023, arXiv 2312.00752): a selective state-space language model; parameters, FLOPs, bytes.

Built from the transformers library's ``MambaForCausalLM`` with random weights, the port ``state-spaces`` publishes
its checkpoints for (``state-spaces/mamba-*-hf``). It runs the fused CUDA kernels of ``mamba_ssm`` (selective scan,
causal convolution) when the ``kernels`` hub or ``mamba-ssm`` and ``causal-conv1d`` are installed and the model is
on a GPU, and transformers' reference path in PyTorch otherwise (a loop over the sequence): the record's
``model_implementation`` says which ran (:func:`implementation`).

Every released Mamba has the same block: RMSNorm, an input projection to 2E (E = 2h, ``expand``), a causal
depthwise convolution of width 4 on one half, a projection to the step size (rank R = ⌈h/16⌉) and the input-
dependent B and C (N = 16 states each), the selective scan, a SiLU gate by the other half, the output projection;
embeddings tied to the output. These constants are transformers' ``MambaConfig`` defaults and every released
model's; the model file gives L, h, V and the run.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import orchestrator.models.gpt_neox as gpt_neox
import orchestrator.models.sequences as sequences
from orchestrator.models.building import OTHER_FAMILIES_FIELDS, Builder, unread_fields

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

EXPAND = 2
STATE_SIZE = 16
CONV_KERNEL = 4
NORM_EPS = 1e-5
# Bytes a bf16 training step keeps per token of one layer on the reference path, measured with
# ``saved_tensors_hooks`` (tests/unit/models/test_mamba.py; transformers 5.23, torch 2.13), exact at six shapes:
# 508h + 2R - 52h/s + 132, almost all of it the scan's fp32 discretised A and B·u and the states it multiplies by
# C (E·N = 32h values each, a token), the rest the projections' and the convolution's inputs (the convolution pads
# s + 3 positions and slices s, hence the h/s term). The fused kernels keep far less (they recompute the states in
# the backward); no GPU measured them here, so on a GPU with them this overstates the activations.
REFERENCE_BYTES_PER_HIDDEN = 508.0
REFERENCE_BYTES_PER_RANK = 2.0
REFERENCE_BYTES_PER_HIDDEN_OVER_SEQ = -52.0
REFERENCE_BYTES_PER_ROW = 132.0
CHECKPOINT_BYTES_PER_HIDDEN = 4.0
"""A checkpointed Mamba block keeps its input and the fp32 residual it carries (``residual_in_fp32``)."""


def inner(model: ModelConfig) -> int:
    """E = expand · h."""
    return EXPAND * model.hidden_size


def time_step_rank(model: ModelConfig) -> int:
    """R = ⌈h / 16⌉ (transformers' ``time_step_rank="auto"``, as every released Mamba)."""
    return math.ceil(model.hidden_size / 16)


def layer_parameters(model: ModelConfig) -> int:
    """RMSNorm h; in_proj 2Eh; conv E·4 + E; x_proj E(R + 2N); dt_proj RE + E; A E·N; D E; out_proj Eh."""
    h, e, r, n = model.hidden_size, inner(model), time_step_rank(model), STATE_SIZE
    return h + 2 * e * h + e * CONV_KERNEL + e + e * (r + 2 * n) + r * e + e + e * n + e + e * h


def num_parameters(model: ModelConfig) -> int:
    """L layers, the final RMSNorm h, the embedding V·h (the output shares it)."""
    return model.num_layers * layer_parameters(model) + model.hidden_size + model.vocab_size * model.hidden_size


def conv_forward_flops_per_token(model: ModelConfig) -> float:
    """The causal depthwise convolution, 2·4E a position, over the s + 3 positions transformers computes (it pads
    both ends and keeps the first s), spread over the s tokens."""
    seq = model.seq_length
    return 2.0 * CONV_KERNEL * inner(model) * (seq + CONV_KERNEL - 1) / seq


def layer_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per token counted as for the other families, the products: in_proj 2·2Eh, the
    depthwise convolution (:func:`conv_forward_flops_per_token`), x_proj 2E(R + 2N), dt_proj 2RE, the scan's output
    contraction with C 2EN, out_proj 2Eh. The scan's elementwise discretisation and recurrence (about 7EN) is left
    out, as norms and softmax are for the transformers."""
    h, e, r, n = model.hidden_size, inner(model), time_step_rank(model), STATE_SIZE
    products = 4 * e * h + 2 * e * (r + 2 * n) + 2 * r * e + 2 * e * n + 2 * e * h
    return float(products) + conv_forward_flops_per_token(model)


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs per token: three times every layer's forward and the logits (2hV); checkpointing reruns each
    layer's forward but its output projection (2Eh), whose output only the residual sum takes, so PyTorch's
    non-reentrant checkpoint stops before it (as in ``llama``)."""
    layer = layer_forward_flops_per_token(model)
    logits = 2.0 * model.hidden_size * model.vocab_size
    rerun = layer - 2.0 * inner(model) * model.hidden_size if recompute else 0.0
    return float(model.num_layers * (3.0 * layer + rerun) + 3.0 * logits)


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """Bytes one layer keeps for backward per token on the reference path (see the constants)."""
    h = model.hidden_size
    if checkpointing:
        return CHECKPOINT_BYTES_PER_HIDDEN * h
    return (
        REFERENCE_BYTES_PER_HIDDEN * h
        + REFERENCE_BYTES_PER_RANK * time_step_rank(model)
        + REFERENCE_BYTES_PER_HIDDEN_OVER_SEQ * h / model.seq_length
        + REFERENCE_BYTES_PER_ROW
    )


def logit_bytes_per_token(model: ModelConfig, compiled: bool | str | None = False) -> float:
    """transformers' causal-LM loss, as the decoders' (``gpt_neox``'s measured bytes per vocabulary entry)."""
    return gpt_neox.logit_bytes_per_token(model, compiled)


def largest_weight_elements(model: ModelConfig) -> int:
    """The V×h embedding or the in_proj 2E×h."""
    return max(model.vocab_size * model.hidden_size, 2 * inner(model) * model.hidden_size)


def implementation(module: torch.nn.Module) -> dict[str, str]:
    """Which scan ran: ``fused`` (mamba_ssm's CUDA kernels, through transformers' kernel hub) or ``reference``
    (transformers' PyTorch loop), as transformers decides for the module's device: it uses the kernel where its
    hub found one (``mamba_inner_fn.kernel_function``) and the module is on a GPU."""
    library = next(
        (
            vars(sys.modules[c.__module__])
            for c in type(module).__mro__
            if "mamba_inner_fn" in vars(sys.modules[c.__module__])
        ),
        {},
    )
    kernel = getattr(library.get("mamba_inner_fn"), "kernel_function", None)
    fused = next(module.parameters()).device.type == "cuda" and kernel is not None
    return {"mamba_scan": "fused" if fused else "reference"}


def config_kwargs(model: ModelConfig) -> Container:
    """MambaConfig's arguments: every released model's block constants, tied embeddings, the fp32 residual."""
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "state_size": STATE_SIZE,
        "expand": EXPAND,
        "conv_kernel": CONV_KERNEL,
        "time_step_rank": time_step_rank(model),
        "use_bias": False,
        "use_conv_bias": True,
        "residual_in_fp32": True,
        "layer_norm_epsilon": model.norm_eps if model.norm_eps is not None else NORM_EPS,
        "tie_word_embeddings": True,
        "use_cache": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def refusals(model: ModelConfig) -> dict[str, str]:
    """Fields of attention models Mamba would ignore, by key."""
    problems = unread_fields(model, ("num_kv_heads", "head_dim", *OTHER_FAMILIES_FIELDS))
    if model.num_heads != 1:
        problems["model.num_heads"] = "Mamba has no attention heads; use 1"
    if not model.tie_word_embeddings:
        problems["model.tie_word_embeddings"] = "every released Mamba ties its output to the embedding; use true"
    return problems


BUILDER = Builder("MambaConfig", "MambaForCausalLM", config_kwargs, refusals, has_attention=False)
architecture_errors = BUILDER.architecture_errors
build_model_config = BUILDER.build_model_config
build_model = BUILDER.build_model

PLAN_CAVEAT = (
    "mamba cells: planned memory is that of transformers' reference scan (a CPU's, or a GPU's without mamba_ssm's "
    "fused kernels); where the fused kernels run, the cell needs less"
)
"""Said under ``gpudays plan``'s predictions of a Mamba cell (``orchestrator.cli.display.preview``)."""

FAMILY = sequences.SequenceFamily(
    BUILDER=BUILDER,
    num_parameters=num_parameters,
    flops_per_token=flops_per_token,
    activation_bytes_per_token_per_layer=activation_bytes_per_token_per_layer,
    logit_bytes_per_token=logit_bytes_per_token,
    largest_weight_elements=largest_weight_elements,
    implementation=implementation,
    PLAN_CAVEAT=PLAN_CAVEAT,
)
