"""Pure arithmetic behind the report: training time, GPU-hours, costs, energy, token budgets.

Every function here takes numbers (or numpy arrays / pandas Series of them, where that is natural) and returns
numbers; nothing reads files. The model's own figures (parameters, FLOPs) are its family module's
(:mod:`orchestrator.models`). Purchase cost and five-year amortisation follow Khandelwal et al. 2024, "$100K or
100 Days" (arXiv 2410.23261).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import special

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0
HOURS_PER_YEAR = 365.0 * 24.0
AMORTISATION_YEARS = 5.0
"""The $100K paper writes a machine off over five years: ``cost * days / (5 * 365)``."""

BASE_MACHINE_USD: dict[int, float] = {1: 1_000.0, 2: 1_500.0, 4: 7_500.0, 8: 10_500.0}
"""Price of a machine without its GPUs, by GPU slots (Khandelwal et al. 2024, cost model)."""

# --------------------------------------------------------------------------------------------------------------
# Token budgets
# --------------------------------------------------------------------------------------------------------------

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_SUFFIXED_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]?)\s*$")


def suffixed_number(text: str | float) -> tuple[float, str] | None:
    """A number as a user writes an amount, ``300B``, ``100k``, ``1.5T``, ``7e9`` or ``1000``: its value and the
    suffix given (``""`` for none), or None where it cannot be read. K, M, B (or G) and T, in either case, multiply
    by 1e3, 1e6, 1e9 and 1e12. The one reader of token budgets, model sizes and budgets (GPU-hours, dollars)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text), ""
    match = _SUFFIXED_RE.match(str(text))
    if not match or match.group(2).upper() not in _SUFFIX:
        return None
    return float(match.group(1)) * _SUFFIX[match.group(2).upper()], match.group(2)


@dataclass(frozen=True)
class TokenBudget:
    """How many tokens the estimated training run sees.

    ``kind`` is ``model`` (each model's own run: train_steps × global batch × sequence length),
    ``per_parameter`` (``value`` tokens per parameter, e.g. 20 for Chinchilla) or ``absolute`` (``value`` tokens).
    """

    kind: str = "model"
    value: float | None = None

    def describe(self) -> str:
        """A short human label, e.g. ``20 tokens per parameter``."""
        if self.kind == "per_parameter":
            return f"{self.value:g} tokens per parameter"
        if self.kind == "absolute":
            return f"{self.value:.4g} tokens"
        return (
            "each model's own training run (train_steps x global batch, in its family's samples: sequences of "
            "sequence length tokens, or images)"
        )


MIN_BARE_TOKENS = 1e6
"""The smallest token budget accepted without a unit (K, M, B, T or x): below it a number is a forgotten unit."""


def parse_token_budget(tokens: str | float | int | None) -> TokenBudget:
    """Read a token budget: ``None`` (the model's own), ``"20x"`` (× parameters) or ``"300e9"`` / ``"300B"``.

    Suffixes K, M, B (or G) and T multiply by 1e3, 1e6, 1e9 and 1e12.
    """
    if tokens is None:
        return TokenBudget()
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
        if tokens <= 0:
            raise ValueError(f"token budget must be positive, got {tokens!r}")
        return TokenBudget("absolute", float(tokens))
    text = str(tokens).strip()
    if text.lower() in ("", "model", "default"):
        return TokenBudget()
    accepted = "accepted: '20x' (tokens per parameter), '300e9', '300B', '1.5T', or nothing for the model's own"
    if text.lower().endswith("x"):
        try:
            multiple = float(text[:-1])
        except ValueError:
            raise ValueError(f"cannot read token budget {tokens!r}; {accepted}") from None
        if multiple <= 0:
            raise ValueError(f"token budget {tokens!r} must be positive; {accepted}")
        return TokenBudget("per_parameter", multiple)
    read = suffixed_number(text)
    if read is None:
        raise ValueError(f"cannot read token budget {tokens!r}; {accepted}")
    value, unit = read
    if value <= 0:
        raise ValueError(f"token budget {tokens!r} must be positive; {accepted}")
    if not unit and value < MIN_BARE_TOKENS:
        # "300" or "20" is almost always a forgotten unit (300B, 20x): a run of a few hundred tokens trains nothing.
        raise ValueError(
            f"token budget {tokens!r} has no unit and is {value:g} tokens, far too few to pre-train on; give a unit: "
            f"'{text}B' ({value * 1e9:.3g} tokens), '{text}M', or '{text}x' (tokens per parameter)"
        )
    return TokenBudget("absolute", value)


def train_tokens(budget: TokenBudget, model_tokens: ArrayLike, num_parameters: ArrayLike) -> np.ndarray | float | None:
    """Tokens of the estimated run: the model's own, a multiple of its parameters, or a fixed number."""
    if budget.kind == "per_parameter":
        return np.asarray(num_parameters, dtype=float) * float(budget.value or 0.0)
    if budget.kind == "absolute":
        return np.full(np.shape(model_tokens), float(budget.value or 0.0)) if np.ndim(model_tokens) else budget.value
    return np.asarray(model_tokens, dtype=float) if np.ndim(model_tokens) else float(np.asarray(model_tokens))


def train_steps_for(tokens: ArrayLike, tokens_per_step: ArrayLike) -> np.ndarray | float:
    """Optimizer steps to see ``tokens`` at ``tokens_per_step`` per step, rounded up (a partial step is a step)."""
    # The tiny epsilon keeps 143000 * 2097152 / 2097152 at 143000 despite float rounding.
    out = np.ceil(np.asarray(tokens, dtype=float) / np.asarray(tokens_per_step, dtype=float) - 1e-9)
    return float(out) if np.ndim(out) == 0 else out


# --------------------------------------------------------------------------------------------------------------
# Time, spread, GPU-hours
# --------------------------------------------------------------------------------------------------------------


def time_to_train_days(train_steps: ArrayLike, step_time_s: ArrayLike) -> np.ndarray:
    """Days of wall-clock time for ``train_steps`` optimizer steps of ``step_time_s`` each."""
    days: np.ndarray = np.asarray(train_steps, dtype=float) * np.asarray(step_time_s, dtype=float) / SECONDS_PER_DAY
    return days


DEFAULT_GOODPUT = 0.90
"""The share of a large run's wall-clock time its training steps take where the cluster config gives none: Meta
reports more than 90% effective training time over a 54-day snapshot of Llama 3 405B's pre-training on 16,384
H100s (Llama Team 2024, "The Llama 3 Herd of Models", §3.3.4), and ByteDance more than 90% for MegaScale's runs on
over 10,000 GPUs (Jiang et al. 2024, NSDI, abstract). Published totals of GPU-hours are wall-clock figures."""


def goodput_of(goodput: ArrayLike | None) -> float | np.ndarray:
    """Each cell's goodput: its cluster's, else :data:`DEFAULT_GOODPUT` (NaN, None and out-of-range values)."""
    g = pd.to_numeric(pd.Series(np.atleast_1d(np.asarray(goodput, dtype=object))), errors="coerce").to_numpy()
    out: np.ndarray = np.where((g > 0) & (g <= 1), g, DEFAULT_GOODPUT)
    return float(out[0]) if goodput is None or np.ndim(goodput) == 0 else out


def wall_clock(steady: ArrayLike, goodput: ArrayLike | None) -> np.ndarray:
    """A figure of the training steps alone (days, GPU-hours) as the run's wall-clock figure: over its goodput."""
    out: np.ndarray = np.asarray(steady, dtype=float) / goodput_of(goodput)
    return out


def gpu_hours(num_gpus: ArrayLike, train_steps: ArrayLike, step_time_s: ArrayLike) -> np.ndarray | float:
    """GPU-hours of the run: every GPU is held for the whole of it."""
    hours: np.ndarray | float = (
        np.asarray(num_gpus, dtype=float)
        * np.asarray(train_steps, dtype=float)
        * np.asarray(step_time_s, dtype=float)
        / SECONDS_PER_HOUR
    )
    return hours


def ci95_halfwidth_pct(
    ci95_pct: ArrayLike | None = None,
    mean_s: ArrayLike | None = None,
    std_s: ArrayLike | None = None,
    steps_timed: ArrayLike | None = None,
) -> pd.Series:
    """Half-width of the 95% confidence interval of the mean step time, in % of the mean.

    The probe reports it (``step_time_ci95_pct``); where it did not, it is rebuilt from the standard deviation
    and the number of timed steps with Student's t. Works element-wise on Series; NaN where neither is known.
    """
    ci = pd.to_numeric(pd.Series(ci95_pct, dtype="object"), errors="coerce").astype(float)
    mean = pd.to_numeric(pd.Series(mean_s, dtype="object"), errors="coerce").astype(float)
    std = pd.to_numeric(pd.Series(std_s, dtype="object"), errors="coerce").astype(float)
    n = pd.to_numeric(pd.Series(steps_timed, dtype="object"), errors="coerce").astype(float)
    dof = (n - 1.0).where(n >= 2)  # NaN below two steps, and scipy gives NaN for a NaN dof
    t = pd.Series(special.stdtrit(dof.to_numpy(dtype=float), 0.975), index=n.index)
    rebuilt = 100.0 * t * std / np.sqrt(n) / mean
    out = ci.where(ci.notna(), rebuilt)
    return out


def interval(value: ArrayLike, halfwidth_pct: ArrayLike) -> tuple[np.ndarray | float, np.ndarray | float]:
    """``value`` minus and plus ``halfwidth_pct`` percent of it (the low end never below zero)."""
    v = np.asarray(value, dtype=float)
    hw = np.asarray(halfwidth_pct, dtype=float) / 100.0
    return np.maximum(v * (1.0 - hw), 0.0), v * (1.0 + hw)


# --------------------------------------------------------------------------------------------------------------
# Money and energy
# --------------------------------------------------------------------------------------------------------------


def base_machine_usd(gpus_per_node: ArrayLike) -> np.ndarray | float:
    """Price of the machine(s) holding ``gpus_per_node`` GPUs, without the GPUs.

    The paper prices machines with 1, 2, 4 and 8 slots; other counts take the smallest machine that holds them,
    and more than 8 take as many 8-slot machines as needed.
    """
    n = np.asarray(gpus_per_node, dtype=float)
    conditions = [n <= 1, n <= 2, n <= 4, n <= 8]
    choices = [BASE_MACHINE_USD[1], BASE_MACHINE_USD[2], BASE_MACHINE_USD[4], BASE_MACHINE_USD[8]]
    out = np.select(conditions, choices, default=np.ceil(n / 8.0) * BASE_MACHINE_USD[8])
    out = np.where(np.isnan(n) | (n < 1), np.nan, out)
    return float(out) if np.ndim(out) == 0 else out


def purchase_cost_usd(num_gpus: ArrayLike, num_nodes: ArrayLike, gpu_price_usd: ArrayLike) -> np.ndarray | float:
    """Cost of buying the cell's hardware: per node a base machine plus its GPUs (the $100K paper's model)."""
    gpus = np.asarray(num_gpus, dtype=float)
    nodes = np.maximum(np.asarray(num_nodes, dtype=float), 1.0)
    per_node = gpus / nodes
    cost: np.ndarray | float = nodes * base_machine_usd(per_node) + gpus * np.asarray(gpu_price_usd, dtype=float)
    return cost


def amortised_cost_usd(
    purchase_usd: ArrayLike, days: ArrayLike, years: float = AMORTISATION_YEARS
) -> np.ndarray | float:
    """The share of the purchase used up by a run of ``days``, writing the hardware off over ``years``."""
    used: np.ndarray | float = np.asarray(purchase_usd, dtype=float) * np.asarray(days, dtype=float) / (years * 365.0)
    return used


def cloud_cost_usd(gpu_hours_: ArrayLike, usd_per_gpu_hour: ArrayLike) -> np.ndarray | float:
    """Renting: GPU-hours times the hourly price of one GPU."""
    rent: np.ndarray | float = np.asarray(gpu_hours_, dtype=float) * np.asarray(usd_per_gpu_hour, dtype=float)
    return rent


def energy_kwh(gpu_hours_: ArrayLike, board_power_w: ArrayLike) -> np.ndarray | float:
    """Energy drawn by the GPU boards at their rated power for the whole run (host and cooling not included)."""
    kwh: np.ndarray | float = np.asarray(gpu_hours_, dtype=float) * np.asarray(board_power_w, dtype=float) / 1000.0
    return kwh
