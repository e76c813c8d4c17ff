"""mesh3d as the registry sees it: the ``tp``, ``pp*``, ``checkpoint_policy`` and ``dp_replicate`` fields it owns,
their refusals, its label, and where its memory and step-time terms are (:mod:`orchestrator.engines.spec` says what each part is)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.config.values import Scalar
from orchestrator.engines.mesh3d.config import batch_refusals, refusals
from orchestrator.engines.mesh3d.pipeline import INTERLEAVED
from orchestrator.engines.spec import EngineSpec

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.engines.spec import CellArrays, Links, Terms

FIELDS = (
    "tp", "pp", "pp_schedule", "pp_microbatches", "pp_chunks", "pp_layers", "tp_loss_parallel", "tp_sequence_parallel",
    "checkpoint_policy", "dp_replicate",
)  # fmt: skip


def foreign(owner: EngineSpec, value: object, default: object) -> str:
    return (
        f"{value!r} is {owner.setting}; with method.engine=mesh3d leave it at {default!r}: mesh3d shards the "
        "data-parallel replicas with FSDP2 (full) and splits the model with method.tp and method.pp"
    )


def _int(value: Scalar, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def label(settings: Mapping[str, Scalar]) -> str:
    """``tp<t> pp<p>``, then the schedule and its micro-batches where there is a pipeline: ``tp2 pp2 1f1b-m8``,
    with its stages a rank where not two (``interleaved_zb-v4-m8``) and the user's layers per stage
    (``layers=5+6+6+5``); ``hsdp<r>`` with ``dp_replicate`` groups, ``selective`` with selective checkpointing."""
    tp, pp = _int(settings.get("tp"), 1), _int(settings.get("pp"), 1)
    parts = [f"tp{tp}", f"pp{pp}"]
    if pp > 1:
        schedule, chunks = str(settings.get("pp_schedule") or "1f1b"), _int(settings.get("pp_chunks"), 2)
        stages = f"-v{chunks}" if schedule in INTERLEAVED and chunks != 2 else ""
        parts.append(f"{schedule}{stages}-m{_int(settings.get('pp_microbatches'), 8)}")
        if isinstance(settings.get("pp_layers"), str):
            parts.append(f"layers={settings['pp_layers']}")
    if _int(settings.get("dp_replicate"), 1) > 1:
        parts.append(f"hsdp{_int(settings.get('dp_replicate'), 1)}")
    if settings.get("checkpoint_policy") == "selective":
        parts.append("selective")
    return " ".join(parts)


def memory_terms(x: CellArrays) -> Terms:
    from orchestrator.engines.mesh3d.memory import memory_terms_of

    return memory_terms_of(x)


def accumulated_bytes(x: CellArrays) -> np.ndarray:
    from orchestrator.engines.mesh3d.memory import accumulated_bytes_of

    return accumulated_bytes_of(x)


def build_bytes(x: CellArrays) -> np.ndarray | float:
    from orchestrator.engines.mesh3d.memory import build_bytes_of

    return build_bytes_of(x)


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    from orchestrator.engines.mesh3d.step_time import step_time_terms as terms

    return terms(x, accum, links)


def layout_terms(x: CellArrays) -> Terms:
    """Each cell's batch split (replicas × pipeline micro-batches), a rank's share of the activations, and the
    micro-steps' share of a schedule: each rank runs the k micro-batches of a schedule through its 1/p of the
    layers, so a schedule costs k/p of a whole-model micro-step's fixed cost (its kernel launches and
    memory-bound work, which grow with the layers a micro-batch passes); and the compute's stretch by the
    pipeline's bubble and its slowest stage (``step_time.compute_stretch``)."""
    import numpy as np

    from orchestrator.engines.mesh3d.memory import activation_share, logit_fraction
    from orchestrator.engines.mesh3d.step_time import compute_stretch, peak_rank_share

    m = x.method
    t, p = np.asarray(m["tp"], dtype=float), np.asarray(m["pp"], dtype=float)
    k = np.where(p > 1, np.asarray(m["pp_microbatches"], dtype=float), 1.0)
    replicas = np.maximum(np.floor(np.asarray(x.num_gpus, dtype=float) / (t * p)), 1.0)
    logits = logit_fraction(x.vocab, x.seq, x.per_sequence)
    first = peak_rank_share(x)
    share = activation_share(
        t, p, k, m["pp_chunks"], logits, m["tp_loss_parallel"], m["tp_sequence_parallel"], m["pp_schedule"], first
    )
    return {
        "batch_split": replicas * k,
        "activation_share": np.asarray(share, dtype=float),
        "micro_step_share": k / p,
        "compute_stretch": compute_stretch(x),
    }


SPEC = EngineSpec(
    name="mesh3d",
    setting="a mesh3d setting",
    fields=FIELDS,
    check=refusals,
    foreign=foreign,
    label=label,
    memory_terms=memory_terms,
    step_time_terms=step_time_terms,
    build_bytes=build_bytes,
    accumulated_bytes=accumulated_bytes,
    not_fit_advice="more tensor or pipeline parallelism (method.tp, method.pp)",
    sharding_fields=("tp", "pp", "pp_schedule", "pp_chunks"),
    batch_check=batch_refusals,
    layout_terms=layout_terms,
)
