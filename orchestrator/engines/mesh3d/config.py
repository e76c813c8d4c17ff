"""How a cell's method maps onto a 3-D device mesh: tensor, pipeline and data parallel sizes, the pipeline's
stages and schedule, how the global batch splits, and what the engine refuses.

Pure: nothing here imports torch, so the unit tests check every rule and the refusals run before submission.

The mesh is ``(pp, dp, tp)`` with tensor parallelism innermost, so a tensor-parallel group is ``tp`` consecutive
ranks (one node, one NVLink domain) and pipeline stages are the outermost split (across nodes where there are
several): rank ``r`` is stage ``r // (dp·tp)``, data-parallel replica ``(r // tp) % dp``, tensor rank ``r % tp``.

The batch, as Megatron-LM splits it (Narayanan et al. 2021, §2.2): ``micro_batch_size`` is the sequences of one
pipeline micro-batch; a pipeline schedule runs ``pp_microbatches`` of them (one when ``pp = 1``); the ``dp``
replicas each run their own. One micro-step of the probe is one schedule, so the global batch splits
``dp × pp_microbatches`` ways per micro-step (:attr:`Mesh3dLayout.batch_split`, where a data-parallel engine
splits it ``num_gpus`` ways) and accumulation runs whole schedules, each ending in its own gradient reduction, as
``torch.distributed.pipelining`` does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.choices import PP_SCHEDULES
from orchestrator.config.refusal import Refusal
from orchestrator.engines.mesh3d.pipeline import (
    TORCH_SCHEDULES,
    bubble_share,
    in_flight_stages,
    parse_layers,
    rank_totals,
    schedule_refusals,
    stages_per_rank,
    user_split,
)

if TYPE_CHECKING:
    from orchestrator.config.schema import Config, MethodConfig, ModelConfig

MESH_DIM_NAMES = ("pp", "dp", "tp")
assert set(TORCH_SCHEDULES) == set(PP_SCHEDULES)
_LLAMA_PLAN = {
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}  # fmt: skip
TP_PLANS: dict[str, dict[str, str]] = {
    "gpt_neox": {
        # The fused QKV weight is laid out head by head ([heads, 3·head_dim] rows), so a column split of it
        # gives each rank whole heads, as Megatron's own GPT-NeoX layout intends.
        "attention.query_key_value": "colwise", "attention.dense": "rowwise",
        "mlp.dense_h_to_4h": "colwise", "mlp.dense_4h_to_h": "rowwise",
    },
    "llama": _LLAMA_PLAN,
    "qwen3": _LLAMA_PLAN,  # its q_norm and k_norm act on one head at a time: nothing to split
}  # fmt: skip
"""Per family, each decoder layer's linear layers (paths inside the layer) and how tensor parallelism splits them:
``colwise`` (output features split, the result left local) before ``rowwise`` (input features split, the partial
results all-reduced), Megatron's pairing (Shoeybi et al. 2019, §3)."""
_NORMS = {"input_layernorm": "norm", "post_attention_layernorm": "norm"}
SP_PLANS: dict[str, dict[str, str]] = {
    "gpt_neox": {**_NORMS, "attention": "args", "mlp": "args"},
    "llama": {**_NORMS, "self_attn": "kwargs", "mlp": "args"},
    "qwen3": {**_NORMS, "self_attn": "kwargs", "mlp": "args"},
}
"""Per family, with ``method.tp_sequence_parallel``, each decoder layer's norms (run on the rank's share of the
sequence) and its blocks (their input gathered from the shares: ``args`` the first positional argument, ``kwargs``
``hidden_states`` by name, as the family's layer calls them)."""
assert set(SP_PLANS) == set(TP_PLANS)
TP_UNSPLITTABLE = {
    "olmo2": "OLMo 2 normalises the queries and keys over all heads at once (q_norm, k_norm of width "
    "heads × head_dim), which a tensor-parallel rank holding some of the heads cannot compute; use tp=1",
}
"""Families whose attention tensor parallelism cannot split, and why."""
SPLIT_FAMILIES: tuple[str, ...] = (*TP_PLANS, *TP_UNSPLITTABLE)
"""The families mesh3d builds and splits at all: the dense decoders, made of ``base_model.layers`` with a rotary
embedding and a final norm."""


@dataclass(frozen=True)
class Mesh3dLayout:
    """The mesh, the pipeline and the batch split of one cell."""

    tp: int
    pp: int
    dp: int
    schedule: str
    """``method.pp_schedule``; ``none`` when there is no pipeline."""
    microbatches: int
    """Pipeline micro-batches per schedule (1 without a pipeline)."""
    stages_per_rank: int
    layers: tuple[int, ...] = ()
    """``method.pp_layers``: the decoder layers of each stage, as the user gives them; empty: cost-balanced."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def batch_split(self) -> int:
        """Micro-batches of ``micro_batch_size`` sequences one micro-step of the whole mesh runs: every replica's
        schedule."""
        return self.dp * self.microbatches

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def bubble(self) -> float:
        """The idle share of a schedule on each rank, in theory (``pipeline.bubble_share``): ``(p − 1) / (v·m +
        p − 1)`` for ``m`` micro-batches over ``p`` ranks of ``v`` stages each, less for a zero-bubble schedule; 0
        without a pipeline."""
        return bubble_share(self.pp, self.microbatches, self.stages_per_rank, self.schedule)

    def stage_layers(self, num_layers: int, end_weight: float = 0.0) -> list[range]:
        """The decoder layers of each of the :attr:`num_stages` stages, in order: :attr:`layers` where the user
        gave them, else as :func:`stage_sizes` splits them (``end_weight``: :func:`end_weight` of the model)."""
        starts = [0]
        for size in user_split(self.layers, num_layers, self.num_stages) or stage_sizes(
            num_layers, self.num_stages, end_weight
        ):
            starts.append(starts[-1] + size)
        return [range(a, b) for a, b in zip(starts, starts[1:], strict=False)]

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages pipeline rank ``pp_rank`` holds: ``pp_rank``, then ``pp_rank + pp`` (interleaved, looped)."""
        return [pp_rank + v * self.pp for v in range(self.stages_per_rank)]

    def as_record(self) -> dict[str, object]:
        """The layout as the record's environment shows it."""
        return {
            "mesh_shape": list(self.mesh_shape),
            "mesh_dim_names": list(MESH_DIM_NAMES),
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "pp_schedule": self.schedule,
            "pp_microbatches": self.microbatches,
            "pp_stages": self.num_stages,
            "bubble_predicted": self.bubble,
        }


def stage_sizes(num_layers: int, num_stages: int, end_weight: float = 0.0) -> list[int]:
    """Decoder layers of each pipeline stage, every stage at least one, balanced by cost: a stage costs its layers,
    and the first and the last ``end_weight`` layers more for the input embedding and the output layer they hold.
    The split whose costliest stage costs least (then the most even one); middle stages share what the ends leave,
    the later ones taking the remainder (they keep fewer micro-batches in flight). Layers need not divide evenly:
    BLOOM's 70 layers in 12 stages are 5, ten of 6, 5; Llama 3 405B's 126 in 16 are 7, fourteen of 8, 7."""
    return list(_balanced_sizes(int(num_layers), int(num_stages), max(0.0, float(end_weight))))


@functools.lru_cache(maxsize=65536)
def _balanced_sizes(num_layers: int, num_stages: int, w: float) -> tuple[int, ...]:
    """:func:`stage_sizes`, kept per shape: a layout search asks for the same few splits thousands of times."""
    if num_stages <= 1:
        return (num_layers,)
    if num_stages == 2:
        first = num_layers // 2
        return (first, num_layers - first)
    middle = num_stages - 2
    best: tuple[tuple[float, float], list[int]] | None = None
    top = min(num_layers - middle - 1, -(-num_layers // num_stages) + 1)
    for a in range(1, top + 1):
        for c in range(1, top + 1):
            rest = num_layers - a - c
            if rest < middle:
                continue
            low, extra = divmod(rest, middle)
            sizes = [a, *([low] * (middle - extra)), *([low + 1] * extra), c]
            costs = [a + w, *sizes[1:-1], c + w]
            key = (max(costs), sum(x * x for x in costs))
            if best is None or key < best[0]:
                best = (key, sizes)
    assert best is not None, "num_stages <= num_layers"
    return tuple(best[1])


def stage_costs(num_layers: int, num_stages: int, end_weight: float = 0.0, layers: object = None) -> list[float]:
    """Each stage's cost as :func:`stage_sizes` weighs it: its layers, and ``end_weight`` more at each end; of the
    user's split ``layers`` (``method.pp_layers``) where it fits, else the cost-balanced one."""
    sizes = list(user_split(layers, num_layers, num_stages)) or stage_sizes(num_layers, num_stages, end_weight)
    ends = [1.0 if i in (0, len(sizes) - 1) else 0.0 for i in range(len(sizes))]
    return [
        n + max(0.0, end_weight) * (e + (1.0 if len(sizes) == 1 else 0.0)) for n, e in zip(sizes, ends, strict=True)
    ]


@functools.lru_cache(maxsize=65536)  # a layout search asks for the same few shapes thousands of times
def peak_rank_layers(
    num_layers: int, num_stages: int, end_weight: float = 0.0, per_rank: int = 1, layers: object = None,
    microbatches: int = 1, schedule: str = "1f1b",
) -> float:  # fmt: skip
    """The pipeline rank whose activations peak highest, over the first rank with the mean stage's layers (what
    ``pipeline.in_flight_share`` counts): each rank keeps ``pipeline.in_flight_stages`` stage forwards of its own
    stages (r, r + p, ...; their mean layers) of the split :func:`stage_costs` takes (the user's ``pp_layers``, or
    balanced by cost, the end stages lighter). BLOOM's 70 layers in stages of 5, ten of 6, 5 peak on the second
    rank: 11 forwards of 6 layers against the first rank's 12 of 5. 1 without a pipeline. ``layers`` must be
    hashable (a string, a tuple or None): the answer is kept per shape."""
    stages = num_stages * max(per_rank, 1)
    if num_stages <= 1 or stages > num_layers:
        return 1.0
    sizes = list(user_split(layers, num_layers, stages)) or stage_sizes(num_layers, stages, end_weight)
    first = in_flight_stages(num_stages, microbatches, per_rank, schedule, 0) * num_layers / stages
    peak = max(
        in_flight_stages(num_stages, microbatches, per_rank, schedule, r) * sum(sizes[r::num_stages]) / per_rank
        for r in range(num_stages)
    )
    return peak / first


@functools.lru_cache(maxsize=65536)  # as peak_rank_layers
def pipeline_imbalance(
    num_layers: int, num_stages: int, end_weight: float = 0.0, per_rank: int = 1, layers: object = None
) -> float:
    """The costliest rank over the mean one (1 for a perfectly balanced pipeline) of ``num_stages`` pipeline
    ranks holding ``per_rank`` stages each (looped), split as :func:`stage_costs` says: the slowest rank sets the
    pace of the whole pipeline, so a schedule lasts this many times what an even spread of the work would."""
    stages = num_stages * max(per_rank, 1)
    if num_stages <= 1 or stages > num_layers:
        return 1.0
    costs = rank_totals(stage_costs(num_layers, stages, end_weight, layers), num_stages)
    return max(costs) * len(costs) / sum(costs)


def end_weight(model: ModelConfig) -> float:
    """The input embedding's (or the output layer's) parameters in decoder layers of ``model``: what each end stage
    of a pipeline holds beside its layers (:func:`stage_sizes`)."""
    from orchestrator.models import num_parameters

    vocab = float(model.vocab_size * model.hidden_size)
    per_layer = (float(num_parameters(model)) - 2.0 * vocab) / max(model.num_layers, 1)
    return vocab / per_layer if per_layer > 0 else 0.0


def layout_of(method: MethodConfig, num_gpus: int) -> Mesh3dLayout:
    """The layout of ``method`` on ``num_gpus`` ranks; ValueError naming the key where the sizes do not multiply
    to the GPUs (the refusals of :func:`refusals` say more, before submission)."""
    tp, pp = int(method.tp), int(method.pp)
    if tp < 1 or pp < 1 or num_gpus % (tp * pp):
        raise ValueError(f"method.tp={tp} x method.pp={pp} must divide num_gpus={num_gpus}")
    piped = pp > 1
    return Mesh3dLayout(
        tp=tp,
        pp=pp,
        dp=num_gpus // (tp * pp),
        schedule=method.pp_schedule if piped else "none",
        microbatches=int(method.pp_microbatches) if piped else 1,
        stages_per_rank=stages_per_rank(method.pp_schedule, method.pp_chunks) if piped else 1,
        layers=parse_layers(method.pp_layers) if piped else (),
    )


def refusals(cell: Config) -> list[Refusal]:
    """Why mesh3d cannot run this cell, each naming the key: sizes that do not divide the GPUs, heads or layers,
    tensor parallelism across nodes, a pipeline longer than the layers, a schedule torch cannot run with these
    micro-batches, a family the engine cannot split, fp16 (the batch: :func:`batch_refusals`)."""
    m, model = cell.method, cell.model
    tp, pp = int(m.tp), int(m.pp)
    splits = SPLIT_FAMILIES
    if model.family not in splits:
        return [
            Refusal(
                "method.engine",
                f"mesh3d splits dense decoder-only language models (families {', '.join(splits)}), built of "
                f"base_model.layers with a rotary embedding and a final norm; {model.name} is of family "
                f"{model.family!r}: use method.engine=deepspeed or fsdp",
            )
        ]
    out: list[Refusal] = []
    if cell.num_gpus % (tp * pp):
        return [Refusal("method.tp", f"tp={tp} x pp={pp} = {tp * pp} GPUs must divide num_gpus={cell.num_gpus}")]
    per_node = cell.num_gpus // max(cell.num_nodes, 1)
    if tp > 1 and per_node % tp:
        out.append(
            Refusal(
                "method.tp",
                f"tensor parallelism stays inside a node (its all-reduces run every layer); tp={tp} does not divide "
                f"the {per_node} GPUs of a node: use a tp dividing {per_node}",
            )
        )
    kv_heads = model.num_kv_heads or model.num_heads
    if model.num_heads % tp or kv_heads % tp:
        out.append(
            Refusal(
                "method.tp",
                f"tp={tp} must divide the {model.num_heads} attention heads and {kv_heads} key/value heads of "
                f"{model.name}",
            )
        )
    if tp > 1 and model.family not in TP_PLANS:
        why = TP_UNSPLITTABLE.get(model.family, f"mesh3d has no tensor-parallel plan for family {model.family!r}")
        out.append(Refusal("method.tp", f"{why}; families it splits: {', '.join(TP_PLANS)}"))
    out.extend(_pipeline_refusals(cell))
    out.extend(_loss_parallel_refusals(cell))
    out.extend(checkpoint_and_data_refusals(cell))
    if m.precision == "fp16":
        out.append(
            Refusal(
                "method.precision",
                "fp16 with method.engine=mesh3d needs a sharded gradient scaler, which gpudays does not run; "
                "use bf16 or fp32",
            )
        )
    return out


def batch_refusals(cell: Config) -> list[Refusal]:
    """The global batch that does not split into the data-parallel replicas × pipeline micro-batches of one
    micro-step, or whose share a fixed micro-batch does not divide: mesh3d's batch check (a replica's ranks share
    their sequences, so the GPU count need not divide the batch). Nothing where the layout itself is refused."""
    m, batch = cell.method, cell.model.global_batch_size
    try:
        layout = layout_of(m, cell.num_gpus)
    except ValueError:
        return []  # refused by refusals(), naming method.tp
    out: list[Refusal] = []
    if batch % layout.batch_split:
        out.append(
            Refusal(
                "model.global_batch_size",
                f"{batch} sequences do not split into {layout.dp} data-parallel replicas x "
                f"{layout.microbatches} pipeline micro-batches; use a method.pp_microbatches or a GPU count that "
                "divides it",
            )
        )
    elif isinstance(m.micro_batch_size, int) and (batch // layout.batch_split) % m.micro_batch_size:
        share = batch // layout.batch_split
        out.append(
            Refusal(
                "method.micro_batch_size",
                f"{m.micro_batch_size} does not divide the {share} sequences of a pipeline micro-batch per step "
                f"({batch} / {layout.dp} replicas / {layout.microbatches} micro-batches); use auto or a divisor",
            )
        )
    return out


def _pipeline_refusals(cell: Config) -> list[Refusal]:
    m, layers = cell.method, cell.model.num_layers
    pp = int(m.pp)
    if pp == 1:
        left = {"pp_schedule": "1f1b", "pp_microbatches": 8, "pp_chunks": 2, "pp_layers": None}
        return [
            Refusal(f"method.{key}", f"there is no pipeline with pp=1; leave it at {default if default else 'null'}")
            for key, default in left.items()
            if getattr(m, key) != default
        ]
    per_rank = stages_per_rank(m.pp_schedule, m.pp_chunks)
    stages = pp * per_rank
    if stages > layers:
        return [
            Refusal(
                "method.pp",
                f"{stages} pipeline stages ({m.pp_schedule}, {per_rank} a rank) but {cell.model.name} has {layers} "
                f"layers; use at most {layers // per_rank}",
            )
        ]
    out = []
    k = int(m.pp_microbatches)
    if k < pp:
        out.append(
            Refusal("method.pp_microbatches", f"{k} micro-batches cannot fill {pp} pipeline stages; use at least {pp}")
        )
    return out + schedule_refusals(cell)


def _loss_parallel_refusals(cell: Config) -> list[Refusal]:
    m, model = cell.method, cell.model
    out = []
    for key, what in (("tp_loss_parallel", "the vocabulary"), ("tp_sequence_parallel", "the sequence")):
        if not getattr(m, key):
            continue
        if int(m.tp) == 1:
            out.append(Refusal(f"method.{key}", f"splits {what} over the tensor ranks: needs method.tp > 1"))
            continue
        if int(m.pp) > 1:
            out.append(
                Refusal(
                    f"method.{key}",
                    "torch.distributed.pipelining's stages cannot yet hand on a tensor split over the tensor ranks "
                    "(its schedule stalls on the sharded logits); use method.pp=1 or leave it false",
                )
            )
        if model.tie_word_embeddings:
            out.append(
                Refusal(
                    f"method.{key}",
                    f"{model.name} ties its output layer to the input embedding: one matrix, which the row-parallel "
                    "embedding (split over the vocabulary, as both settings need) and the output layer would each "
                    "split; leave it false",
                )
            )
    return out


SELECTIVE_SAVED_OPS = (
    "aten.mm", "aten.addmm", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", "_c10d_functional.reduce_scatter_tensor",
    "_c10d_functional.all_reduce",
)  # fmt: skip
"""The operators whose outputs ``checkpoint_policy=selective`` keeps (torchtitan's choice, every matrix product
kept): the matrix products, attention, and the tensor-parallel reductions (not rerun in the backward); everything
else of a layer is recomputed."""


def data_mesh(layout: Mesh3dLayout, dp_replicate: int) -> tuple[int, ...]:
    """The data-parallel mesh FSDP2 shards over: ``(dp,)``, or ``(dp_replicate, dp / dp_replicate)`` with HSDP
    (replicated across the first dimension, sharded over the second)."""
    r = max(int(dp_replicate), 1)
    return (layout.dp,) if r == 1 else (r, layout.dp // r)


def checkpoint_and_data_refusals(cell: Config) -> list[Refusal]:
    """``checkpoint_policy`` without checkpointing, and a ``dp_replicate`` that does not divide the replicas."""
    m = cell.method
    out = []
    if m.checkpoint_policy != "full" and not m.activation_checkpointing:
        out.append(
            Refusal(
                "method.checkpoint_policy",
                f"{m.checkpoint_policy} says what activation checkpointing recomputes, and this cell checkpoints "
                "nothing; add method.activation_checkpointing=true or leave it at full",
            )
        )
    r, tp, pp = int(m.dp_replicate), int(m.tp), int(m.pp)
    if r > 1 and tp * pp > 0 and cell.num_gpus % (tp * pp) == 0 and (cell.num_gpus // (tp * pp)) % r:
        dp = cell.num_gpus // (tp * pp)
        out.append(
            Refusal(
                "method.dp_replicate",
                f"{r} replica groups do not divide the {dp} data-parallel replicas (num_gpus={cell.num_gpus} / "
                f"tp={tp} / pp={pp}); use a divisor of {dp}, such as the number of nodes",
            )
        )
    return out
