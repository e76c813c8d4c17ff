"""The shortest possible training of a model: the critical batch, and the most GPUs that batch can keep busy.

After Lamy-Poirier 2021 ("Layered gradient accumulation and modular pipeline parallelism: fast and efficient
training of large language models", arXiv:2106.02679): past the critical batch size a larger
batch buys no fewer optimizer steps, so the batch is bounded, and with it the GPUs that can share one step.

- Loss in nats per token from Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models", §3.3,
  approach 3): ``L(N, D) = E + A/N^α + B/D^β`` with E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28; or a loss
  the user gives.
- Critical batch in tokens from Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", eq. 1.4
  and §5.1): ``B_crit(L) ≈ B* / L^(1/α_B)`` with B* ≈ 2·10^8 tokens and α_B ≈ 0.21.
- Data parallelism alone needs one sequence per GPU at least: at most B_crit / s GPUs. Tensor parallelism (inside
  a node) and pipeline parallelism (up to one layer a stage) multiply that; the layouts of
  :mod:`analysis.predict.parallelism`, each predicted as ``gpudays plan`` predicts the cell that runs it, say where
  adding GPUs stops paying (bubble, communication).

Every figure is a prediction (``source: predicted``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.predict.layout_search import best_by_count, min_gpus_to_fit, powers_of_two
from analysis.predict.network import Network
from analysis.predict.parallelism import LayoutEstimate, with_batch
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.models import num_parameters

CHINCHILLA_E = 1.69
CHINCHILLA_A = 406.4
CHINCHILLA_B = 410.7
CHINCHILLA_ALPHA = 0.34
CHINCHILLA_BETA = 0.28
"""Hoffmann et al. 2022, §3.3: the parametric fit of the final loss (nats) to parameters N and tokens D."""
KAPLAN_B_STAR_TOKENS = 2e8
KAPLAN_ALPHA_B = 0.21
"""Kaplan et al. 2020, eq. 1.4: critical batch B_crit(L) = B*/L^(1/α_B), B* ≈ 2e8 tokens, α_B ≈ 0.21."""
USEFUL_SPEEDUP = 1.5
"""A doubling of the GPUs is worth it while it makes the step at least this much faster (75% of the ideal 2x)."""
MAX_GPUS = 1 << 20
"""The largest GPU count searched (about a million)."""


def chinchilla_loss(num_parameters_: float, tokens: float) -> float:
    """Final training loss in nats per token predicted by Hoffmann et al.'s fit for N parameters and D tokens."""
    if num_parameters_ <= 0 or tokens <= 0:
        raise ValueError(f"parameters and tokens must be positive, got N={num_parameters_!r}, D={tokens!r}")
    return float(
        CHINCHILLA_E + CHINCHILLA_A / num_parameters_**CHINCHILLA_ALPHA + CHINCHILLA_B / tokens**CHINCHILLA_BETA
    )


def critical_batch_tokens(loss_nats: float) -> float:
    """Kaplan et al.'s critical batch size in tokens at a loss of ``loss_nats`` per token."""
    if loss_nats <= 0:
        raise ValueError(f"loss must be positive (nats per token), got {loss_nats!r}")
    return float(KAPLAN_B_STAR_TOKENS / loss_nats ** (1.0 / KAPLAN_ALPHA_B))


def critical_batch_sequences(loss_nats: float, seq_length: int) -> int:
    """The critical batch in whole sequences, rounded down to a power of two (so it splits over GPU counts)."""
    sequences = max(1.0, critical_batch_tokens(loss_nats) / seq_length)
    return 1 << int(math.floor(math.log2(sequences)))


@dataclass(frozen=True)
class ShortestRun:
    """The fastest predicted training of ``model`` on ``gpu`` at ``global_batch_size`` under one restriction."""

    model: str
    gpu: str
    parallelism: str
    """``data`` (data parallelism alone) or ``data+tensor+pipeline``."""
    point: str
    """``useful`` (the most GPUs at which each doubling still paid, see :func:`useful_point`) or ``fastest``."""
    num_parameters: int
    tokens: float
    loss_nats: float
    loss_source: str
    critical_batch_tokens: float
    global_batch_size: int
    batch_source: str
    max_gpus_by_batch: int
    """The most GPUs the batch can be spread over under this restriction (one sequence a data-parallel replica)."""
    estimate: LayoutEstimate | None
    train_steps: int
    reason: str

    @property
    def num_gpus(self) -> int | None:
        return self.estimate.layout.num_gpus if self.estimate else None

    @property
    def days(self) -> float | None:
        return self.train_steps * self.estimate.step_time_s / 86_400.0 if self.estimate else None

    @property
    def gpu_hours(self) -> float | None:
        days = self.days
        return days * 24.0 * self.num_gpus if days is not None and self.num_gpus else None


def scaling_curve(
    model: ModelConfig,
    gpu: GpuConfig,
    batch: int,
    network: Network,
    efficiency: float,
    start: int,
    limit: int,
    data_parallel_only: bool,
) -> list[LayoutEstimate]:
    """The best fitting layout at each power-of-two GPU count from ``start`` to ``limit``."""
    found = best_by_count(model, gpu, powers_of_two(start, limit), batch, network, efficiency, data_parallel_only)
    return [ranked[0] for ranked in found.values() if ranked]


def useful_point(curve: list[LayoutEstimate]) -> LayoutEstimate | None:
    """The largest GPU count reached by doublings that each cut the step time by :data:`USEFUL_SPEEDUP` or more."""
    if not curve:
        return None
    point = curve[0]
    for est in curve[1:]:
        if est.step_time_s * USEFUL_SPEEDUP > point.step_time_s:
            break
        point = est
    return point


def shortest_training(
    model: ModelConfig,
    gpu: GpuConfig,
    network: Network,
    tokens: float,
    loss_nats: float | None = None,
    global_batch_size: int | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    max_gpus: int = MAX_GPUS,
) -> list[ShortestRun]:
    """The fastest predicted run of ``tokens`` tokens with data parallelism alone, and with all three kinds.

    The batch is the critical batch at the loss (Hoffmann et al.'s prediction for this N and D unless
    ``loss_nats`` is given), unless ``global_batch_size`` (sequences) overrides it. GPU counts are powers of two
    up to what the batch allows and ``max_gpus``.
    """
    n_params = num_parameters(model)
    if loss_nats is None:
        loss, loss_source = chinchilla_loss(n_params, tokens), "Hoffmann et al. 2022 fit"
    else:
        loss, loss_source = float(loss_nats), "given"
    b_crit = critical_batch_tokens(loss)
    if global_batch_size is not None:
        batch, batch_source = int(global_batch_size), "given"
    else:
        batch, batch_source = critical_batch_sequences(loss, model.seq_length), "critical (Kaplan et al. 2020)"
    sized = with_batch(model, batch)
    steps = math.ceil(tokens / (batch * model.seq_length) - 1e-9)
    tensor_max = max(t for t in (1, 2, 4, 8, 16) if t <= network.gpus_per_node and model.num_heads % t == 0)
    rows: list[ShortestRun] = []
    start = min_gpus_to_fit(sized, gpu, batch, network, max_gpus) or max_gpus * 2
    for label, dp_only, limit in (
        ("data", True, batch),
        ("data+tensor+pipeline", False, batch * tensor_max * model.num_layers),
    ):
        cap = min(limit, max_gpus)
        curve = scaling_curve(sized, gpu, batch, network, efficiency, 1 if dp_only else start, cap, dp_only)
        fastest = min(curve, key=lambda e: e.step_time_s) if curve else None
        for point, est in (("useful", useful_point(curve)), ("fastest", fastest)):
            if est is None:
                where = "data-parallel layout" if dp_only else f"layout up to {cap} GPUs"
                reason = f"no {where} fits in {gpu.memory_gib:g} GiB a GPU at {batch} sequences a step"
            else:
                reason = f"{est.layout.describe()}: bubble {est.bubble_fraction:.0%}, {est.memory_gib:.1f} GiB a GPU"
                if point == "fastest" and est.layout.num_gpus < cap:
                    reason += f"; more GPUs (up to {cap}) make the step no faster"
                elif point == "fastest":
                    reason += "; every GPU the batch allows"
                else:
                    reason += f"; the next doubling is under {USEFUL_SPEEDUP:g}x faster"
            rows.append(
                ShortestRun(
                    model=model.name, gpu=gpu.name, parallelism=label, point=point, num_parameters=n_params,
                    tokens=tokens, loss_nats=loss, loss_source=loss_source, critical_batch_tokens=b_crit,
                    global_batch_size=batch, batch_source=batch_source, max_gpus_by_batch=limit, estimate=est,
                    train_steps=steps, reason=reason,
                )
            )  # fmt: skip
    return rows
