"""A probe's rates from its step time: samples/s, tokens/s, TFLOP/s per GPU, MFU and HFU, as the record's metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.engines.memory import recomputes_layers
from orchestrator.models import flops_per_sample, peak_tflops, throughput_unit, tokens_per_sample
from orchestrator.store.record import Metrics

if TYPE_CHECKING:
    from orchestrator.config.schema import Config


def throughput_metrics(cfg: Config, global_batch_size: int, step_time_s: float, base: Metrics | None = None) -> Metrics:
    """Samples/s, tokens/s, TFLOP/s per GPU, MFU and HFU of optimizer steps of ``step_time_s`` (PaLM appendix B),
    as the record's metrics of those names, the others ``base``'s (None without one).

    ``global_batch_size`` is in samples (sequences, images) over all ``cfg.num_gpus`` GPUs. Model FLOPs count
    forward and backward once, and of a mixture of experts only the experts each token is routed to; hardware
    FLOPs add the recomputed forward of activation checkpointing. The tokens figures are None for a family whose
    samples are not tokens; MFU and HFU are None when the GPU has no peak for the precision (gpu=cpu).
    """
    tokens = tokens_per_sample(cfg.model)
    tokens_per_step = global_batch_size * tokens if tokens is not None else None
    model_flops = global_batch_size * flops_per_sample(cfg.model)
    recompute = bool(recomputes_layers(cfg.method.activation_checkpointing, cfg.method.checkpoint_policy))
    hardware_flops = global_batch_size * flops_per_sample(cfg.model, recompute=recompute)
    model_tflops = model_flops / step_time_s / cfg.num_gpus / 1e12
    hardware_tflops = hardware_flops / step_time_s / cfg.num_gpus / 1e12
    peak = peak_tflops(cfg.gpu, cfg.method)
    return replace(
        base if base is not None else Metrics(),
        throughput_unit=throughput_unit(cfg.model),
        samples_per_s=global_batch_size / step_time_s,
        tokens_per_step=tokens_per_step,
        tokens_per_s=tokens_per_step / step_time_s if tokens_per_step is not None else None,
        tokens_per_s_per_gpu=tokens_per_step / step_time_s / cfg.num_gpus if tokens_per_step is not None else None,
        model_flops_per_step=model_flops,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hardware_tflops,
        peak_tflops_per_gpu=peak,
        mfu=model_tflops / peak if peak else None,
        hfu=hardware_tflops / peak if peak else None,
    )
