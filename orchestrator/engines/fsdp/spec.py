"""FSDP2 as the registry sees it: the ``fsdp_*`` fields it owns, their refusals, its label, and where its memory
and step-time terms are (:mod:`orchestrator.engines.spec` says what each part is)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.config.refusal import Refusal
from orchestrator.config.schema import MethodConfig
from orchestrator.config.values import Scalar
from orchestrator.engines.fsdp.config import SHARDINGS
from orchestrator.engines.spec import EngineSpec

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.config.schema import Config
    from orchestrator.engines.spec import CellArrays, Links, Terms

FIELDS = ("fsdp_sharding", "fsdp_offload", "fsdp_reduce_precision", "fsdp_accumulation")


def check(cell: Config) -> list[Refusal]:
    """FSDP2's options that do not exist together or not on this cell's machines, and fp16.

    One GPU is accepted for every sharding but hybrid: FSDP then shards over a group of one, and the cell measures
    what its wrapper costs a single-GPU run (unlike ZeRO, refused there as in the $100K paper).
    """
    m = cell.method
    out: list[Refusal] = []
    if m.fsdp_sharding == "hybrid" and cell.num_nodes < 2:
        out.append(
            Refusal(
                "method.fsdp_sharding",
                "hybrid shards inside a node and replicates across nodes, so it needs num_nodes >= 2; "
                "on one node use full (the same thing there)",
            )
        )
    if m.fsdp_offload and cell.gpu.accelerator != "cuda":
        out.append(Refusal("method.fsdp_offload", "offload moves device memory to the host; on gpu=cpu use false"))
    if m.fsdp_offload and m.fsdp_sharding == "none":
        out.append(Refusal("method.fsdp_offload", "offload needs sharding; use method.fsdp_sharding=full or grad_op"))
    if m.precision == "fp16":
        out.append(
            Refusal(
                "method.precision",
                "fp16 with method.engine=fsdp needs a sharded gradient scaler for loss scaling, which gpudays "
                "does not run; use bf16 or fp32, or method.engine=deepspeed",
            )
        )
    return out


def foreign(owner: EngineSpec, value: object, default: object) -> str:
    return (
        f"{value!r} is {owner.setting}; with method.engine=fsdp leave it at {default!r} and shard with "
        f"method.fsdp_sharding ({', '.join(SHARDINGS)}) and offload with method.fsdp_offload=true"
    )


def label(settings: Mapping[str, Scalar]) -> str:
    """``fsdp-<sharding>`` (``full`` where unknown), then ``offload`` and ``reduce-<dtype>`` where set."""
    sharding = settings.get("fsdp_sharding")
    parts = [f"fsdp-{sharding if isinstance(sharding, str) and sharding else MethodConfig.fsdp_sharding}"]
    if settings.get("fsdp_offload") is True:
        parts.append("offload")
    reduce = settings.get("fsdp_reduce_precision")
    if isinstance(reduce, str) and reduce and reduce != MethodConfig.fsdp_reduce_precision:
        parts.append(f"reduce-{reduce}")
    accumulation = settings.get("fsdp_accumulation")
    if isinstance(accumulation, str) and accumulation and accumulation != MethodConfig.fsdp_accumulation:
        parts.append(f"accumulate-{accumulation}")
    return " ".join(parts)


def memory_terms(x: CellArrays) -> Terms:
    from orchestrator.engines.fsdp.memory import memory_terms_of

    return memory_terms_of(x)


def accumulated_bytes(x: CellArrays) -> np.ndarray:
    from orchestrator.engines.fsdp.memory import accumulated_bytes_of

    return accumulated_bytes_of(x)


def build_bytes(x: CellArrays) -> np.ndarray | float:
    from orchestrator.engines.fsdp.memory import build_bytes_of

    return build_bytes_of(x)


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    from orchestrator.engines.fsdp.step_time import step_time_terms as terms

    return terms(x, accum, links)


SPEC = EngineSpec(
    name="fsdp",
    setting="an FSDP setting",
    fields=FIELDS,
    check=check,
    foreign=foreign,
    label=label,
    memory_terms=memory_terms,
    step_time_terms=step_time_terms,
    build_bytes=build_bytes,
    accumulated_bytes=accumulated_bytes,
    not_fit_advice="full sharding, fsdp_offload",
    sharding_fields=("fsdp_sharding", "fsdp_offload"),  # the reduce dtype is tuned per count, as precision is
    identity_own=("fsdp_accumulation",),  # its default changed what an FSDP cell runs: old ids are not the new
)
