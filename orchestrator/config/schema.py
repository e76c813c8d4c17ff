"""Typed schemas for every config group (``orchestrator.planning`` registers them in Hydra's ConfigStore).

Each YAML file under ``conf/<group>/`` names its schema in its defaults list (``- /schema/<group>@_here_``), so a
misspelt key or a value of the wrong type fails when the config is composed, on the user's machine, not on the
cluster an hour later. Cross-field rules that need more than one group (bf16 on a V100, ZeRO on one GPU) live in
``orchestrator.cells.cell``, where a cell is judged as a whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from orchestrator.config import choices
from orchestrator.config.domains import domain
from orchestrator.config.values import Container, Scalar

MISSING: Any = "???"
"""omegaconf's MISSING (its value, so that this module loads without omegaconf): a field a config file must set."""

NAME = domain(pattern=r"[A-Za-z0-9_][A-Za-z0-9_.-]*", pattern_text="a name of letters, digits and _ . -")
"""Names that become folder names, job names and table keys."""


@dataclass
class ModelConfig:
    """A model (a language model or an image classifier) and the training run it stands for (the run whose time
    we estimate).

    The architecture fields after ``vocab_size`` default to what every Pythia (GPT-NeoX) model has, so a
    ``conf/model`` file names only what differs from that; which of them a family reads is said in its module.
    """

    name: str = field(default=MISSING, metadata=NAME)
    """Short name used in tables and cell folders, e.g. ``pythia-1b``."""
    family: str = "gpt_neox"
    """The architecture family, a module under ``orchestrator/models/``: ``gpt_neox`` (Pythia), ``llama``
    (SmolLM2, Llama 3.2), ``qwen3``, ``olmo2``, ``roberta`` (masked-language encoder), ``mamba`` (state space),
    ``olmoe`` and ``mixtral`` (mixtures of experts), ``vit`` and ``convnext`` (image classifiers)."""
    num_layers: int = field(default=MISSING, metadata=domain(ge=1, integer=True))
    hidden_size: int = field(default=MISSING, metadata=domain(ge=1, integer=True))
    num_heads: int = field(default=MISSING, metadata=domain(ge=1, integer=True))
    """Query heads."""
    vocab_size: int = field(default=MISSING, metadata=domain(ge=1, integer=True))
    """Padded vocabulary size, as in the model's published config."""
    intermediate_size: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """MLP width; ``None`` means 4 × hidden_size, as in every Pythia model (the other families require it)."""
    rotary_pct: float = field(default=0.25, metadata=domain(ge=0, le=1))
    """Fraction of each head's dimensions that get rotary position embeddings (1.0 for the Llama-style families)."""
    num_kv_heads: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Key/value heads of grouped-query attention; ``None`` means one per query head (multi-head attention).
    This and the fields below up to ``norm_eps`` are read by the llama, qwen3 and olmo2 families."""
    head_dim: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Width of one attention head; ``None`` means hidden_size / num_heads (Qwen3 sets 128 for every size)."""
    tie_word_embeddings: bool = False
    """The output projection shares the input embedding's matrix (one V×h matrix instead of two)."""
    rope_theta: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Rotary base; ``None`` means the family's default (10,000 for Pythia)."""
    norm_eps: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Epsilon of the normalisation layers; ``None`` means the family's default. Changes no count, only numerics."""
    num_experts: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Experts of each mixture-of-experts layer (the ``olmoe`` and ``mixtral`` families; each of MLP width
    ``intermediate_size``); memory holds every one of them."""
    num_experts_per_token: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Experts each token is routed to (top-k); a step's FLOPs count only these."""
    image_size: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Side of the square input image in pixels (the vision families, ``vit`` and ``convnext``); their samples are
    images, ``vocab_size`` is the number of classes and ``seq_length`` is not read."""
    patch_size: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Side of a ViT's square patches in pixels (16 for ViT-B/16)."""
    stage_depths: Optional[str] = field(
        default=None,
        metadata=domain(
            pattern=r"[1-9][0-9]*(,[1-9][0-9]*)*", pattern_text="whole numbers >= 1 joined by commas", optional=True
        ),
    )
    """A ConvNeXt's blocks per stage, comma-separated (``3,3,9,3`` for ConvNeXt-T); ``num_layers`` is their sum and
    ``hidden_size`` the first stage's width, doubled at each later stage."""
    seq_length: int = field(default=2048, metadata=domain(ge=1, integer=True))
    global_batch_size: int = field(default=1024, metadata=domain(ge=1, integer=True))
    """Sequences per optimizer step across all GPUs."""
    train_steps: int = field(default=143_000, metadata=domain(ge=1, integer=True))
    """Optimizer steps of the full training run."""
    lr: float = field(default=1e-3, metadata=domain(gt=0))
    num_parameters: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Published parameter count; tests check it against the architecture."""


SOURCE = domain(pattern=r"[^\r\n]{1,200}", pattern_text="one line of text (at most 200 characters)", optional=True)
"""The domain of a price's source: a name and an address, or why there is no price."""
DATE = domain(pattern=r"[0-9]{4}-[0-9]{2}(-[0-9]{2})?", pattern_text="a date YYYY-MM-DD or YYYY-MM", optional=True)
"""The domain of a price's date."""


@dataclass
class GpuConfig:
    """One accelerator type: what it holds, how fast it can go, and what it costs."""

    name: str = field(default=MISSING, metadata=NAME)
    accelerator: str = field(default="cuda", metadata=domain(choices=choices.ACCELERATORS))
    """``cuda`` for NVIDIA GPUs, ``cpu`` to run the probe on host cores (one process per requested "GPU")."""
    architecture: str = field(default=MISSING, metadata=domain(choices=choices.ARCHITECTURES))
    """volta, ampere, ada, hopper or cpu; decides bf16 and TF32 support."""
    memory_gib: float = field(default=MISSING, metadata=domain(gt=0))
    peak_tflops_bf16: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Dense tensor-core peak, no sparsity; ``None`` where the GPU has no bf16."""
    peak_tflops_fp16: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    peak_tflops_tf32: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    peak_tflops_fp32: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Non-tensor fp32 peak."""
    supports_bf16: bool = True
    supports_tf32: bool = True
    board_power_w: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    purchase_price_usd: Optional[float] = field(default=None, metadata=domain(ge=0, optional=True))
    purchase_price_source: Optional[str] = field(default=None, metadata=SOURCE)
    """Where ``purchase_price_usd`` comes from (a paper, a vendor's list, or that it is an estimate)."""
    purchase_price_date: Optional[str] = field(default=None, metadata=DATE)
    cloud_usd_per_gpu_hour: Optional[float] = field(default=None, metadata=domain(ge=0, optional=True))
    """On-demand list price of one GPU-hour; every GPU's from one provider's list (``cloud_price_source``)."""
    cloud_price_source: Optional[str] = field(default=None, metadata=SOURCE)
    """The named list ``cloud_usd_per_gpu_hour`` is read from; where the price is null, why there is none."""
    cloud_price_date: Optional[str] = field(default=None, metadata=DATE)
    """When the price was read from its source (YYYY-MM-DD, or YYYY-MM for a publication)."""
    nvlink_gbytes_s: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """NVLink bandwidth of one GPU, both directions together, GB/s, as datasheets quote it (900 on an H100 SXM);
    ``None`` where the GPUs of a node are not all joined by NVLink (PCIe cards)."""
    pcie_gbytes_s: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Host link of one GPU, both directions together, GB/s (PCIe x16: 32 gen 3, 64 gen 4, 128 gen 5)."""
    memory_gbytes_s: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Device-memory bandwidth, GB/s, as the datasheet gives it (3,350 on an H100 SXM). With a dense peak, it lets
    a GPU type without a measured profile be predicted with the reference machine's carried to it
    (``analysis/predict/reference_profile.py``); ``None``: the peak and a fixed cost per micro-step instead."""
    mig_profile: Optional[str] = field(
        default=None,
        metadata=domain(pattern=r"[1-7]g\.[0-9]+gb", pattern_text="a MIG profile such as 3g.40gb", optional=True),
    )
    """The MIG profile (``3g.40gb``) where this GPU type is one Multi-Instance GPU slice of a card: a process sees
    one instance, and NCCL runs no collective between instances, so its cells run on one GPU only."""


@dataclass
class MethodConfig:
    """The optimisation settings of one cell: how the model is trained on its GPUs.

    ``engine`` picks the training engine; the ZeRO fields are DeepSpeed's, the ``fsdp_*`` fields FSDP2's, ``tp``
    and the ``pp*`` fields mesh3d's, and a cell that sets one engine's fields off their defaults under another
    engine is refused (orchestrator.cells.cell).
    """

    engine: str = field(default="deepspeed", metadata=domain(choices=choices.ENGINES))
    """Training engine: ``deepspeed`` (ZeRO), ``fsdp`` (PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard``)
    or ``mesh3d`` (tensor × pipeline × FSDP2 data parallelism on a PyTorch device mesh); the module
    ``orchestrator/engines/<engine>/``."""
    zero_stage: int = field(default=0, metadata=domain(choices=choices.ZERO_STAGES))
    """DeepSpeed ZeRO stage, 0 (plain data parallel) to 3."""
    offload_optimizer: bool = False
    """Keep optimizer states (and the step) on the CPU; needs ZeRO stage 1, 2 or 3."""
    offload_params: bool = False
    """Keep parameters on the CPU between uses; needs ZeRO stage 3."""
    fsdp_sharding: str = field(default="full", metadata=domain(choices=choices.FSDP_SHARDINGS))
    """FSDP2 only: ``full`` (parameters, gradients and optimizer states sharded; parameters resharded after the
    forward, as ZeRO-3), ``grad_op`` (no resharding after the forward: gradients and optimizer states sharded,
    whole parameters held from the forward to the backward, as ZeRO-2), ``none`` (plain data parallel: every
    rank holds everything, gradients all-reduced) or ``hybrid`` (full sharding inside a node, replicas across
    nodes; needs num_nodes > 1)."""
    fsdp_offload: bool = False
    """FSDP2 only: ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer states on the host, the
    optimizer step on the CPU; needs a CUDA GPU (on the CPU there is nothing to offload to)."""
    fsdp_reduce_precision: str = field(default="fp32", metadata=domain(choices=choices.FSDP_REDUCE_PRECISIONS))
    """FSDP2 only: the dtype gradients are reduced (and accumulated) in, ``fp32`` or ``bf16``; the parameters'
    compute dtype is ``precision``."""
    fsdp_accumulation: str = field(default="sharded", metadata=domain(choices=choices.FSDP_ACCUMULATIONS))
    """FSDP2 only: how gradients accumulate over a step's micro-batches. ``sharded`` (FSDP2's own default, as
    torchtitan runs it): every micro-batch's backward reduce-scatters, and each rank accumulates its shard.
    ``unsharded``: micro-batches inside the cycle skip the reduction (``set_requires_gradient_sync(False)``) and
    keep every gradient whole until the last one reduces them: one reduce-scatter a step instead of one a
    micro-batch, for Ψ more gradient bytes (in the reduce dtype) on every GPU. The setting joins the id of every
    FSDP cell, whatever its value: cells measured before it existed ran ``unsharded`` under ids without it."""
    tp: int = field(default=1, metadata=domain(ge=1, integer=True))
    """mesh3d only: tensor-parallel ranks (``torch.distributed.tensor.parallel``), inside a node; must divide the
    attention heads (and key/value heads) and the GPUs of a node."""
    pp: int = field(default=1, metadata=domain(ge=1, integer=True))
    """mesh3d only: pipeline stages (``torch.distributed.pipelining``); at most the layers, and ``tp × pp`` must
    divide ``num_gpus``: the rest is data parallel, sharded with FSDP2."""
    pp_schedule: str = field(default="1f1b", metadata=domain(choices=choices.PP_SCHEDULES))
    """mesh3d only: ``1f1b`` (one stage per rank), ``interleaved_1f1b`` (``pp_chunks`` stages per rank, Narayanan et
    al. 2021) or ``interleaved_zb`` (the same stages, the backward's weight gradients filling the bubble: Qi et al.
    2023's zero-bubble ZB-H1), when ``pp > 1``."""
    pp_microbatches: int = field(default=8, metadata=domain(ge=1, integer=True))
    """mesh3d only: micro-batches one pipeline schedule runs (each of ``micro_batch_size`` sequences), when
    ``pp > 1``; at least ``pp``."""
    pp_chunks: int = field(default=2, metadata=domain(ge=2, integer=True))
    """mesh3d only: the stages (virtual stages, model chunks) each pipeline rank holds under an interleaved
    ``pp_schedule``; ``pp × pp_chunks`` stages must not outnumber the layers."""
    pp_layers: Optional[str] = field(
        default=None,
        metadata=domain(
            pattern=r"[1-9][0-9]*(\+[1-9][0-9]*)*", pattern_text="layers per stage joined by +, as 5+6+6+5",
            optional=True,
        ),
    )  # fmt: skip
    """mesh3d only: the decoder layers of each pipeline stage in order (``pp × pp_chunks`` counts under an
    interleaved schedule), summing to the model's layers; null: split by cost, the ends' vocabulary matrices
    weighed."""
    tp_loss_parallel: bool = False
    """mesh3d only, with ``tp > 1``: split the vocabulary over the tensor ranks, the input embedding row-parallel
    and the output layer column-parallel, the loss computed on the sharded logits
    (``torch.distributed.tensor.parallel.loss_parallel``): no rank holds the whole logits. Not with an output layer
    tied to the embedding (one matrix split two ways), nor yet with a pipeline (``pp > 1``)."""
    tp_sequence_parallel: bool = False
    """mesh3d only, with ``tp > 1``: sequence parallelism (Korthikanti et al. 2022): the norms, dropouts and the
    residual stream between the tensor-parallel blocks hold one share of the sequence on each tensor rank, so every
    activation of a layer is split over them; the embedding is then row-parallel. Not with an output layer tied to
    the embedding, nor yet with a pipeline."""
    checkpoint_policy: str = field(default="full", metadata=domain(choices=choices.CHECKPOINT_POLICIES))
    """mesh3d only, with ``activation_checkpointing``: ``full`` recomputes each whole layer in the backward;
    ``selective`` keeps the outputs of the matrix products and of attention and recomputes the rest (norms,
    activations, rotary embedding), per operator as torchtitan does
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)."""
    dp_replicate: int = field(default=1, metadata=domain(ge=1, integer=True))
    """mesh3d only: HSDP over the data-parallel replicas: FSDP2 shards inside groups of ``dp / dp_replicate``
    replicas and replicates across the ``dp_replicate`` groups (a 2-D data mesh, as ``fsdp_sharding=hybrid``
    does for the FSDP engine); must divide the replicas. 1: every replica shards."""
    activation_checkpointing: bool = False
    precision: str = field(default="bf16", metadata=domain(choices=choices.PRECISIONS))
    """bf16, fp16 (dynamic loss scaling) or fp32."""
    micro_batch_size: Any = field(default="auto", metadata=domain(choices=("auto",), ge=1, integer=True))
    """Sequences per GPU per forward pass: a positive integer, or ``auto`` for the largest that fits."""
    compile: bool = False
    """Compile the model with ``torch.compile`` (how much of it: ``compile_scope``)."""
    compile_scope: str = field(default="regional", metadata=domain(choices=choices.COMPILE_SCOPES))
    """With ``compile``: ``regional`` compiles one transformer block, whose code every other block reuses, and the
    loss as a region of its own (Inductor's cache keeps both for later cells); ``whole`` compiles the whole model as
    one graph (DeepSpeed only: its compile grows with the depth, its step times agree with ``regional``'s)."""
    tf32: bool = True
    """Allow TF32 matmuls (Ampere and newer)."""
    attention: str = field(default="sdpa", metadata=domain(choices=choices.ATTENTIONS))
    """Attention implementation: sdpa, eager, or flash_attention_2 when flash-attn is installed."""


def compile_scope_of(method: Mapping[str, Any]) -> Scalar:
    """How much of the model a cell's method compiles (``compile_scope``), None where it compiles nothing: the
    record's, the settings' and the cells table's ``compile_scope``."""
    return method.get("compile_scope") if method.get("compile") is True else None


@dataclass
class ClusterConfig:
    """Where cells run: this machine (``local``) or a SLURM cluster."""

    backend: str = field(default="local", metadata=domain(choices=choices.BACKENDS))
    """``local`` runs cells one after another on this machine through submitit; ``slurm`` submits with sbatch."""
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    """A SLURM constraint added to every job (``--constraint``)."""
    time_limit_min: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    """Each cell's ``--time``. ``null``: derived from the probe (orchestrator.cells.cell.time_limit_min): twice its
    budget plus start-up and the time-limit warning, at least 10 minutes (17 for the default probe), so short
    probes backfill and fit short QOS limits; a number overrides it."""
    gpus_per_node: int = field(default=8, metadata=domain(ge=1, integer=True))
    """Most GPUs one node of this cluster has; a cell asking for more per node is refused."""
    cpus_per_gpu: int = field(default=4, metadata=domain(ge=1, integer=True))
    mem_gb_per_gpu: Optional[int] = field(default=None, metadata=domain(ge=1, integer=True, optional=True))
    gres_by_gpu: dict[str, str] = field(default_factory=dict)
    """GPU config name → gres type, e.g. ``a100-80gb: a100`` requests ``--gres=gpu:a100:N``."""
    constraint_by_gpu: dict[str, str] = field(default_factory=dict)
    """GPU config name → constraint, for clusters that select GPU types by feature instead of gres type."""
    partition_by_gpu: dict[str, str] = field(default_factory=dict)
    """GPU config name → partition, where each GPU type has partitions of its own (``h100-80gb: gpu-h100``); a
    GPU not named here uses ``partition``. A comma list lets SLURM pick whichever can start the job first."""
    qos_by_gpu: dict[str, str] = field(default_factory=dict)
    """GPU config name → QOS, where a site ties QOS to GPU types; a GPU not named here uses ``qos``."""
    account_by_gpu: dict[str, str] = field(default_factory=dict)
    """GPU config name → account, where a site bills GPU types to different accounts; otherwise ``account``."""
    gpus_per_node_by_gpu: dict[str, int] = field(default_factory=dict)
    """GPU config name → GPUs a node of that type has (``h100-80gb: 8`` beside 4-GPU A100 nodes); planning puts the
    cell's value in ``gpus_per_node``, ``cpus_per_gpu`` and ``mem_gb_per_gpu`` (these three ``_by_gpu`` maps)."""
    cpus_per_gpu_by_gpu: dict[str, int] = field(default_factory=dict)
    """GPU config name → CPUs per GPU on nodes of that type; otherwise ``cpus_per_gpu``."""
    mem_gb_per_gpu_by_gpu: dict[str, int] = field(default_factory=dict)
    """GPU config name → host memory per GPU (GB) on nodes of that type; otherwise ``mem_gb_per_gpu``."""
    array_parallelism: int = field(default=16, metadata=domain(ge=1, integer=True))
    """At most this many tasks of one array job run at once."""
    max_array_size: int = field(default=1000, metadata=domain(ge=1, integer=True))
    """The cluster's MaxArraySize; larger groups are split into several array jobs."""
    max_requeue_on_timeout: int = field(default=1, metadata=domain(ge=0, integer=True))
    """How often a cell that reaches its time limit requeues itself (it starts again from scratch, under the
    same job id) before it ends as ``timeout``; 0 never. Preempted cells requeue without limit."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before the probe starts (``module load``, environment activation)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables exported in the job (NCCL settings and the like)."""
    wckey: Optional[str] = None
    """A SLURM workload characterisation key (``--wckey``) for sites that enforce them; none by default (submitit's
    own default, ``submitit``, is rejected where wckeys are enforced)."""
    template: str = "default.sh.j2"
    """The sbatch preamble template: a file name under a ``-cd`` folder's ``sbatch_templates/`` (found first; the
    cell keeps its absolute path) or the package's ``sbatch_templates/``."""
    exclusive: Optional[bool] = None
    """Whether a cell's job holds its nodes alone (``--exclusive``): ``true`` always. ``null`` (the default) and
    ``false``: never; the job asks for exactly its GPUs, CPUs and memory (a whole node for a 1-GPU cell cost up to
    a node's GPUs of fair share), and a cell measured beside other jobs is flagged (``shared_node``)."""
    sbatch_extra: dict[str, str] = field(default_factory=dict)
    """A site's own sbatch options, added to every job as ``#SBATCH --<key>=<value>`` (an empty value is a bare
    flag: ``exclusive: ""``); ``reservation``, ``exclude``, pyxis' ``container-image``. Options gpudays sets itself
    are refused (orchestrator/slurm/options.py)."""
    srun_args: list[str] = field(default_factory=list)
    """Arguments added to the srun line that starts the ranks (``--cpu-bind=cores``, ``--container-image=...``)."""
    python: Optional[str] = None
    """The command that starts Python in the job, e.g. ``apptainer exec --nv /shared/gpudays.sif python3``; by
    default the submitting interpreter's absolute path (right on a shared file system, wrong in a container)."""
    goodput: Optional[float] = field(default=None, metadata=domain(gt=0, le=1, optional=True))
    """The share of a long training run's wall-clock time its training steps take, on this cluster (the rest:
    restarts after failures, evaluations, checkpoints, waiting for nodes). Every figure in days and GPU-hours is
    given steady-state and wall-clock (the steady-state figure over this). ``None``: the published figure of
    large runs, 0.90 (``analysis.predict.estimates.DEFAULT_GOODPUT``)."""
    inter_node_gbits_s: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Network bandwidth from one node to the others, all its ports together, one direction, Gb/s (InfiniBand
    HDR is 200 Gb/s a port, NDR 400); ``None`` where unknown. Used only by the analytic parallelism estimates."""


@dataclass
class ProbeConfig:
    """How long and how carefully the probe measures a cell."""

    kind: str = field(default="deepspeed", metadata=domain(choices=choices.PROBE_KINDS))
    """``deepspeed`` measures: the training probe (the name predates a second engine; ``method.engine`` picks
    DeepSpeed or FSDP); ``sleep`` only sleeps ``sleep_s`` and writes a record without metrics, to check a
    cluster's plumbing (submission, arrays, records, resume) at no GPU cost; ``fail`` sleeps ``sleep_s`` and then
    raises, to check how failures are recorded and rerun (the record is ``failed``, with its traceback)."""
    sleep_s: float = field(default=0.0, metadata=domain(ge=0))
    fail_rank: Optional[int] = field(default=None, metadata=domain(ge=0, integer=True, optional=True))
    """With ``kind: fail``, only this rank fails; the others wait as a peer in a collective would (up to
    ``GPUDAYS_DIST_TIMEOUT_S``, 600 s), to check that one crashed rank ends its cell at once."""

    step_timing: str = field(default="composed", metadata=domain(choices=choices.STEP_TIMINGS))
    """``composed``: time micro-steps and the boundary step (reduction, optimizer) apart and compose a step as
    accumulation × micro-step + boundary; ``whole``: time whole accumulation cycles (see orchestrator/job/timing.py)."""
    warmup_steps: int = field(default=2, metadata=domain(ge=0, integer=True))
    """Steps run before timing starts (compilation and allocator warm-up); shortened to the micro-steps of one
    composed sample when ``step_timing`` is ``composed``."""
    min_steps: int = field(default=5, metadata=domain(ge=1, integer=True))
    """Timed optimizer steps before the stopping rule is consulted."""
    max_steps: int = field(default=50, metadata=domain(ge=1, integer=True, at_least="min_steps"))
    target_ci_pct: float = field(default=2.0, metadata=domain(gt=0))
    """Stop once the 95% confidence half-width of the mean step time is under this % of the mean."""
    time_budget_s: float = field(default=300.0, metadata=domain(gt=0))
    """Wall-clock budget for the timed steps of one cell."""
    memory_limit_gib: Optional[float] = field(default=None, metadata=domain(gt=0, optional=True))
    """Treat a micro-batch whose peak memory exceeds this (at a trial, the warm-up or the timed steps) as out of
    memory (a limit imposed on the probe)."""
    seed: int = field(default=0, metadata=domain(ge=0, integer=True))
    profile: bool = True
    """Where the sweep folder holds no profile of a GPU type and node layout the cells run on, measure one first
    (``gpudays profile``: on this machine before the cells, on SLURM as a job of its own ahead of their array);
    ``false`` never. A sweep of sleep or fail probes measures none."""


@dataclass
class Config:
    """One cell of the grid: a model on ``num_gpus`` GPUs of one type with one method."""

    model: ModelConfig = MISSING
    gpu: GpuConfig = MISSING
    method: MethodConfig = MISSING
    cluster: ClusterConfig = MISSING
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    num_gpus: int = field(default=1, metadata=domain(ge=1, integer=True))
    num_nodes: int = field(default=1, metadata=domain(ge=1, integer=True))
    """Nodes the cell's GPUs are spread over; ``num_gpus`` must be a multiple of it."""
    name: str = "gpudays"
    """Name of the sweep, used for job names."""


def _section(cls: type, value: Any, where: str) -> Any:
    """One group's mapping as its dataclass; unknown keys are an error that lists the accepted ones."""
    if isinstance(value, cls):
        return value
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(value).__name__}")
    names = _FIELD_NAMES.get(cls) or _FIELD_NAMES.setdefault(cls, frozenset(f.name for f in fields(cls)))
    if not names.issuperset(value):  # the checks in C first: this runs for every section of every record read
        unknown = sorted(str(k) for k in value if k not in names)
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(names))}")
    out = cls(**value)  # every key is a field's name
    if MISSING in vars(out).values():
        missing = [f.name for f in fields(cls) if getattr(out, f.name) == MISSING]
        raise ValueError(f"{where}: missing value(s) for {', '.join(missing)}")
    return out


def to_config(composed: Any) -> Config:
    """The typed cell: a composed config (a DictConfig or the plain mapping written to cell.yaml) as dataclasses.

    This is the edge: code past it takes ``Config`` (and its ``ModelConfig``, ``MethodConfig``, ...) and reads
    attributes, never string keys. Values were checked against the schema when Hydra composed the cell, so this
    builds the dataclasses directly (microseconds a cell, which matters for sweeps of thousands of cells); keys
    the schema does not know, and required values that are missing, raise ValueError naming them.
    """
    if isinstance(composed, Config):
        return composed
    if not isinstance(composed, Mapping):
        from omegaconf import DictConfig, OmegaConf

        if not isinstance(composed, DictConfig):
            raise ValueError(f"a cell's config must be a mapping, got {type(composed).__name__}")
        composed = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(composed, Mapping)
    if not _CONFIG_NAMES.issuperset(composed):
        unknown = sorted(str(k) for k in composed if k not in _CONFIG_NAMES)
        accepted = ", ".join(f.name for f in fields(Config))
        raise ValueError(f"cell config: unknown key(s) {', '.join(unknown)}; accepted: {accepted}")
    values: dict[str, Any] = {}
    for name, value in composed.items():
        cls = _GROUP_TYPES.get(name)
        values[name] = _section(cls, value, name) if cls is not None else value
    cfg = Config(**values)
    missing = [name for name in _GROUP_TYPES if name != "probe" and getattr(cfg, name) == MISSING]
    if missing:
        raise ValueError(f"cell config: missing group(s) {', '.join(missing)}")
    return cfg


def to_section(group: str, value: object) -> object:
    """One group's mapping (``model``, ``gpu``...) as its dataclass, as :func:`to_config` types it (and takes it)."""
    return _section(_GROUP_TYPES[group], value, group)


def to_container(cfg: Config) -> Container:
    """The typed cell as plain data, as ``cell.yaml`` and a record's ``config`` hold it (the inverse of
    :func:`to_config`: the same keys in the same order as Hydra composes them)."""
    return asdict(cfg)


_CONFIG_NAMES = frozenset(f.name for f in fields(Config))
_FIELD_NAMES: dict[type, frozenset[str]] = {}
_GROUP_TYPES: dict[str, type] = {
    "model": ModelConfig,
    "gpu": GpuConfig,
    "method": MethodConfig,
    "cluster": ClusterConfig,
    "probe": ProbeConfig,
}
