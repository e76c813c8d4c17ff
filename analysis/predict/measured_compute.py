"""The compute term from a machine's measured rates: each of a model's matrix products at the rate a profile
(``gpudays profile``) timed for its shape and precision, attention at the profiled SDPA's time.

Without a profile the step-time model (:mod:`analysis.predict.step_time`) charges a step's hardware FLOPs at the
dense peak times :data:`~analysis.predict.step_time.DEFAULT_EFFICIENCY`. Where a cell's GPU has a profile (its
measured one, or the reference machine's carried to it, :mod:`analysis.predict.reference_profile`), a sample's
compute is instead the sum of

- each linear layer's three products (the forward, the input's and the weight's gradients; per layer × layers,
  and the logits' once) over its FLOPs / the profiled rate of that shape. A product is found in the profile by its
  two fixed dimensions (the layer's ``fan_in`` and ``fan_out``, a product and its transpose alike, since
  ``C.T = B.T @ A.T`` costs the same); its token dimension (a micro-step's tokens on one rank) is interpolated
  linearly in log(tokens) between the token counts measured, and beyond them the nearest one's rate holds; a
  product wider than every one measured (its smaller fixed dimension above theirs) takes the median rate of the
  widest ones measured, as a product's share of the peak grows with its size and levels off (a
  tensor-parallel rank's slice of a layer is looked up as the whole layer, which is what a profile times);
- attention: the profiled forward and backward seconds of the model's (sequence, heads, head width) per sequence;
- what activation checkpointing reruns: the family's own recomputed FLOPs
  (``flops_per_sample(model, True) - flops_per_sample(model, False)``) at the rate the profile gives the layer's
  forward (its products and attention together);
- everything else the family counts (a product or an attention the profile lacks, or a family whose layers are
  not listed here, e.g. mixtures of experts) at the fallback rate: the dense peak × the default efficiency, scaled
  by the family's ``COMPUTE_EFFICIENCY`` as without a profile; on a device without a published peak (the CPU), the
  median of the profile's rates in the cell's precision, so that every cell of that device stays on one scale.

The term stays in the units calibration expects, "seconds at the reference rate": the profiled seconds times the
default efficiency, so that the uncalibrated coefficient (1 / efficiency) gives back the profiled seconds. A cell
whose precision the profile did not measure at all keeps the peak's term.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from analysis.predict.network import MeasuredProfile
from analysis.predict.outliers import slow_attention, slow_products
from orchestrator.config.schema import ModelConfig
from orchestrator.engines.memory import GATED_FAMILIES
from orchestrator.models import family_module

INNER = "backward_weight"
"""The product whose token dimension is the inner one (``dy.T @ x``); the other two have it outer."""

Key = tuple[str, int, int]
"""A product's shape without its tokens: (``outer``, k, other outer dimension) or (``inner``, smaller, larger)."""


@dataclass(frozen=True)
class Layer:
    """One linear layer: ``fan_in`` to ``fan_out``, ``count`` of them in the model."""

    fan_in: int
    fan_out: int
    count: int
    in_layers: bool = True
    """A product of the decoder layers (rerun by checkpointing), not the logits."""
    token_share: float = 1.0
    """The share of a micro-step's tokens one product runs on: an expert's, k of E (each token's k experts)."""


def linear_layers(model: ModelConfig) -> list[Layer] | None:
    """The linear layers of ``model`` as its modules run them (the logits included); None for a family whose
    layers are not listed here (its compute stays at the fallback rate)."""
    h, layers, vocab = model.hidden_size, model.num_layers, model.vocab_size
    logits = Layer(h, vocab, 1, in_layers=False)
    if model.family == "gpt_neox":
        f = model.intermediate_size or 4 * h
        return [Layer(h, 3 * h, layers), Layer(h, h, layers), Layer(h, f, layers), Layer(f, h, layers), logits]
    if model.intermediate_size is None or not (model.family in GATED_FAMILIES or model.num_experts):
        return None
    d = model.head_dim or h // model.num_heads
    q, kv, f = model.num_heads * d, (model.num_kv_heads or model.num_heads) * d, model.intermediate_size
    attention = [Layer(h, q, layers), Layer(h, kv, 2 * layers), Layer(q, h, layers)]
    if not model.num_experts:
        return [*attention, Layer(h, f, 2 * layers), Layer(f, h, layers), logits]
    # A mixture of experts: the router over every token, and each token's k experts, each expert's products over
    # the k/E of the tokens routed to it (the FLOPs of k whole SwiGLU MLPs a token, as the family counts them).
    e, k = model.num_experts, model.num_experts_per_token or 1
    share = k / e
    return [*attention, Layer(h, e, layers), Layer(h, f, 2 * layers * k, token_share=share),
            Layer(f, h, layers * k, token_share=share), logits]  # fmt: skip


def attention_forward_flops_per_token(model: ModelConfig) -> float:
    """One layer's attention forward per token as the decoder families count it: QKᵀ and the weighted sum of V over
    the whole s×s square, ``4·s·a·d``."""
    return 4.0 * model.seq_length * model.num_heads * (model.head_dim or model.hidden_size // model.num_heads)


class ProductRates:
    """A profile's products by shape and precision, as seconds per FLOP at the token counts measured."""

    def __init__(self, profile: MeasuredProfile) -> None:
        # A figure that cannot be its operation's time (a one-off cost timed in its place) is left out: its FLOPs
        # go to the fallback rate (analysis.predict.outliers).
        left_out = slow_products(profile.matmuls)
        matmuls = [t for i, t in enumerate(profile.matmuls) if i not in left_out]
        left_out = slow_attention(profile.attention)
        attention = [a for i, a in enumerate(profile.attention) if i not in left_out]
        found: dict[tuple[Key, str], dict[int, float]] = {}
        for t in matmuls:
            tokens, key = (t.k, _inner(t.m, t.n)) if t.step == INNER else (t.m, ("outer", t.k, t.n))
            found.setdefault((key, t.dtype), {})[tokens] = t.seconds / (2.0 * t.m * t.k * t.n)
        self.products = {k: (np.log(sorted(v)), np.array([v[t] for t in sorted(v)])) for k, v in found.items()}
        self.attention = {
            (a.seq_len, a.heads, a.head_dim, a.dtype): (a.forward_s / a.batch, a.backward_s / a.batch)
            for a in attention
        }
        by_dtype: dict[str, list[float]] = {}
        for t in matmuls:
            by_dtype.setdefault(t.dtype, []).append(2.0 * t.m * t.k * t.n / t.seconds)
        self.median_flops_s = {dtype: float(np.median(rates)) for dtype, rates in by_dtype.items()}
        # The products of the largest shape measured, in each precision: where a larger one is looked up.
        self.largest: dict[str, tuple[int, float]] = {}
        for dtype in by_dtype:
            sizes = {k: min(k[1], k[2]) for k, d in found if d == dtype}
            widest = max(sizes.values())
            per_flop = [self.products[(k, dtype)][1] for k, size in sizes.items() if size == widest]
            self.largest[dtype] = (widest, float(np.median(np.concatenate(per_flop))))

    def seconds_per_flop(self, key: Key, dtype: str, tokens: float) -> float | None:
        """The product's seconds per FLOP at ``tokens`` rows (see the module's docstring); None where unmeasured."""
        found = self.products.get((key, dtype))
        if found is None:
            widest, rate = self.largest.get(dtype, (0, math.nan))
            return rate if widest and min(key[1], key[2]) > widest else None
        log_tokens, per_flop = found
        return float(np.interp(math.log(max(tokens, 1.0)), log_tokens, per_flop))


def product_rates(profile: MeasuredProfile) -> ProductRates:
    """:class:`ProductRates` of ``profile``, read once per profile (a profile is immutable: a frozen record); a
    profile that cannot be hashed is read every time."""
    try:
        return _product_rates(profile)
    except TypeError:  # unhashable
        return ProductRates(profile)


@lru_cache(maxsize=64)
def _product_rates(profile: MeasuredProfile) -> ProductRates:
    return ProductRates(profile)


def _inner(m: int, n: int) -> Key:
    return ("inner", min(m, n), max(m, n))


def _keys(layer: Layer) -> tuple[Key, Key, Key]:
    """The forward (tokens x in) @ (in x out), the input's gradient (tokens x out) @ (out x in) and the weight's
    (out x tokens) @ (tokens x in)."""
    a, b = layer.fan_in, layer.fan_out
    return ("outer", a, b), ("outer", b, a), _inner(a, b)


@dataclass(frozen=True)
class SampleSeconds:
    """One sample's compute at the profiled rates and the FLOPs left for the fallback rate."""

    seconds: float
    fallback_flops: float


def sample_seconds(
    model: ModelConfig, dtype: str, tokens: float, recompute: bool, rates: ProductRates
) -> SampleSeconds | None:
    """One sample (a sequence) of ``model`` on ``tokens`` rows a micro-step: see the module's docstring; None where
    the profile measured nothing in ``dtype`` (the peak's term stays)."""
    if dtype not in rates.median_flops_s:
        return None
    family = family_module(model.family)
    per_token = model.seq_length
    total = float(family.flops_per_sample(model, recompute))
    rerun = total - float(family.flops_per_sample(model, False)) if recompute else 0.0
    layers = linear_layers(model)
    if layers is None:
        return SampleSeconds(0.0, total)
    seconds = covered = forward_s = forward_flops = 0.0
    for layer in layers:
        flops = 2.0 * layer.fan_in * layer.fan_out * per_token * layer.count
        for i, key in enumerate(_keys(layer)):
            per_flop = rates.seconds_per_flop(key, dtype, tokens * layer.token_share)
            if per_flop is None:
                continue
            seconds, covered = seconds + flops * per_flop, covered + flops
            if i == 0 and layer.in_layers:
                forward_s, forward_flops = forward_s + flops * per_flop, forward_flops + flops
    head_dim = model.head_dim or model.hidden_size // model.num_heads
    measured = rates.attention.get((model.seq_length, model.num_heads, head_dim, dtype))
    if measured is not None:
        seconds += model.num_layers * (measured[0] + measured[1])
        attention_flops = attention_forward_flops_per_token(model) * per_token * model.num_layers
        covered += 3.0 * attention_flops
        forward_s, forward_flops = forward_s + model.num_layers * measured[0], forward_flops + attention_flops
    if rerun > 0 and forward_flops > 0:
        seconds, covered = seconds + rerun * forward_s / forward_flops, covered + rerun
    return SampleSeconds(seconds, max(total - covered, 0.0))


def profiled_compute(
    models: np.ndarray,
    gpu: np.ndarray,
    precision: np.ndarray,
    recompute: np.ndarray,
    tokens: np.ndarray,
    profiles: Mapping[str, MeasuredProfile] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every cell: seconds per sample at the profiled rates, FLOPs per sample left for the fallback rate, and
    the fallback rate of a device without a peak (FLOP/s; NaN where the peak serves); NaN seconds where the cell
    has no profile or none in its precision. One evaluation per distinct model, precision, recomputation and
    micro-step tokens of a profiled GPU, so a table with no profiled GPU costs nothing."""
    n = len(gpu)
    seconds, rest, median = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    if not profiles:
        return seconds, rest, median
    rates = {name: product_rates(p) for name, p in profiles.items()}
    names = gpu.astype(str)
    rows = np.flatnonzero(np.isin(names, list(rates)) & np.isfinite(tokens))
    rows = rows[np.array([models[r] is not None for r in rows], dtype=bool)] if rows.size else rows
    if rows.size == 0:
        return seconds, rest, median
    # One evaluation per distinct (GPU, model, precision, recomputation, tokens), scattered to its rows.
    columns = (names[rows], np.array([id(m) for m in models[rows]]), precision[rows].astype(str),
               recompute[rows].astype(bool), tokens[rows].astype(float))  # fmt: skip
    group = np.zeros(rows.size, dtype=np.int64)
    for column in columns:  # each column's codes folded into the groups so far, renumbered from 0
        _, inverse = np.unique(column, return_inverse=True)
        _, group = np.unique(group * (int(inverse.max()) + 1) + inverse.reshape(-1), return_inverse=True)
        group = group.reshape(-1)
    _, first = np.unique(group, return_index=True)
    found = np.full((len(first), 3), np.nan)
    for g, i in enumerate(first.tolist()):
        row, own, dtype = rows[i], rates[names[rows[i]]], str(precision[rows[i]])
        sample = sample_seconds(models[row], dtype, float(tokens[row]), bool(recompute[row]), own)
        if sample is not None:
            found[g] = (sample.seconds, sample.fallback_flops, own.median_flops_s[dtype])
    seconds[rows], rest[rows], median[rows] = found[group, 0], found[group, 1], found[group, 2]
    return seconds, rest, median


__all__ = ("Layer", "ProductRates", "linear_layers", "product_rates", "profiled_compute", "sample_seconds")
