"""What a compute budget buys: tokens for a given model, or the compute-optimal model for the budget.

After Le Scao et al. 2022 (BigScience, "What Language Model to Train if You Have One Million GPU Hours?"). A budget
is GPU-hours, dollars of cloud time, dollars of purchased GPUs kept for some days, or GPUs × days; on each GPU type
it becomes GPU-hours (and, for purchases and GPUs × days, a fixed GPU count).

- (a) For a model: tokens = GPU-hours × 3600 × tokens/s per GPU, against the compute-optimal 20 tokens per
  parameter (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", §3).
- (b) For the budget: C = GPU-hours × 3600 × achieved model FLOP/s per GPU; with C = 6·N·D and D = 20·N,
  N = sqrt(C/120) and D = 20·N. The model of that size (:func:`sized_model`) is laid out on every power-of-two
  GPU count; the cheapest configuration is the one that needs the fewest GPU-hours, the fastest the quickest that
  spends at most :data:`DEFAULT_OVERRUN_PCT` percent more than the budget.

Throughput per GPU is measured (records of a sweep, for the same model and GPU type) or predicted for the layouts of
:mod:`analysis.predict.parallelism`, each as ``gpudays plan`` predicts the cell that runs it; every row says which
in ``source``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.planners.shortest import MAX_GPUS, chinchilla_loss, critical_batch_sequences, scaling_curve
from analysis.predict.estimates import purchase_cost_usd, suffixed_number
from analysis.predict.layout_search import best_layout, min_gpus_to_fit
from analysis.predict.network import Network
from analysis.predict.parallelism import LayoutEstimate
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.config.values import Row
from orchestrator.models import flops_per_token, num_parameters

TOKENS_PER_PARAMETER = 20.0
"""Hoffmann et al. 2022: compute-optimal training sees about 20 tokens per parameter."""
FLOPS_PER_PARAMETER_TOKEN = 6.0
"""Kaplan et al. 2020, §2.1: training costs about 6 FLOPs per parameter and token (C ≈ 6·N·D)."""
HEAD_DIM = 128
"""Hidden size per attention head of a model described by size (GPT-3 and LLaMA use 128)."""
ASPECT_RATIO = 128.0
"""Hidden size over layers of a model described by size: GPT-3 175B has 12288/96 = 128; Kaplan et al. 2020 (fig. 5)
find the loss flat over a wide range of this ratio."""
DEFAULT_MAX_DAYS = 90.0
"""When the budget does not fix the GPU count, part (a) spreads the budget over enough GPUs to end within this many
days, and part (b)'s cheapest configuration is the cheapest that ends within it (where one can)."""
DEFAULT_OVERRUN_PCT = 25.0
"""Part (b)'s fastest configuration may spend this much more than the budget: going faster costs efficiency."""


@dataclass(frozen=True)
class Budget:
    """What the user can spend. ``kind``: ``gpu_hours``, ``cloud_usd``, ``purchase_usd`` or ``gpu_days``."""

    kind: str
    gpu_hours: float | None = None
    usd: float | None = None
    num_gpus: int | None = None
    days: float | None = None

    def describe(self) -> str:
        if self.kind == "gpu_hours":
            return f"{self.gpu_hours:,.0f} GPU-hours"
        if self.kind == "cloud_usd":
            return f"${self.usd:,.0f} of cloud GPU time"
        if self.kind == "purchase_usd":
            return f"${self.usd:,.0f} of GPUs bought and used for {self.days:g} days"
        return f"{self.num_gpus} GPUs for {self.days:g} days"


def amount(flag: str, value: str | float | None) -> float | None:
    """A budget's amount as given, ``1M``, ``100k``, ``2.5e4`` or ``1000`` (``suffixed_number``); a ValueError
    naming ``flag`` and the accepted forms where it is not a number above 0."""
    if value is None:
        return None
    read = suffixed_number(value)
    if read is None or not (0 < read[0] < math.inf):
        raise ValueError(f"{flag} {value}: give an amount above 0, such as 1000, 2.5e4, 100k or 1M (K, M, B, T)")
    return read[0]


def parse_budget(
    gpu_hours: str | float | None = None,
    usd: str | float | None = None,
    pricing: str = "cloud",
    num_gpus: int | None = None,
    days: str | float | None = None,
) -> Budget:
    """One budget from the command line's options (amounts as given: ``1M``, ``100k``, ``2.5e4``); a ValueError
    that says what is accepted otherwise."""
    accepted = "give one of: --gpu-hours H, --usd D [--pricing cloud|purchase --days N], --gpus N --days N"
    kinds = [k for k, v in (("gpu_hours", gpu_hours), ("usd", usd), ("gpus", num_gpus)) if v is not None]
    if len(kinds) != 1:
        raise ValueError(f"a budget needs exactly one amount ({', '.join(kinds) or 'none given'}); {accepted}")
    gpu_hours, usd, days = (
        amount(flag, v) for flag, v in (("--gpu-hours", gpu_hours), ("--usd", usd), ("--days", days))
    )
    if num_gpus is not None and not num_gpus > 0:
        raise ValueError(f"--gpus must be positive, got {num_gpus!r}")
    if gpu_hours is not None:
        return Budget("gpu_hours", gpu_hours=float(gpu_hours))
    if usd is not None:
        if pricing == "cloud":
            return Budget("cloud_usd", usd=float(usd))
        if pricing == "purchase":
            if days is None:
                raise ValueError("--pricing purchase needs --days: how long the GPUs bought are used")
            return Budget("purchase_usd", usd=float(usd), days=float(days))
        raise ValueError(f"--pricing {pricing!r}: accepted cloud or purchase")
    if days is None:
        raise ValueError("--gpus needs --days: a budget of GPUs × days")
    return Budget("gpu_days", num_gpus=int(num_gpus or 0), days=float(days))


@dataclass(frozen=True)
class Allowance:
    """What a budget gives on one GPU type: GPU-hours, and the GPU count where the budget fixes it."""

    gpu_hours: float | None
    num_gpus: int | None
    reason: str


def allowance(budget: Budget, gpu: GpuConfig, gpus_per_node: int) -> Allowance:
    """GPU-hours (and a fixed GPU count) the budget buys on ``gpu``; None with the reason where prices are missing."""
    if budget.kind == "gpu_hours":
        return Allowance(budget.gpu_hours, None, budget.describe())
    if budget.kind == "gpu_days":
        n = int(budget.num_gpus or 0)
        return Allowance(n * float(budget.days or 0) * 24.0, n, budget.describe())
    if budget.kind == "cloud_usd":
        if not gpu.cloud_usd_per_gpu_hour:
            return Allowance(None, None, f"conf/gpu/{gpu.name}.yaml has no cloud_usd_per_gpu_hour")
        rate = gpu.cloud_usd_per_gpu_hour
        return Allowance(float(budget.usd or 0) / rate, None, f"{budget.describe()} at ${rate:g} a GPU-hour")
    if not gpu.purchase_price_usd:
        return Allowance(None, None, f"conf/gpu/{gpu.name}.yaml has no purchase_price_usd")
    usd, price = float(budget.usd or 0), gpu.purchase_price_usd
    nodes = 0  # whole servers first; a budget short of one server buys a part-filled one
    while purchase_cost_usd((nodes + 1) * gpus_per_node, nodes + 1, price) <= usd:
        nodes += 1
    n = nodes * gpus_per_node
    while nodes == 0 and n < gpus_per_node and purchase_cost_usd(n + 1, 1, price) <= usd:
        n += 1
    if n == 0:
        return Allowance(None, None, f"${usd:,.0f} buys no {gpu.name} with its server")
    days = float(budget.days or 0)
    return Allowance(n * days * 24.0, n, f"{budget.describe()}: {n} GPUs with their servers")


def fixed_count_layout(
    model: ModelConfig, gpu: GpuConfig, num_gpus: int, batch: int, network: Network, efficiency: float
) -> tuple[LayoutEstimate | None, str]:
    """The best layout on ``num_gpus`` GPUs, else on the largest power of two under it (a note says so)."""
    est = best_layout(model, gpu, num_gpus, batch, network, efficiency)
    if est is not None:
        return est, ""
    fallback = 1 << (num_gpus.bit_length() - 1)
    if fallback < num_gpus:
        est = best_layout(model, gpu, fallback, batch, network, efficiency)
        if est is not None:
            return est, f"; no layout of all {num_gpus} GPUs runs {batch} sequences a step, so {fallback} of them"
    return None, f"; no layout of {model.name} fits on {num_gpus} GPUs"


def parse_size(text: str) -> float:
    """A parameter count such as ``70B``, ``1.3e9`` or ``350M``; a ValueError naming the accepted forms."""
    read = suffixed_number(text)
    if read is None or not (0 < read[0] < math.inf):
        raise ValueError(f"cannot read model size {text!r}; accepted: 350M, 1.3B, 70B, 1T or a number like 7e9")
    return read[0]


def sized_model(
    target_parameters: float, seq_length: int = 2048, vocab_size: int = 50304, global_batch_size: int = 1024
) -> ModelConfig:
    """A GPT-NeoX model of about ``target_parameters``: h/L ≈ :data:`ASPECT_RATIO`, 128-wide heads, f = 4h.

    The hidden size is rounded to a multiple of 1024 (8 heads, so tensor parallelism up to 8 divides them) and
    the layers to a multiple of 4 (so pipelines of 2 and 4 stages divide them); its parameter count is exact
    (``num_parameters``), within two layers' worth of the target.
    """
    width = (ASPECT_RATIO * target_parameters / 12.0) ** (1.0 / 3.0)
    step = 8 * HEAD_DIM if width >= 8 * HEAD_DIM else HEAD_DIM
    hidden = max(HEAD_DIM, round(width / step) * step)
    per_layer = 12.0 * hidden * hidden + 13.0 * hidden
    layers_wanted = (target_parameters - 2.0 * vocab_size * hidden) / per_layer
    layers = max(1, round(layers_wanted / 4) * 4) if layers_wanted >= 4 else max(1, round(layers_wanted))
    model = ModelConfig(
        name="", num_layers=layers, hidden_size=hidden, num_heads=hidden // HEAD_DIM, vocab_size=vocab_size,
        seq_length=seq_length, global_batch_size=global_batch_size,
    )  # fmt: skip
    model.name = f"{num_parameters(model) / 1e9:.3g}B (L{layers} h{hidden})"
    return model


def compute_optimal(flops: float) -> tuple[float, float]:
    """Compute-optimal (N parameters, D tokens) for ``flops`` under C = 6·N·D and D = 20·N."""
    if not flops > 0:
        raise ValueError(f"compute must be positive, got {flops!r} FLOPs")
    n = math.sqrt(flops / (FLOPS_PER_PARAMETER_TOKEN * TOKENS_PER_PARAMETER))
    return n, TOKENS_PER_PARAMETER * n


@dataclass(frozen=True)
class Measured:
    """The best measured throughput of one model on one GPU type, from a sweep's records."""

    tokens_per_s_per_gpu: float
    mfu: float | None
    num_gpus: int
    sweep: str


def _gpu_count(gpu_hours: float, max_days: float, smallest: int) -> int:
    wanted = gpu_hours / (24.0 * max_days)
    return max(smallest, 1 << max(0, math.ceil(math.log2(max(wanted, 1.0)))))


def _layout_columns(est: LayoutEstimate | None) -> Row:
    if est is None:
        return {"layout": None, "memory_gib": None, "bubble_fraction": None, "mfu": None}
    return {
        "layout": est.layout.describe(), "memory_gib": est.memory_gib, "bubble_fraction": est.bubble_fraction,
        "mfu": est.mfu,
    }  # fmt: skip


def tokens_for_budget(
    model: ModelConfig,
    gpu: GpuConfig,
    budget: Budget,
    network: Network,
    measured: Measured | None = None,
    max_days: float = DEFAULT_MAX_DAYS,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> list[Row]:
    """Part (a): how many tokens the budget trains ``model`` on ``gpu``, predicted and (where known) measured."""
    n_params = num_parameters(model)
    base: Row = {"model": model.name, "num_parameters": n_params, "gpu": gpu.name}
    grant = allowance(budget, gpu, network.gpus_per_node)
    if grant.gpu_hours is None:
        return [{**base, "source": "predicted", "reason": grant.reason}]
    smallest = min_gpus_to_fit(model, gpu, model.global_batch_size, network)
    if smallest is None:
        return [{**base, "source": "predicted", "reason": f"no layout fits {model.name} on {gpu.name}"}]
    note = ""
    if grant.num_gpus is not None:
        est, note = fixed_count_layout(model, gpu, grant.num_gpus, model.global_batch_size, network, efficiency)
        n = est.layout.num_gpus if est else grant.num_gpus
    else:
        n = _gpu_count(grant.gpu_hours, max_days, smallest)
        est = best_layout(model, gpu, n, model.global_batch_size, network, efficiency)
        while est is None and n > smallest:
            n //= 2  # more GPUs than the model's batch can be spread over
            est = best_layout(model, gpu, n, model.global_batch_size, network, efficiency)
    rows = []
    sources: list[tuple[str, float | None, str]] = [
        ("predicted", est.tokens_per_s_per_gpu if est else None, est.layout.describe() if est else "does not fit")
    ]
    if measured is not None:
        measured_note = f"measured on {measured.num_gpus} GPUs (sweep {measured.sweep}), assumed to hold on {n}"
        sources.append(("measured", measured.tokens_per_s_per_gpu, measured_note))
    # A budget of fixed GPUs that no layout uses whole spends only the GPUs the layout uses.
    hours = grant.gpu_hours * (n / grant.num_gpus if grant.num_gpus else 1.0)
    for source, tps, layout_note in sources:
        row = {**base, "source": source, "num_gpus": n, **_layout_columns(est if source == "predicted" else None)}
        if source == "measured" and measured is not None:
            row["mfu"] = measured.mfu
        row.update(gpu_hours=hours, days=hours / n / 24.0, tokens_per_s_per_gpu=tps)
        if tps:
            tokens = hours * 3600.0 * tps
            row.update(
                tokens=tokens, tokens_per_parameter=tokens / n_params,
                compute_optimal_tokens=TOKENS_PER_PARAMETER * n_params,
                tokens_vs_compute_optimal=tokens / (TOKENS_PER_PARAMETER * n_params),
                model_flops=tokens * flops_per_token(model),
            )  # fmt: skip
        row.update(_costs(gpu, hours, budget), reason=f"{grant.reason}{note}; {layout_note}")
        rows.append(row)
    return rows


def _costs(gpu: GpuConfig, gpu_hours: float, budget: Budget) -> Row:
    rate = gpu.cloud_usd_per_gpu_hour
    out: Row = {"cloud_cost_usd": gpu_hours * rate if rate else None}
    if budget.kind == "purchase_usd":
        out["purchase_usd"] = budget.usd
    return out


def optimal_for_budget(
    gpu: GpuConfig,
    budget: Budget,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    seq_length: int = 2048,
    vocab_size: int = 50304,
    max_gpus: int = MAX_GPUS,
    overrun_pct: float = DEFAULT_OVERRUN_PCT,
    max_days: float = DEFAULT_MAX_DAYS,
) -> list[Row]:
    """Part (b): the compute-optimal model for the budget on ``gpu``, and its cheapest and fastest configurations.

    C is sized with the best model-FLOPs utilisation found (a first pass at ``efficiency``), so the cheapest
    configuration (the fewest GPU-hours among those that end within ``max_days``) spends about the whole budget and
    never more than the best it can; the fastest is the quickest that spends at most ``overrun_pct`` percent more
    (``budget_used_pct`` says how much each uses).
    """
    base: Row = {"gpu": gpu.name, "source": "predicted"}
    grant = allowance(budget, gpu, network.gpus_per_node)
    peak = gpu.peak_tflops_bf16 or gpu.peak_tflops_fp16
    if grant.gpu_hours is None or not peak:
        return [{**base, "reason": grant.reason if grant.gpu_hours is None else f"{gpu.name} has no 16-bit peak"}]
    # C counts 6·N FLOPs a token (Hoffmann et al.'s convention), so the rate is 6·N × tokens/s per GPU: first at
    # the assumed efficiency, then at the best the layouts of the sized model reach, until the size settles.
    rate = efficiency * peak * 1e12
    curve: list[LayoutEstimate] = []
    note = ""
    hours = grant.gpu_hours
    sized: tuple[int, int] | None = None
    for _ in range(3):
        flops = hours * 3600.0 * rate
        n_opt, d_opt = compute_optimal(flops)
        batch = critical_batch_sequences(chinchilla_loss(n_opt, d_opt), seq_length)
        model = sized_model(n_opt, seq_length, vocab_size, batch)
        if (num_parameters(model), batch) == sized:
            break  # settled: the same model and batch give the same layouts, and so the same rate
        sized = (num_parameters(model), batch)
        if grant.num_gpus is not None:
            est, note = fixed_count_layout(model, gpu, grant.num_gpus, batch, network, efficiency)
            curve = [est] if est else []
            hours = grant.gpu_hours * (est.layout.num_gpus / grant.num_gpus if est else 1.0)
        else:
            start = min_gpus_to_fit(model, gpu, batch, network, max_gpus)
            curve = scaling_curve(model, gpu, batch, network, efficiency, start, max_gpus, False) if start else []
        if not curve:
            break
        timely = [e for e in curve if hours / e.layout.num_gpus / 24.0 <= max_days] or curve
        rate = max(e.tokens_per_s_per_gpu for e in timely) * FLOPS_PER_PARAMETER_TOKEN * num_parameters(model)
    n_params = num_parameters(model)
    if curve:  # the budget's C at the rate the model as built reaches, all spent on it (D ≈ 20·N)
        flops = hours * 3600.0 * rate
    run_tokens = flops / (FLOPS_PER_PARAMETER_TOKEN * n_params)
    common = {
        **base, "model": model.name, "num_parameters": n_params, "compute_optimal_parameters": n_opt,
        "compute_optimal_tokens": d_opt, "compute_flops": flops, "tokens": run_tokens,
        "tokens_per_parameter": run_tokens / n_params, "global_batch_size": batch,
        "budget_gpu_hours": hours,
    }  # fmt: skip
    if not curve:
        where = note or f"; no layout of {model.name} fits up to {max_gpus} GPUs"
        return [{**common, "reason": grant.reason + where}]

    # The cheapest ends within max_days where any configuration can, and needs the fewest GPU-hours of those;
    # of two that need the same GPU-hours (to rounding), the one with more GPUs, which ends sooner. A
    # configuration that costs even 1% more is not the cheapest: it is a faster one.
    def days(e: LayoutEstimate) -> float:
        return run_tokens / e.tokens_per_s_per_gpu / e.layout.num_gpus / 86_400.0

    timely = [e for e in curve if days(e) <= max_days] or curve
    cheapest = max(timely, key=lambda e: (round(e.tokens_per_s_per_gpu, 6), e.layout.num_gpus))
    # The fastest spends more than the budget (its layouts are less efficient) by at most the allowed overrun.
    most_hours = hours * (1.0 + overrun_pct / 100.0)
    affordable = [e for e in curve if run_tokens / e.tokens_per_s_per_gpu / 3600.0 <= most_hours] or [cheapest]
    fastest = min(affordable, key=days)
    rows = []
    for choice, est in (("cheapest", cheapest), ("fastest", fastest)):
        gpu_hours = run_tokens / est.tokens_per_s_per_gpu / 3600.0
        row = {**common, "choice": choice, "num_gpus": est.layout.num_gpus, **_layout_columns(est)}
        row.update(
            tokens_per_s_per_gpu=est.tokens_per_s_per_gpu, gpu_hours=gpu_hours,
            days=gpu_hours / est.layout.num_gpus / 24.0, budget_used_pct=100.0 * gpu_hours / hours,
            **_costs(gpu, gpu_hours, budget), reason=grant.reason + note,
        )  # fmt: skip
        rows.append(row)
    return rows
