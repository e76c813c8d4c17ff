"""Tensor, pipeline and FSDP2 data parallelism on one device mesh, as the probe's engine (``method.engine=mesh3d``).

Why the torch APIs on the families' transformers modules, not torchtitan. torchtitan composes the same APIs
(``torch.distributed.tensor.parallel``, ``torch.distributed.pipelining``, ``fully_shard`` on a DeviceMesh) and its
MFU accounting is what many groups report, so its layouts are the ones to be faithful to, and they are: the mesh
order (pipeline outermost, tensor innermost), the column/row-parallel pairing of each layer, FSDP2 over the
replicas with no resharding between pipeline micro-batches, 1F1B and interleaved 1F1B are torchtitan's choices.
But torchtitan trains its own model implementations (Llama 3/4, DeepSeek, Qwen3), not the transformers modules
every other engine of gpudays measures, so a mesh3d cell would measure a different model than the DeepSpeed and
FSDP cells beside it, and the GPT-NeoX (Pythia) and OLMo families have no torchtitan model at all; it is also not
on PyPI (installed from git, its config system rewritten in 2026), a heavier and less stable dependency than
torch itself. Applying the APIs to the same modules keeps one model per cell across engines, every family that
splits, and only torch to maintain. torchtitan's vocabulary-parallel embedding, output layer and loss are
``method.tp_loss_parallel``, its sequence parallelism ``method.tp_sequence_parallel``
(``parallelize.apply_tensor_parallel``, both without a pipeline for now); what it adds beyond (context
parallelism, float8) is left out and said where it matters (config.py, memory.py).

One rank, for the layout of ``config.layout_of``: the model is built on the meta device (no storage), split into
the stages of its pipeline rank (``parallelize.split_stages``), each decoder layer split over the tensor ranks,
then every layer and stage sharded by FSDP2 over the replicas, in the policy's precision; only then does the rank
allocate and initialise its shards, as the unsplit model's (orchestrator/engines/materialising.py). Without a pipeline a
micro-step is one forward and backward of ``micro_batch_size`` sequences; with one it is a schedule of
``pp_microbatches`` micro-batches of that size (``pipeline.TORCH_SCHEDULES``: 1F1B, interleaved 1F1B or interleaved
zero bubble, with ``pp_chunks`` stages a rank and the layers of ``pp_layers`` where given), which reduces
the gradients at its end. At the boundary the gradients are clipped to a global norm and AdamW steps.

Every rank of a replica must see the same sequences (tensor ranks the same input, the last stage the first's
labels), so the engine draws its tokens from the replica's index instead of taking each rank's batch.

The bubble: each rank times its stages' forward and backward chunks inside every schedule; its measured bubble
is the rest of the schedule's time (waiting for the neighbours, sends and receives), as a share, over the steps
since the micro-batch was last set. The record shows rank 0's (the first stage) beside the layout's prediction.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

from orchestrator.config.schema import compile_scope_of
from orchestrator.engines.base import ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, WEIGHT_DECAY, free_device_memory
from orchestrator.engines.compiling import compile_blocks, compiled_loss
from orchestrator.engines.materialising import build_meta
from orchestrator.engines.mesh3d.config import SP_PLANS, TP_PLANS, Mesh3dLayout, data_mesh, end_weight, layout_of
from orchestrator.engines.mesh3d.memory import estimate_micro_batch_size
from orchestrator.models import enable_activation_checkpointing, family_module
from orchestrator.models.probe_data import DATA_BATCHES, seed_of

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

    from orchestrator.config.batch import BatchPlan
    from orchestrator.config.schema import Config
    from orchestrator.engines.mesh3d.parallelize import Stage

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
DATA_DIMS: tuple[tuple[str, ...], ...] = (("dp",), ("dp_replicate", "dp_shard"))
"""The data-parallel dimensions of the mesh: one, or two with HSDP (``config.data_mesh``)."""


class Mesh3dEngine:
    """The mesh3d engine of one rank (see ``orchestrator.engines.base.Engine`` for the protocol)."""

    def __init__(self, config: Config, device: torch.device, rank: int) -> None:
        self.config = config
        self.device = device
        self.rank = rank
        self.layout: Mesh3dLayout = layout_of(config.method, config.num_gpus)
        self.mesh: DeviceMesh | None = None
        self.stages: list[tuple[int, Stage]] = []
        self.schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.tokens: list[torch.Tensor] = []
        self.grad_accum_steps = 1
        self.next_token_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = next_token_loss
        self.steps = 0
        self._num_parameters = 0
        self.busy_s = 0.0
        self.schedule_s = 0.0

    @property
    def batch_split(self) -> int:
        """Ways the global batch splits per micro-step (``config.Mesh3dLayout.batch_split``)."""
        return self.layout.batch_split

    def coordinates(self) -> tuple[int, int, int]:
        """This rank's (pipeline, data, tensor) coordinates in the mesh."""
        lay = self.layout
        return self.rank // (lay.dp * lay.tp), (self.rank // lay.tp) % lay.dp, self.rank % lay.tp

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
        import torch.distributed.pipelining  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
        import transformers.masking_utils  # noqa: F401

        family_module(self.config.model.family).build_model_config(self.config.model, self.config.method.attention)

    def build(self, plan: BatchPlan) -> None:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from orchestrator.engines.mesh3d.parallelize import (
            apply_fsdp,
            apply_tensor_parallel,
            model_parts,
            selective_checkpointing,
            split_stages,
        )

        self.release()
        cfg, lay = self.config, self.layout
        method = cfg.method
        if method.precision not in DTYPES:
            raise ValueError(f"method.precision={method.precision!r} with method.engine=mesh3d: use bf16 or fp32")
        if self.mesh is None:
            shape, names = self._mesh_shape_and_names()
            self.mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        # Built without storage; each rank materialises only its stages' shards, initialised as the unsplit
        # model's (orchestrator/engines/materialising.py).
        torch.manual_seed(cfg.probe.seed)  # the same random state on every rank
        module, meta = build_meta(cfg)
        self._num_parameters = sum(p.numel() for p in module.parameters())
        if method.activation_checkpointing:
            selective = method.checkpoint_policy == "selective"
            enable_activation_checkpointing(module, selective_checkpointing() if selective else None)
        module.train()
        pp_rank, _, _ = self.coordinates()
        stages = split_stages(module, lay, pp_rank, cfg.model.num_layers, end_weight(cfg.model))
        embed, _, _, head, _ = model_parts(module)
        mixed = method.precision != "fp32"
        mp_policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if mixed else None, reduce_dtype=torch.float32 if mixed else None
        )
        for _, stage in stages:
            if lay.tp > 1:
                sequence = SP_PLANS[cfg.model.family] if method.tp_sequence_parallel else None
                tp_plan = TP_PLANS[cfg.model.family]
                apply_tensor_parallel(stage, tp_plan, self.mesh["tp"], method.tp_loss_parallel, sequence)
            if method.compile:
                compile_blocks(stage.layers)
            apply_fsdp(stage, self.mesh[DATA_DIMS[self.mesh.ndim - 3]], mp_policy, pipelined=lay.pp > 1)
            if stage.head is not None and stage.head is not head:
                meta.adopt(stage.head, embed)  # the last stage's copy of a tied layer
        meta.materialise([stage for _, stage in stages], self.device, cfg.probe.seed)
        self.stages = stages
        # The sharded logits' loss is loss_parallel's own operators: left to eager.
        compiled = method.compile and not method.tp_loss_parallel
        self.next_token_loss = compiled_loss(next_token_loss) if compiled else next_token_loss
        params = [p for _, stage in stages for p in stage.parameters()]
        self.optimizer = torch.optim.AdamW(
            params, lr=float(cfg.model.lr), betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY
        )
        self.resize(plan)

    def _mesh_shape_and_names(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The device mesh: ``(pp, dp, tp)``, or with HSDP ``(pp, dp_replicate, dp_shard, tp)``."""
        lay = self.layout
        data = data_mesh(lay, self.config.method.dp_replicate)
        names = DATA_DIMS[len(data) - 1]
        return (lay.pp, *data, lay.tp), ("pp", *names, "tp")

    def estimate_micro_batch_size(self, memory_gib: float) -> int:
        return estimate_micro_batch_size(self.config, memory_gib)

    def resize(self, plan: BatchPlan) -> None:
        """Micro-batches of ``plan.micro_batch_size`` sequences from now on: new tokens and, with a pipeline, a
        new schedule (its stages infer their shapes from the first micro-batch)."""
        import torch

        self.grad_accum_steps = plan.grad_accum_steps
        lay, model = self.layout, self.config.model
        _, dp_rank, _ = self.coordinates()
        generator = torch.Generator().manual_seed(seed_of(self.config, dp_rank))
        rows = plan.micro_batch_size * lay.microbatches
        self.tokens = [
            torch.randint(0, model.vocab_size, (rows, model.seq_length), generator=generator).to(self.device)
            for _ in range(DATA_BATCHES)
        ]
        self.steps, self.busy_s, self.schedule_s = 0, 0.0, 0.0
        if lay.pp > 1:
            self.schedule = self._schedule()

    def _loss(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # Each micro-batch's share of the accumulated step.
        loss: torch.Tensor = self.next_token_loss(logits, tokens)
        return loss / self.grad_accum_steps

    def _schedule(self) -> PipelineScheduleSingle | PipelineScheduleMulti:
        from orchestrator.engines.mesh3d.parallelize import build_schedule

        stages, schedule = build_schedule(self.stages, self.layout, self._pp_group(), self.device, self._loss)
        for stage in stages:
            self._time_chunks(stage)
        return schedule

    def _time_chunks(self, stage: PipelineStage) -> None:
        """Count the time ``stage`` computes (its forward and backward chunks, and the weight gradients a
        zero-bubble schedule computes apart) into :attr:`busy_s`."""
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            inner = getattr(stage, name)

            def timed(*args: object, _inner: Callable[..., object] = inner, **kwargs: object) -> object:
                began = time.perf_counter()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    self.busy_s += time.perf_counter() - began

            setattr(stage, name, timed)

    def micro_step(self, batch: torch.Tensor, boundary: bool) -> torch.Tensor:
        import torch

        from orchestrator.engines.mesh3d.parallelize import loss_context

        tokens = self.tokens[self.steps % len(self.tokens)]
        self.steps += 1
        if self.layout.pp == 1:
            from torch.distributed.fsdp import FSDPModule

            ((_, stage),) = self.stages
            assert isinstance(stage, FSDPModule), "build() shards the stage (apply_fsdp)"
            stage.set_requires_gradient_sync(boundary)  # reduce only at the accumulation boundary
            with loss_context(self.config.method.tp_loss_parallel):
                loss = self._loss(stage(tokens), tokens)
                loss.backward()  # type: ignore[no-untyped-call]
            loss = loss.detach() * self.grad_accum_steps
        else:
            loss = self._pipeline_step(tokens)
        if boundary:
            self._optimizer_step()
            if self.layout.pp > 1:  # the last stage has the loss: every rank reports it
                torch.distributed.broadcast(loss, src=self._last_stage_rank(), group=self._pp_group())
        return loss

    def _pipeline_step(self, tokens: torch.Tensor) -> torch.Tensor:
        import torch

        from orchestrator.engines.mesh3d.parallelize import loss_context

        pp_rank, _, _ = self.coordinates()
        first, last = pp_rank == 0, pp_rank == self.layout.pp - 1
        losses: list[torch.Tensor] = []
        began = time.perf_counter()
        args = (tokens,) if first else ()
        assert self.schedule is not None, "resize() makes the schedule of a pipeline"
        with loss_context(self.config.method.tp_loss_parallel):
            self.schedule.step(*args, target=tokens if last else None, losses=losses if last else None)
        self.schedule_s += time.perf_counter() - began
        if losses:
            return torch.stack([x.detach() for x in losses]).mean() * self.grad_accum_steps
        return torch.full((), float("nan"), device=self.device)

    def _last_stage_rank(self) -> int:
        import torch.distributed as dist

        return dist.get_global_rank(self._pp_group(), self.layout.pp - 1)

    def _pp_group(self) -> ProcessGroup:
        """The pipeline's process group, of the mesh ``build`` made."""
        assert self.mesh is not None, "build() makes the mesh"
        return self.mesh.get_group("pp")

    def _optimizer_step(self) -> None:
        from orchestrator.engines.mesh3d.parallelize import clip_grad_norm

        params = [p for _, stage in self.stages for p in stage.parameters()]
        clip_grad_norm(params, GRADIENT_CLIPPING, self._pp_group() if self.layout.pp > 1 else None)
        assert self.optimizer is not None, "build() makes the optimizer"
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def measured_bubble(self) -> float | None:
        """This rank's idle share of its schedules since the micro-batch was last set; None without a pipeline
        or before a schedule ran."""
        if self.layout.pp == 1 or self.schedule_s <= 0:
            return None
        return max(0.0, 1.0 - self.busy_s / self.schedule_s)

    def release(self) -> None:
        self.stages, self.schedule, self.optimizer, self.tokens = [], None, None, []
        free_device_memory(self.device)

    @property
    def num_parameters(self) -> int:
        return self._num_parameters

    @property
    def skipped_steps(self) -> int:
        return 0  # no loss scaling (fp16 is refused), so no step is skipped

    def describe(self) -> dict[str, object]:
        import torch

        return {
            "engine": "mesh3d",
            "mesh3d": {
                **self.layout.as_record(),
                "bubble_measured": self.measured_bubble,
                "bubble_measured_on": "rank 0 (first stage): idle share of its schedules over the timed steps",
                "fsdp": "fully_shard over dp, no resharding between pipeline micro-batches"
                if self.layout.pp > 1
                else "fully_shard over dp",
                "data_mesh": list(data_mesh(self.layout, self.config.method.dp_replicate)),
                "checkpoint_policy": self.config.method.checkpoint_policy
                if self.config.method.activation_checkpointing
                else None,
                "torch": torch.__version__,
            },
            "compiled": bool(self.config.method.compile),
            "compile_scope": compile_scope_of(vars(self.config.method)),
        }


def create(config: Config, device: torch.device, rank: int) -> Mesh3dEngine:
    """The engine ``orchestrator.engines.base.create_engine`` returns for ``method.engine: mesh3d``."""
    return Mesh3dEngine(config, device, rank)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss in fp32 (with ``compile``, a region of its own: the cast and the log-softmax fused)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
