"""The named values of the config fields: each field's domain in ``orchestrator.config.schema`` is declared beside
the field with one of these (``orchestrator.config.domains``)."""

from __future__ import annotations

ACCELERATORS = ("cuda", "cpu")
ARCHITECTURES = ("volta", "ampere", "ada", "hopper", "blackwell", "cpu")
ENGINES = ("deepspeed", "fsdp", "mesh3d")
"""The training engines, each a folder ``orchestrator/engines/<name>/``."""
ZERO_STAGES = (0, 1, 2, 3)
FSDP_SHARDINGS = ("full", "grad_op", "none", "hybrid")
FSDP_REDUCE_PRECISIONS = ("fp32", "bf16")
FSDP_ACCUMULATIONS = ("sharded", "unsharded")
PP_SCHEDULES = ("1f1b", "interleaved_1f1b", "interleaved_zb")
"""``method.pp_schedule``'s domain: torch.distributed.pipelining's ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` and
``ScheduleInterleavedZeroBubble``."""
CHECKPOINT_POLICIES = ("full", "selective")
"""``method.checkpoint_policy``'s domain: what ``activation_checkpointing`` recomputes (mesh3d)."""
PRECISIONS = ("bf16", "fp16", "fp32")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
COMPILE_SCOPES = ("regional", "whole")
BACKENDS = ("local", "slurm")
PROBE_KINDS = ("deepspeed", "sleep", "fail")
"""``deepspeed`` (the historical name) is the training probe, whichever ``method.engine`` trains; ``sleep`` and
``fail`` measure nothing (plumbing checks: a job that ends ok, one that fails)."""
MEASURING_PROBE_KINDS = ("deepspeed",)
"""The probe kinds whose record is a measurement of the cell (the others' never stands in for one)."""
STEP_TIMINGS = ("composed", "whole")
