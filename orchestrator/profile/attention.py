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


def _both(s: AttentionShape, dtype: str, device: torch.device, min_run_s: float, threads: int) -> list[float]:
    """The median seconds of the forward and the backward of one shape."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    size = (s.batch, s.heads, s.seq_len, s.head_dim)
    q, k, v = (torch.randn(size, device=device, dtype=torch_dtype(dtype), requires_grad=True) for _ in "qkv")
    out = sdpa(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    on_gpu = device.type != "cpu"

    def backward() -> None:
        out.backward(grad, retain_graph=True)  # type: ignore[no-untyped-call]

    return [
        median_seconds(lambda: sdpa(q, k, v, is_causal=True), min_run_s, threads, on_gpu),
        median_seconds(backward, min_run_s, threads, on_gpu),
    ]


def measure(
    shapes: list[AttentionShape], dtypes: list[str], device: torch.device, min_run_s: float, threads: int
) -> list[AttentionTime]:
    """Forward and backward of every shape in every precision, the slowest rank's median time of each."""
    found = [(s, dtype) for dtype in dtypes for s in dict.fromkeys(shapes)]
    seconds: list[float] = []
    for s, dtype in found:
        allow_tf32(dtype)
        seconds += _both(s, dtype, device, min_run_s, threads)
    allow_tf32("fp32")
    times = slowest(seconds, device)
    return [
        AttentionTime(s.seq_len, s.heads, s.head_dim, s.batch, dtype, times[2 * i], times[2 * i + 1])
        for i, (s, dtype) in enumerate(found)
    ]
