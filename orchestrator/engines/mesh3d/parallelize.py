"""Splitting a family's transformers module for mesh3d: pipeline stages, tensor parallelism, FSDP2.

A stage is a :class:`Stage`: some of the module's decoder layers, with the input embedding on the first stage and
the final norm and output layer on the last; it runs the layers as the family's own ``forward`` does (rotary
position embeddings and the causal mask computed once per stage). Every family gpudays builds has the same parts
(``get_input_embeddings``, ``base_model.layers``, ``base_model.rotary_emb``, a final norm, ``get_output_embeddings``),
so one class serves them all; a family without them is refused when the engine builds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.tensor.parallel import ParallelStyle
    from transformers import PreTrainedConfig

    from orchestrator.engines.mesh3d.config import Mesh3dLayout
    from orchestrator.models import CheckpointContexts


class Stage(nn.Module):
    """One pipeline stage of a decoder-only transformers model (all of it when there is one stage)."""

    def __init__(
        self, config: PreTrainedConfig, embed: nn.Module | None, layers: list[nn.Module], norm: nn.Module | None,
        head: nn.Module | None, rotary: nn.Module,
    ) -> None:  # fmt: skip
        super().__init__()
        self.config = config
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.head = head
        self.rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        h = self.embed(x) if self.embed is not None else x
        # With sequence parallelism h is this rank's share of the sequence: the positions are the whole one's.
        seq = x.shape[1] if self.embed is not None else h.shape[1]
        position_ids = torch.arange(seq, device=h.device).unsqueeze(0)
        shape = h.new_empty((h.shape[0], seq, 1)) if seq != h.shape[1] else h
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=shape,
            attention_mask=None,
            past_key_values=None,
            position_ids=position_ids,
        )
        position_embeddings = self.rotary(h, position_ids=position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
        if self.head is not None:
            assert self.norm is not None
            h = self.head(self.norm(h))
        return h


def model_parts(module: Any) -> tuple[Any, list[nn.Module], nn.Module, Any, nn.Module]:
    """The input embedding, decoder layers, final norm, output layer and rotary embedding of a family's transformers
    model; a ValueError where it has no ``base_model.layers``, final norm or ``rotary_emb``."""
    base = getattr(module, "base_model", None)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None) or getattr(base, "final_layer_norm", None)
    rotary = getattr(base, "rotary_emb", None)
    if base is None or layers is None or norm is None or rotary is None:
        raise ValueError(
            f"{type(module).__name__} has no base_model.layers, final norm and rotary_emb: mesh3d cannot split it "
            "into pipeline stages"
        )
    return module.get_input_embeddings(), list(layers), norm, module.get_output_embeddings(), rotary


def split_stages(
    module: Any, layout: Mesh3dLayout, pp_rank: int, num_layers: int, end_weight: float = 0.0
) -> list[tuple[int, Stage]]:
    """The stages pipeline rank ``pp_rank`` runs, with their indices, the layers split as
    ``Mesh3dLayout.stage_layers`` balances them (``end_weight``: ``config.end_weight`` of the model, the end stages'
    vocabulary matrices in layers). A model whose output layer shares the input
    embedding's matrix gets a copy of it on the last stage, as Megatron-LM keeps one on each end of the pipeline
    (Megatron also all-reduces the two copies' gradients; this probe leaves that one reduction out)."""
    embed, layers, norm, head, rotary = model_parts(module)
    split = layout.stage_layers(num_layers, end_weight)
    last = layout.num_stages - 1
    out = []
    for index in layout.stages_of(pp_rank):
        tail = head
        if index == last and layout.num_stages > 1 and head.weight is embed.weight:
            # Made where the model is (the meta device before materialising: no storage here).
            tail = nn.Linear(head.in_features, head.out_features, bias=False, device=head.weight.device)
            tail.weight = nn.Parameter(head.weight.detach().clone())
        stage = Stage(
            module.config,
            embed if index == 0 else None,
            [layers[i] for i in split[index]],
            norm if index == last else None,
            tail if index == last else None,
            rotary,
        )
        out.append((index, stage))
    return out


def build_schedule(
    stages: Sequence[tuple[int, nn.Module]], layout: Mesh3dLayout, group: ProcessGroup, device: torch.device,
    loss_fn: Callable[..., torch.Tensor],
) -> tuple[list[PipelineStage], PipelineScheduleSingle | PipelineScheduleMulti]:  # fmt: skip
    """This rank's ``PipelineStage`` of each of ``stages`` (index, module) over the pipeline ``group``, and the schedule
    of the layout's ``pp_schedule`` that runs them, ``loss_fn`` on the last stage's output."""
    from torch.distributed.pipelining import PipelineStage, schedules

    from orchestrator.engines.mesh3d.pipeline import INTERLEAVED, TORCH_SCHEDULES

    piped = [PipelineStage(s, i, layout.num_stages, device, group=group) for i, s in stages]
    kind = getattr(schedules, TORCH_SCHEDULES[layout.schedule])
    return piped, kind(piped if layout.schedule in INTERLEAVED else piped[0], layout.microbatches, loss_fn=loss_fn)


def apply_tensor_parallel(
    stage: Stage, plan: dict[str, str], tp_mesh: DeviceMesh, loss_parallel: bool = False,
    sequence: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Split every decoder layer of ``stage`` over ``tp_mesh`` by ``plan`` (``config.TP_PLANS``): column-parallel
    layers hand their local shard on, row-parallel ones all-reduce, so the residual stream stays whole on each rank.

    ``loss_parallel`` (``method.tp_loss_parallel``) splits the vocabulary too, as Megatron-LM and torchtitan do: the
    input embedding row-parallel (each rank looks up the tokens of its share of the vocabulary, the partial results
    all-reduced) and the output layer column-parallel, its logits left sharded over the vocabulary for the loss
    (:func:`loss_context`), so no rank holds a whole vocabulary matrix or the whole logits.

    ``sequence`` (``config.SP_PLANS``, where ``method.tp_sequence_parallel``): sequence parallelism, as
    torchtitan and Megatron-LM run it (Korthikanti et al. 2022): between the tensor-parallel blocks the residual
    stream, the norms and the dropouts hold one share of the sequence on each rank; a block's input is all-gathered
    before it and its row-parallel output reduce-scattered after it, which moves the same bytes as the all-reduce
    it replaces. The embedding is then always row-parallel, handing on its share of the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in stage.layers:
        layer_plan: dict[str, ParallelStyle] = {}
        for path, kind in plan.items():
            split = sequence is not None and kind == "rowwise"
            layer_plan[path] = RowwiseParallel(output_layouts=Shard(1)) if split else styles[kind]()
        if sequence is not None:
            layer_plan.update({path: _sequence_style(how) for path, how in sequence.items()})
        parallelize_module(layer, tp_mesh, layer_plan)
    if not loss_parallel and sequence is None:
        return
    whole = Replicate() if sequence is None else Shard(1)
    ends: dict[str, ParallelStyle] = {}
    if stage.embed is not None:
        ends["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=whole)
    if stage.norm is not None and sequence is not None:
        ends["norm"] = SequenceParallel()
    if stage.head is not None:
        logits = Shard(-1) if loss_parallel else Replicate()
        ends["head"] = ColwiseParallel(input_layouts=whole, output_layouts=logits, use_local_output=not loss_parallel)
    if ends:
        parallelize_module(stage, tp_mesh, ends)


def _sequence_style(how: str) -> ParallelStyle:
    """``norm``: a norm over the rank's share of the sequence; ``args``/``kwargs``: a block whose input
    (positional, or ``hidden_states`` by name) is gathered from the shares before it runs."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    if how == "norm":
        return SequenceParallel()
    if how == "kwargs":
        return PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        )
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def loss_context(loss_parallel: bool) -> AbstractContextManager[None]:
    """Where the loss and its backward run: ``torch.distributed.tensor.parallel.loss_parallel`` when the logits
    are sharded over the vocabulary (each rank's log-softmax over its share, two small all-reduces for the
    maximum and the sum), else nothing."""
    from torch.distributed.tensor.parallel import loss_parallel as parallel

    return parallel() if loss_parallel else nullcontext()


def selective_checkpointing() -> CheckpointContexts:
    """The ``context_fn`` of ``torch.utils.checkpoint`` that keeps the outputs of ``config.SELECTIVE_SAVED_OPS``
    (the matrix products, attention, the tensor-parallel reductions) and recomputes every other operator of a
    checkpointed layer in the backward: ``method.checkpoint_policy=selective``."""
    from functools import partial

    from torch._ops import OpOverload
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        SelectiveCheckpointContext,
        create_selective_checkpoint_contexts,
    )

    from orchestrator.engines.mesh3d.config import SELECTIVE_SAVED_OPS

    saved = set()
    for name in SELECTIVE_SAVED_OPS:
        namespace, op = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:  # an attention kernel this build lacks
            saved.add(packet.default)

    def policy(ctx: SelectiveCheckpointContext, op: OpOverload, *args: object, **kwargs: object) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return partial(create_selective_checkpoint_contexts, policy)


def apply_fsdp(stage: Stage, dp_mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy, pipelined: bool) -> None:
    """FSDP2 over the data-parallel replicas: each layer, then the stage. With a pipeline nothing is resharded
    between micro-batches (each would gather the stage again), as torchtitan does. A 2-D ``dp_mesh`` (replicas ×
    shards, ``method.dp_replicate``) is HSDP: sharded over its second dimension, replicated over its first."""
    from torch.distributed.fsdp import fully_shard

    for layer in stage.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=not pipelined)
    fully_shard(stage, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=False)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, pp_group: ProcessGroup | None) -> torch.Tensor:
    """Clip the gradients of every rank's share to a global norm of ``max_norm``: the norm of each group of
    DTensor gradients on one mesh (tensor and data shards reduced by DTensor), summed over the pipeline stages."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    groups: dict[tuple[int, str], list[torch.Tensor]] = {}
    for g in grads:
        key = (id(g.device_mesh), str(g.placements)) if isinstance(g, DTensor) else (0, "")
        groups.setdefault(key, []).append(g)
    total_sq = torch.zeros((), dtype=torch.float32, device=grads[0].device if grads else "cpu")
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float() ** 2
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    total = total_sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype) if not isinstance(g, DTensor) else coef.item())
    return total
