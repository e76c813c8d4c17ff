"""The matrix products of a model's linear layers, as a training step runs them: for a layer ``y = x @ w.T`` over
``tokens`` rows of width ``hidden``, the forward and the backward's two products (``dx = dy @ w``,
``dw = dy.T @ x``), for each width the model's layers map to: ``3·hidden`` (query, key, value), ``hidden`` (the
attention's output), the MLP's ``ffn`` and the ``vocab`` of the output layer, and the separate query and
key/value widths of a model whose heads do not span the hidden size or that groups its key/value heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.profile.record import MatmulTime
from orchestrator.profile.timing import allow_tf32, median_seconds, slowest, torch_dtype

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import ModelConfig


@dataclass(frozen=True)
class LinearShape:
    """One linear layer of a model: ``tokens`` rows of ``fan_in`` in, ``fan_out`` out."""

    label: str
    tokens: int
    fan_in: int
    fan_out: int


def shapes_of(model: ModelConfig, tokens: int) -> list[LinearShape]:
    """The linear layers of ``model`` over ``tokens`` rows: (tokens x hidden) @ (hidden x width) for a fused
    query-key-value (3h), the attention's output (h), the MLP's ``ffn`` and the output layer's ``vocab``; and, where
    the heads do not span the hidden size or the key/value heads are fewer (grouped-query attention), the separate
    query and key/value projections the llama-like families run (their down projection, ffn x h, is the MLP's
    product transposed, which the predictor reads as the same shape). A mixture of experts adds its experts' MLP
    product over the rows routed to one expert (``tokens`` × k / E), the rows the predictor reads it at."""
    h = model.hidden_size
    ffn = model.intermediate_size or 4 * h
    d = model.head_dim or h // max(model.num_heads, 1)
    q, kv = model.num_heads * d, (model.num_kv_heads or model.num_heads) * d
    widths = {"qkv": 3 * h, "out": h, "ffn": ffn, "vocab": model.vocab_size}
    if q != h:
        widths["q"] = q
    if kv not in (h, q):
        widths["kv"] = kv
    shapes = [LinearShape(f"{model.name} {name}", tokens, h, width) for name, width in widths.items()]
    if model.num_experts and model.num_experts_per_token:
        routed = max(1, tokens * model.num_experts_per_token // model.num_experts)
        shapes.append(LinearShape(f"{model.name} expert", routed, h, ffn))
    return shapes


def unique(shapes: list[LinearShape]) -> list[LinearShape]:
    """Each product once: two models with the same (tokens, fan_in, fan_out) share its label's first name."""
    seen: dict[tuple[int, int, int], LinearShape] = {}
    for s in shapes:
        seen.setdefault((s.tokens, s.fan_in, s.fan_out), s)
    return list(seen.values())


def _three(s: LinearShape, kind: torch.dtype, device: torch.device, min_run_s: float, threads: int) -> list[float]:
    """The median seconds of the forward and the backward's two products of one layer."""
    import torch

    x = torch.randn(s.tokens, s.fan_in, device=device, dtype=kind)
    w = torch.randn(s.fan_out, s.fan_in, device=device, dtype=kind)
    dy = torch.randn(s.tokens, s.fan_out, device=device, dtype=kind)
    on_gpu = device.type != "cpu"
    return [
        median_seconds(lambda: torch.matmul(x, w.t()), min_run_s, threads, on_gpu),
        median_seconds(lambda: torch.matmul(dy, w), min_run_s, threads, on_gpu),
        median_seconds(lambda: torch.matmul(dy.t(), x), min_run_s, threads, on_gpu),
    ]


def measure(
    shapes: list[LinearShape], dtypes: list[str], device: torch.device, min_run_s: float, threads: int
) -> list[MatmulTime]:
    """Every product of every shape in every precision, the slowest rank's median time of each."""
    found: list[tuple[str, str, str, tuple[int, int, int]]] = []
    seconds: list[float] = []
    for dtype in dtypes:
        allow_tf32(dtype)
        for s in shapes:
            seconds += _three(s, torch_dtype(dtype), device, min_run_s, threads)
            found += [
                (s.label, dtype, "forward", (s.tokens, s.fan_in, s.fan_out)),
                (s.label, dtype, "backward_input", (s.tokens, s.fan_out, s.fan_in)),
                (s.label, dtype, "backward_weight", (s.fan_out, s.tokens, s.fan_in)),
            ]
    allow_tf32("fp32")
    times = slowest(seconds, device)
    return [
        MatmulTime(label, step, m, k, n, dtype, t)
        for (label, dtype, step, (m, k, n)), t in zip(found, times, strict=True)
    ]
