"""PyTorch FSDP2 as the probe's engine: ``fully_shard`` on every block of the model (its family's ``blocks``: the transformer layers of a
language model, the stages of a ConvNeXt) and then on the root module, with
the method's sharding, mixed-precision policy, CPU offload and activation checkpointing, optionally each layer
``torch.compile``-d; PyTorch's AdamW with DeepSpeed's hyper-parameters, gradients clipped at norm 1. The model is
built on the meta device and sharded there; each rank then allocates and initialises only its shards, as the
unsplit model's (orchestrator/engines/materialising.py).

Gradient accumulation as ``method.fsdp_accumulation`` says: ``sharded`` (FSDP2's default) reduce-scatters every
micro-batch's gradients and accumulates each rank's shard; ``unsharded`` runs the micro-steps inside the cycle with
``set_requires_gradient_sync(False)`` (gradients accumulate whole, no reduce-scatter) and the boundary micro-step
reduces them. The boundary micro-step clips, steps the optimizer and zeroes the gradients. The loss is divided by the accumulation count, so the step is that of the
mean over the whole batch, as DeepSpeed's. ``resize`` only changes that count: FSDP's forward takes any batch size.

Process group: NCCL on CUDA, gloo on the CPU (FSDP2's collectives run on gloo there, one process per "GPU").
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from orchestrator.config.schema import compile_scope_of
from orchestrator.engines.base import ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, WEIGHT_DECAY, free_device_memory
from orchestrator.engines.compiling import compile_regions
from orchestrator.engines.fsdp.config import MESH_DIM_NAMES, FsdpOptions, fsdp_options
from orchestrator.engines.fsdp.memory import estimate_micro_batch_size
from orchestrator.engines.materialising import build_meta
from orchestrator.models import enable_activation_checkpointing, family_module, implementation

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from orchestrator.config.batch import BatchPlan
    from orchestrator.config.schema import Config


class FsdpEngine:
    """The FSDP2 engine of one rank (see ``orchestrator.engines.base.Engine`` for the protocol)."""

    def __init__(self, config: Config, device: torch.device, rank: int) -> None:
        self.config = config
        self.device = device
        self.rank = rank
        self.options: FsdpOptions = fsdp_options(config.method, config.num_gpus, config.num_nodes)
        self.module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.grad_accum_steps = 1
        self._num_parameters = 0

    def init_distributed(self, timeout: timedelta) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        if self.device.type == "cuda":
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
        else:
            dist.init_process_group("gloo", timeout=timeout)

    def preload(self) -> None:
        import torch.distributed.fsdp  # noqa: F401
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401

        family_module(self.config.model.family).build_model_config(self.config.model, self.config.method.attention)

    def _mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        shape = self.options.mesh_shape
        names = MESH_DIM_NAMES[-len(shape) :] if len(shape) > 1 else ("shard",)
        return init_device_mesh(self.device.type, shape, mesh_dim_names=names)

    def build(self, plan: BatchPlan) -> None:
        import torch
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        self.release()
        method, opts = self.config.method, self.options
        # Built without storage and materialised after sharding: a rank allocates only its shards, initialised
        # as the unsplit model's (orchestrator/engines/materialising.py). fp32 weights: the sharded parameters are
        # the optimizer's master copy; mp_policy casts for compute.
        torch.manual_seed(self.config.probe.seed)  # the same random state on every rank
        module, meta = build_meta(self.config)
        self._num_parameters = sum(p.numel() for p in module.parameters())
        if method.activation_checkpointing:
            enable_activation_checkpointing(module)
        module.train()
        mp_policy = MixedPrecisionPolicy(
            param_dtype=getattr(torch, opts.param_dtype) if opts.param_dtype else None,
            reduce_dtype=getattr(torch, opts.reduce_dtype) if opts.reduce_dtype else None,
        )
        offload = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if opts.offload else OffloadPolicy()
        mesh = self._mesh()
        blocks = family_module(self.config.model.family).blocks(module)
        if method.compile:
            compile_regions(module, blocks)  # before wrapping: FSDP's hooks stay outside the compiled graphs
        for layer in blocks:
            fully_shard(
                layer,
                mesh=mesh,
                reshard_after_forward=opts.reshard_after_forward,
                mp_policy=mp_policy,
                offload_policy=offload,
            )
        # The root (embeddings, final norm, output layer) is needed again right at the start of the backward.
        fully_shard(module, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy, offload_policy=offload)
        # Offloaded shards live on the host (CPUOffloadPolicy); the rest on the rank's device.
        meta.materialise([module], torch.device("cpu") if opts.offload else self.device, self.config.probe.seed)
        self.module = module
        self.optimizer = torch.optim.AdamW(
            module.parameters(),
            lr=float(self.config.model.lr),
            betas=ADAM_BETAS,
            eps=ADAM_EPS,
            weight_decay=WEIGHT_DECAY,
        )
        self.grad_accum_steps = plan.grad_accum_steps

    def estimate_micro_batch_size(self, memory_gib: float) -> int:
        return estimate_micro_batch_size(self.config, memory_gib)

    def resize(self, plan: BatchPlan) -> None:
        self.grad_accum_steps = plan.grad_accum_steps

    def micro_step(self, batch: Mapping[str, torch.Tensor], boundary: bool) -> torch.Tensor:
        import torch
        from torch.distributed.fsdp import FSDPModule

        module, optimizer = self.module, self.optimizer
        # (not None first: mypy narrows a Module, not an Optional one, to the FSDPModule fully_shard made of it)
        assert module is not None and isinstance(module, FSDPModule), "build() shards the model"
        assert optimizer is not None, "build() makes the optimizer"
        if self.config.method.fsdp_accumulation == "unsharded":
            module.set_requires_gradient_sync(boundary)  # reduce only at the accumulation boundary
        loss: torch.Tensor = module(**batch).loss
        # The mean over the whole batch: each micro-batch's share of the accumulated gradient.
        (loss / self.grad_accum_steps).backward()  # type: ignore[no-untyped-call]
        if boundary:
            torch.nn.utils.clip_grad_norm_(module.parameters(), GRADIENT_CLIPPING)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    def release(self) -> None:
        self.module, self.optimizer = None, None
        free_device_memory(self.device)

    @property
    def num_parameters(self) -> int:
        return self._num_parameters

    @property
    def skipped_steps(self) -> int:
        return 0  # no loss scaling (fp16 is refused with FSDP), so no step is skipped

    def describe(self) -> dict[str, object]:
        import torch

        return {
            "engine": "fsdp",
            "fsdp": {
                **self.options.as_record(),
                "api": "torch.distributed.fsdp.fully_shard",
                "torch": torch.__version__,
            },
            "compiled": bool(self.config.method.compile),
            "compile_scope": compile_scope_of(vars(self.config.method)),
            "model_implementation": implementation(self.config.model, self.module) if self.module is not None else {},
        }


def create(config: Config, device: torch.device, rank: int) -> FsdpEngine:
    """The engine ``orchestrator.engines.base.create_engine`` returns for ``method.engine: fsdp``."""
    return FsdpEngine(config, device, rank)
