"""Model families: one module per family holds all of that family's arithmetic and its builder.

A family module (``gpt_neox`` today) owns, for its architecture: the parameter count, training FLOPs per token
(with and without activation recomputation), activation bytes, and the transformers config and module that build
it. The probe, the predictor and the report import these from here; nothing else repeats them. Adding a family is
one module here, one entry in ``FAMILIES`` and its ``conf/model`` files.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from orchestrator.models import gpt_neox, llama, olmo2, qwen3

if TYPE_CHECKING:
    from orchestrator.schema import Config, GpuConfig, MethodConfig, ModelConfig

FAMILIES: dict[str, ModuleType] = {"gpt_neox": gpt_neox, "llama": llama, "qwen3": qwen3, "olmo2": olmo2}
"""``model.family`` in a ``conf/model`` file → the module that implements it."""


def family_module(name: str) -> ModuleType:
    """The module of family ``name``; a ValueError that lists the known families otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


def num_parameters(model: ModelConfig) -> int:
    """Parameters of ``model``, by its family's formula."""
    return int(family_module(model.family).num_parameters(model))


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) per token; ``recompute`` adds what activation checkpointing reruns."""
    return float(family_module(model.family).flops_per_token(model, recompute))


def enable_activation_checkpointing(module: Any) -> None:
    """Recompute each decoder layer in the backward pass (transformers' own checkpointing, non-reentrant).

    ``module`` is a transformers PreTrainedModel.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def peak_tflops(gpu: GpuConfig, method: MethodConfig) -> float | None:
    """The GPU's dense peak for the precision the matrix products run in, or None where it has none.

    bf16 and fp16 use the tensor-core peak of that type; fp32 uses the TF32 tensor peak when TF32 is allowed and
    the GPU has it, else the plain fp32 peak.
    """
    if method.precision == "bf16":
        return gpu.peak_tflops_bf16
    if method.precision == "fp16":
        return gpu.peak_tflops_fp16
    if method.tf32 and gpu.supports_tf32 and gpu.peak_tflops_tf32:
        return gpu.peak_tflops_tf32
    return gpu.peak_tflops_fp32


def throughput_metrics(cfg: Config, global_batch_size: int, step_time_s: float) -> dict[str, Any]:
    """Tokens/s, TFLOP/s per GPU, MFU and HFU of optimizer steps of ``step_time_s`` (PaLM appendix B).

    ``global_batch_size`` is in sequences over all ``cfg.num_gpus`` GPUs. Model FLOPs count forward and backward
    once; hardware FLOPs add the recomputed forward of activation checkpointing. MFU and HFU are None when the
    GPU has no peak for the precision (gpu=cpu).
    """
    tokens_per_step = global_batch_size * cfg.model.seq_length
    model_flops = tokens_per_step * flops_per_token(cfg.model)
    hardware_flops = tokens_per_step * flops_per_token(cfg.model, recompute=cfg.method.activation_checkpointing)
    model_tflops = model_flops / step_time_s / cfg.num_gpus / 1e12
    hardware_tflops = hardware_flops / step_time_s / cfg.num_gpus / 1e12
    peak = peak_tflops(cfg.gpu, cfg.method)
    return {
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / step_time_s,
        "tokens_per_s_per_gpu": tokens_per_step / step_time_s / cfg.num_gpus,
        "model_flops_per_step": model_flops,
        "model_tflops_per_gpu": model_tflops,
        "hardware_tflops_per_gpu": hardware_tflops,
        "peak_tflops_per_gpu": peak,
        "mfu": model_tflops / peak if peak else None,
        "hfu": hardware_tflops / peak if peak else None,
    }
