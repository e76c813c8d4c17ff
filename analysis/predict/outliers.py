"""Figures of a profile that cannot be the operation's time: a one-off cost timed in its place.

A larger operation of the same kind, in the same precision, cannot run many times faster than a smaller one. A
figure that took :data:`IMPOSSIBLE` times longer than one with at least as many FLOPs is taken as a one-off cost
(a kernel loaded lazily, a library's first plan) and not as the operation: ``gpudays profile`` says so beside
the figure, and the predictor leaves it out (the FLOPs it covered go to the fallback rate,
:mod:`analysis.predict.measured_compute`). On an H200 a first attention backward of pythia-160m's shape that
took over 2 s read 3.6 GFLOP/s, where the larger shapes beside it ran at 138-184 TFLOP/s; predicted with it,
pythia-160m's step was 44,371 s against the 6.49 s measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from analysis.predict.network import AttentionFigure, MatmulFigure

IMPOSSIBLE = 20.0
"""How many times longer than a larger operation of its kind a figure may take before it is a one-off cost. Real
figures stay well under it: in the committed profiles a smaller operation took at most 5.3 times as long as a
larger one (bf16 products on this CPU) and 1.8 times on the H200; the lazily loaded attention backward above took
28,958 times as long as the larger shape beside it."""


T = TypeVar("T")


def _one_off(figures: Sequence[T], work: Callable[[T], float], seconds: Callable[[T], float],
             dtype: Callable[[T], str]) -> dict[int, str]:  # fmt: skip
    """By index, each figure that took :data:`IMPOSSIBLE` times longer than one of at least its work in its
    precision, with the reason in words."""
    out = {}
    for i, f in enumerate(figures):
        larger = [g for g in figures if dtype(g) == dtype(f) and work(g) >= work(f) and g is not f]
        fastest = min((seconds(g) for g in larger), default=float("inf"))
        if seconds(f) > IMPOSSIBLE * fastest:
            out[i] = (f"took {seconds(f) / fastest:.0f} times as long as a larger one of its kind: a one-off cost "
                      "timed in its place, not used")  # fmt: skip
    return out


def slow_products(products: Sequence[MatmulFigure]) -> dict[int, str]:
    """The matrix products that cannot be their operation's time (:func:`_one_off` by FLOPs)."""
    return _one_off(products, lambda p: 2.0 * p.m * p.k * p.n, lambda p: p.seconds, lambda p: p.dtype)


def slow_attention(attention: Sequence[AttentionFigure]) -> dict[int, str]:
    """The attention figures whose forward or backward cannot be the operation's time, compared with the other
    shapes' forwards and backwards respectively (their FLOPs grow with batch × heads × sequence² × head width)."""

    def work(a: AttentionFigure) -> float:
        return float(a.batch * a.heads * a.seq_len**2 * a.head_dim)

    forward = _one_off(attention, work, lambda a: a.forward_s, lambda a: a.dtype)
    backward = _one_off(attention, work, lambda a: a.backward_s, lambda a: a.dtype)
    return {i: f"{'forward' if i in forward else 'backward'} {(forward | backward)[i]}" for i in forward | backward}


__all__ = ("IMPOSSIBLE", "slow_attention", "slow_products")
