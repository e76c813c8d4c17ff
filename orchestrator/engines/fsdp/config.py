"""How a cell's method maps onto FSDP2's options: the device mesh, resharding, mixed precision and offload.

Pure: nothing here imports torch.distributed or touches a device, so the unit tests check every rule.

| ``method.fsdp_sharding`` | mesh | ``reshard_after_forward`` | like |
|---|---|---|---|
| ``full`` | 1-D, every rank shards | True: parameters gathered again in the backward | ZeRO-3 |
| ``grad_op`` | 1-D, every rank shards | False: whole parameters kept from forward to backward | ZeRO-2 |
| ``none`` | 2-D (ranks × 1): a replica per rank, shards of one | False | plain data parallel (DDP) |
| ``hybrid`` | 2-D (nodes × GPUs per node): replicas across nodes, shards inside | True | HSDP |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.choices import FSDP_REDUCE_PRECISIONS, FSDP_SHARDINGS

if TYPE_CHECKING:
    from orchestrator.config.schema import MethodConfig

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
SHARDINGS = FSDP_SHARDINGS
"""``method.fsdp_sharding``'s domain (orchestrator/config/schema.py)."""
REDUCE_PRECISIONS = FSDP_REDUCE_PRECISIONS
"""``method.fsdp_reduce_precision``'s domain."""
MESH_DIM_NAMES = ("replicate", "shard")


@dataclass(frozen=True)
class FsdpOptions:
    """The arguments of ``fully_shard`` (and the mesh it shards over) for one cell."""

    sharding: str
    mesh_shape: tuple[int, ...]
    """1-D: shard over every rank; 2-D: (replicas, shards per replica), dims named :data:`MESH_DIM_NAMES`."""
    reshard_after_forward: bool
    param_dtype: str | None
    """torch dtype name the parameters are computed in; None keeps the fp32 of the sharded parameters."""
    reduce_dtype: str | None
    """torch dtype name gradients are reduced and accumulated in; None: the parameters' compute dtype."""
    offload: bool
    """``CPUOffloadPolicy``: sharded parameters, gradients and optimizer states on the host."""

    @property
    def shard_group_size(self) -> int:
        """Ranks one parameter is split over."""
        return self.mesh_shape[-1]

    def as_record(self) -> dict[str, object]:
        """The options as the record's environment shows them."""
        return {
            "sharding": self.sharding,
            "mesh_shape": list(self.mesh_shape),
            "mesh_dim_names": list(MESH_DIM_NAMES[-len(self.mesh_shape) :]) if len(self.mesh_shape) > 1 else [],
            "reshard_after_forward": self.reshard_after_forward,
            "param_dtype": self.param_dtype,
            "reduce_dtype": self.reduce_dtype,
            "offload": self.offload,
        }


def fsdp_options(method: MethodConfig, num_gpus: int, num_nodes: int) -> FsdpOptions:
    """FSDP2's options for ``method`` on ``num_gpus`` ranks over ``num_nodes`` nodes; ValueError naming the key
    for what FSDP cannot run (the same rules refuse such cells before submission, in orchestrator.cells.cell)."""
    sharding = method.fsdp_sharding
    if sharding not in SHARDINGS:
        raise ValueError(f"method.fsdp_sharding={sharding!r}: accepted are {', '.join(SHARDINGS)}")
    if method.precision not in ("bf16", "fp32"):
        raise ValueError(f"method.precision={method.precision!r} with method.engine=fsdp: accepted are bf16, fp32")
    if method.fsdp_reduce_precision not in REDUCE_PRECISIONS:
        raise ValueError(
            f"method.fsdp_reduce_precision={method.fsdp_reduce_precision!r}: accepted are {', '.join(REDUCE_PRECISIONS)}"
        )
    if sharding == "hybrid":
        if num_nodes < 2 or num_gpus % num_nodes:
            raise ValueError(
                f"method.fsdp_sharding=hybrid needs num_nodes >= 2 dividing num_gpus (got {num_gpus} GPUs on "
                f"{num_nodes} node(s)); on one node use full"
            )
        mesh: tuple[int, ...] = (num_nodes, num_gpus // num_nodes)
    elif sharding == "none":
        mesh = (num_gpus, 1)
    else:
        mesh = (num_gpus,)
    mixed = method.precision != "fp32"
    # The sharded parameters stay fp32 (the optimizer's master copy); a 16-bit precision is FSDP's compute dtype.
    param_dtype = DTYPES[method.precision] if mixed else None
    reduce_dtype = DTYPES[method.fsdp_reduce_precision]
    return FsdpOptions(
        sharding=sharding,
        mesh_shape=mesh,
        reshard_after_forward=sharding in ("full", "hybrid"),
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype if reduce_dtype != (param_dtype or "float32") else None,
        offload=bool(method.fsdp_offload),
    )
