"""Attention as the models run it: ``torch.nn.functional.scaled_dot_product_attention``, causal, over a sweep's
sequence lengths and head shapes, forward and backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.profile.record import AttentionTime
from orchestrator.profile.timing import allow_tf32, median_seconds, slowest, torch_dtype

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import ModelConfig


@dataclass(frozen=True)
class AttentionShape:
    seq_len: int
    heads: int
    head_dim: int
    batch: int = 1


def shape_of(model: ModelConfig, seq_len: int) -> AttentionShape:
    """The attention of ``model`` over sequences of ``seq_len`` (query heads; key/value heads taken as many)."""
    return AttentionShape(seq_len, model.num_heads, model.head_dim or model.hidden_size // model.num_heads)


def measure(
    shapes: list[AttentionShape], dtypes: list[str], device: torch.device, min_run_s: float, threads: int
) -> list[AttentionTime]:
    """Forward and backward of every shape in every precision, the slowest rank's median time of each."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    found: list[tuple[AttentionShape, str]] = []
    seconds: list[float] = []
    for dtype in dtypes:
        allow_tf32(dtype)
        for s in dict.fromkeys(shapes):
            size = (s.batch, s.heads, s.seq_len, s.head_dim)
            q, k, v = (torch.randn(size, device=device, dtype=torch_dtype(dtype), requires_grad=True) for _ in "qkv")
            out = sdpa(q, k, v, is_causal=True)
            grad = torch.randn_like(out)
            forward = median_seconds(lambda: sdpa(q, k, v, is_causal=True), min_run_s, threads)
            backward = median_seconds(lambda: out.backward(grad, retain_graph=True), min_run_s, threads)
            found.append((s, dtype))
            seconds += [forward, backward]
            del q, k, v, out, grad
    allow_tf32("fp32")
    times = slowest(seconds, device)
    return [
        AttentionTime(s.seq_len, s.heads, s.head_dim, s.batch, dtype, times[2 * i], times[2 * i + 1])
        for i, (s, dtype) in enumerate(found)
    ]
