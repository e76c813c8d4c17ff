"""DeepSpeed as the registry sees it: the ZeRO fields it owns, their refusals, its label, and where its memory
and step-time terms are (:mod:`orchestrator.engines.spec` says what each part is)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.config.refusal import Refusal
from orchestrator.config.values import Scalar
from orchestrator.engines.spec import EngineSpec

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.config.schema import Config
    from orchestrator.engines.spec import CellArrays, Links, Terms

FIELDS = ("zero_stage", "offload_optimizer", "offload_params")


def check(cell: Config) -> list[Refusal]:
    """ZeRO's options that do not exist together, and sharding over one GPU without offload (refused there as in
    the $100K paper: it only adds overhead)."""
    m = cell.method
    out: list[Refusal] = []
    if m.offload_optimizer and m.zero_stage == 0:
        out.append(Refusal("method.offload_optimizer", "offloading needs sharding; use method.zero_stage=1, 2 or 3"))
    if m.offload_params and m.zero_stage != 3:
        out.append(Refusal("method.offload_params", "parameter offload needs method.zero_stage=3"))
    if cell.num_gpus == 1 and m.zero_stage > 0 and not (m.offload_optimizer or m.offload_params):
        out.append(
            Refusal(
                "method.zero_stage",
                "sharding over one GPU only adds overhead; use method.zero_stage=0, or offload "
                "(method.offload_optimizer=true)",
            )
        )
    return out


def foreign(owner: EngineSpec, value: object, default: object) -> str:
    return (
        f"{value!r} is {owner.setting}; use method.engine={owner.name}, or leave it at {default!r} with DeepSpeed "
        "(which shards with method.zero_stage)"
    )


def label(settings: Mapping[str, Scalar]) -> str:
    """``zero2``, then ``offload-opt`` and ``offload-params`` where set; ``zero?`` where the stage is unknown."""
    stage = _whole(settings.get("zero_stage"))
    parts = [f"zero{stage}" if stage is not None else "zero?"]
    if settings.get("offload_optimizer") is True:
        parts.append("offload-opt")
    if settings.get("offload_params") is True:
        parts.append("offload-params")
    return " ".join(parts)


def memory_terms(x: CellArrays) -> Terms:
    from orchestrator.engines.deepspeed.memory import memory_terms_of

    return memory_terms_of(x)


def build_bytes(x: CellArrays) -> np.ndarray | float:
    from orchestrator.engines.deepspeed.memory import build_bytes_of

    return build_bytes_of(x)


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    from orchestrator.engines.deepspeed.step_time import step_time_terms as terms

    return terms(x, accum, links)


def _whole(value: Scalar) -> int | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


SPEC = EngineSpec(
    name="deepspeed",
    setting="a DeepSpeed setting",
    fields=FIELDS,
    check=check,
    foreign=foreign,
    label=label,
    memory_terms=memory_terms,
    step_time_terms=step_time_terms,
    build_bytes=build_bytes,
    not_fit_advice="a higher ZeRO stage, offload",
    # In every cell's id since before there was a second engine; a field added later joins an id only where set.
    identity_always=("zero_stage", "offload_optimizer", "offload_params"),
    sharding_fields=("zero_stage", "offload_optimizer", "offload_params"),
    compile_scopes=("regional", "whole"),  # whole: DeepSpeedEngine.compile(), its ZeRO hooks marked not traced
)
