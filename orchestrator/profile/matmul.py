"""The matrix products of a model's linear layers, as a training step runs them: for a layer ``y = x @ w.T`` over
``tokens`` rows of width ``hidden``, the forward and the backward's two products (``dx = dy @ w``,
``dw = dy.T @ x``), for each width the model's layers map to: ``3·hidden`` (query, key, value), ``hidden`` (the
attention's output), the MLP's ``ffn`` and the ``vocab`` of the output layer."""

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
    """The linear layers of ``model`` over ``tokens`` rows: (tokens x hidden) @ (hidden x {3h, h, ffn, vocab})."""
    h = model.hidden_size
    ffn = model.intermediate_size or 4 * h
    widths = {"qkv": 3 * h, "out": h, "ffn": ffn, "vocab": model.vocab_size}
    return [LinearShape(f"{model.name} {name}", tokens, h, width) for name, width in widths.items()]


def unique(shapes: list[LinearShape]) -> list[LinearShape]:
    """Each product once: two models with the same (tokens, fan_in, fan_out) share its label's first name."""
    seen: dict[tuple[int, int, int], LinearShape] = {}
    for s in shapes:
        seen.setdefault((s.tokens, s.fan_in, s.fan_out), s)
    return list(seen.values())


def measure(
    shapes: list[LinearShape], dtypes: list[str], device: torch.device, min_run_s: float, threads: int
) -> list[MatmulTime]:
    """Every product of every shape in every precision, the slowest rank's median time of each."""
    import torch

    found: list[tuple[LinearShape, str, str, tuple[int, int, int]]] = []
    seconds: list[float] = []
    for dtype in dtypes:
        allow_tf32(dtype)
        kind = torch_dtype(dtype)
        for s in shapes:
            x = torch.randn(s.tokens, s.fan_in, device=device, dtype=kind)
            w = torch.randn(s.fan_out, s.fan_in, device=device, dtype=kind)
            dy = torch.randn(s.tokens, s.fan_out, device=device, dtype=kind)
            runs = {
                "forward": ((s.tokens, s.fan_in, s.fan_out), lambda: torch.matmul(x, w.t())),
                "backward_input": ((s.tokens, s.fan_out, s.fan_in), lambda: torch.matmul(dy, w)),
                "backward_weight": ((s.fan_out, s.tokens, s.fan_in), lambda: torch.matmul(dy.t(), x)),
            }
            for step, (mkn, run) in runs.items():
                found.append((s, dtype, step, mkn))
                seconds.append(median_seconds(run, min_run_s, threads))
            del x, w, dy
    allow_tf32("fp32")
    times = slowest(seconds, device)
    return [
        MatmulTime(s.label, step, m, k, n, dtype, t) for (s, dtype, step, (m, k, n)), t in zip(found, times, strict=True)
    ]
