"""mesh3d's pipeline schedules: how many stages each rank holds, which torch class runs each, the rules torch
sets on the micro-batches, the layers of each stage a user may give, the bubble and the micro-batches in flight.

Pure: nothing here imports torch at module level, so the unit tests check every rule and the refusals run before
submission.

``method.pp_schedule`` picks one of ``torch.distributed.pipelining``'s schedules (all in torch 2.6 and later):

- ``1f1b``: ``Schedule1F1B``, one stage a rank (Narayanan et al. 2021, PipeDream-Flush);
- ``interleaved_1f1b``: ``ScheduleInterleaved1F1B``, ``method.pp_chunks`` stages a rank, looped (stage ``s`` on
  rank ``s mod p``), depth first;
- ``interleaved_zb``: ``ScheduleInterleavedZeroBubble``, the same stages, each backward split into its input
  gradient (on the critical path) and its weight gradient, which fills what would be the bubble (Qi et al. 2023,
  "Zero Bubble Pipeline Parallelism", its ZB-H1 schedule, looped over the chunks as torch runs it). torch runs no
  compiled stage with it.

The two interleaved schedules run micro-batches in rounds: ``max(1, m // p)`` rounds, which must divide ``m``.
torch's ``ScheduleZBVZeroBubble`` (and ``ScheduleDualPipeV``) place exactly two stages a rank in a V (rank ``r``
holds stages ``r`` and ``2p − 1 − r``, both ends of the model on rank 0); mesh3d's stages are looped, so it does not
offer them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from orchestrator.config.refusal import Refusal

if TYPE_CHECKING:
    from orchestrator.config.schema import Config

TORCH_SCHEDULES = {
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "interleaved_zb": "ScheduleInterleavedZeroBubble",
}
"""The ``torch.distributed.pipelining`` class of each ``method.pp_schedule``."""
INTERLEAVED = ("interleaved_1f1b", "interleaved_zb")
"""The schedules that hold ``method.pp_chunks`` stages on each rank (the others one)."""
ZERO_BUBBLE_SHARE = {"interleaved_zb": 1.0 / 3.0}
"""The bubble of each zero-bubble schedule over its 1F1B counterpart's. Qi et al. 2023 (§3, Table 1): 1F1B idles
(p − 1)(T_F + T_B + T_W), ZB-H1 (p − 1)(T_F + T_B − T_W), with T_B the backward for the inputs and T_W the one for
the weights; taking the three equal (one matrix product each per linear layer, the paper's own approximation), a
third."""
DEFAULT_CHUNKS = 2
"""``method.pp_chunks``'s default."""
_LAYERS = re.compile(r"[1-9][0-9]*(\+[1-9][0-9]*)*")


def stages_per_rank(schedule: str, chunks: int) -> int:
    """The stages each pipeline rank holds under ``schedule`` with ``method.pp_chunks = chunks``."""
    return int(chunks) if schedule in INTERLEAVED else 1


def parse_layers(text: object) -> tuple[int, ...]:
    """``method.pp_layers`` as layer counts (``5+6+6+5``, or the counts themselves); empty where it is unset or
    not of that form."""
    if isinstance(text, tuple) and all(isinstance(n, int) and n > 0 for n in text):
        return text
    if not isinstance(text, str) or not _LAYERS.fullmatch(text):
        return ()
    return tuple(int(n) for n in text.split("+"))


def user_split(text: object, num_layers: int, num_stages: int) -> tuple[int, ...]:
    """The user's layers per stage where they fit the model (one entry a stage, summing to its layers), else
    empty: the cost-balanced split then stands."""
    sizes = parse_layers(text)
    return sizes if len(sizes) == num_stages and sum(sizes) == num_layers else ()


def rounds(pp: int, microbatches: int) -> int:
    """The rounds an interleaved schedule runs its micro-batches in: ``max(1, m // p)``, as torch counts them."""
    return max(1, int(microbatches) // max(int(pp), 1))


def bubble_share(pp: float, microbatches: float, chunks: float, schedule: object) -> float:
    """The idle share of one schedule on each rank, in theory: with ``m`` micro-batches over ``p`` ranks of ``v``
    stages each, the bubble is ``(p − 1)/(v·m)`` of the ideal time (Narayanan et al. 2021), times
    :data:`ZERO_BUBBLE_SHARE` for a zero-bubble schedule; as a share of the whole, ``x / (1 + x)``. 0 without a
    pipeline."""
    p = float(pp)
    if p <= 1:
        return 0.0
    v = float(stages_per_rank(str(schedule), int(chunks)))
    x = (p - 1.0) / (v * max(float(microbatches), 1.0)) * ZERO_BUBBLE_SHARE.get(str(schedule), 1.0)
    return x / (1.0 + x)


def in_flight_share(pp: float, microbatches: float, chunks: float, schedule: object) -> float:
    """The first rank's activations at their peak over those of one micro-batch through the whole model: the
    stages' forwards it has run before their first backward, each of 1/(v·p) of the layers, as torch's schedules
    order them (its warm-up, then one forward before each backward). 1F1B: ``min(p, m)`` stages of 1/p (Narayanan
    et al. 2021); interleaved 1F1B: ``(v − 1)·r + 2(p − 1) + 1`` of ``v·m`` (``r`` micro-batches a round), the
    ``1 + (p − 1)/(v·p)`` of Megatron-LM's paper where ``p`` divides ``m``; interleaved zero bubble: ``(v − 1)·r +
    (p − 1) + 1`` (its warm-up steps one, not two, a rank), 1F1B's where ``p`` divides ``m``, as Qi et al. 2023 give
    for ZB-H1. 1 without a pipeline."""
    p = int(pp)
    if p <= 1:
        return 1.0
    v = stages_per_rank(str(schedule), int(chunks))
    return in_flight_stages(pp, microbatches, chunks, schedule, 0) / (v * p)


def in_flight_stages(pp: float, microbatches: float, chunks: float, schedule: object, rank: int) -> int:
    """Stage forwards pipeline rank ``rank`` has run before its first backward, as :func:`in_flight_share` counts
    them for the first: a later rank warms up with one fewer (two under interleaved 1F1B) a rank before it."""
    p, m = int(pp), max(int(microbatches), 1)
    if p <= 1:
        return 1
    name = str(schedule)
    v = stages_per_rank(name, int(chunks))
    if name not in INTERLEAVED:
        return min(p - rank, m)
    per_round = m // rounds(p, m)
    hops = 1 if name == "interleaved_zb" else 2
    return min((v - 1) * per_round + hops * (p - 1 - rank) + 1, v * m)


def rank_totals(values: list[float], pp: int) -> list[float]:
    """Per pipeline rank, the sum of ``values`` over the stages it holds (stage ``s`` on rank ``s mod pp``)."""
    out = [0.0] * pp
    for s, value in enumerate(values):
        out[s % pp] += value
    return out


def schedule_refusals(cell: Config) -> list[Refusal]:
    """Why the cell's schedule settings cannot run, each naming the key: ``pp_chunks`` off its default where the
    schedule holds one stage a rank, micro-batches torch's interleaved schedules cannot arrange in rounds, a
    zero-bubble schedule with ``compile`` or selective checkpointing, layers per stage that are not one count a stage summing to the
    model's layers."""
    m, model = cell.method, cell.model
    pp, k, schedule = int(m.pp), int(m.pp_microbatches), str(m.pp_schedule)
    out: list[Refusal] = []
    if schedule not in INTERLEAVED and int(m.pp_chunks) != DEFAULT_CHUNKS:
        out.append(
            Refusal(
                "method.pp_chunks",
                f"{schedule} holds one stage a rank; pp_chunks applies to {', '.join(INTERLEAVED)}: leave it at "
                f"{DEFAULT_CHUNKS} or choose one of those",
            )
        )
    if schedule in INTERLEAVED and k >= pp and k % rounds(pp, k):
        out.append(
            Refusal(
                "method.pp_microbatches",
                f"{schedule} runs micro-batches in rounds of about {pp}: {k} is not a multiple of its "
                f"{rounds(pp, k)} rounds; use a multiple of {pp}",
            )
        )
    if schedule in ZERO_BUBBLE_SHARE and m.compile:
        out.append(
            Refusal(
                "method.compile",
                f"torch splits each backward of {schedule} into its input and weight gradients, which it does not "
                "run on compiled stages; leave compile false or use interleaved_1f1b",
            )
        )
    if schedule in ZERO_BUBBLE_SHARE and m.activation_checkpointing and m.checkpoint_policy == "selective":
        out.append(
            Refusal(
                "method.checkpoint_policy",
                f"torch runs each backward of {schedule} twice (input gradients, then weight gradients), and a "
                "region under selective checkpointing may be backed through once only (torch raises 'Trying to "
                "backward an extra time'); use checkpoint_policy=full or pp_schedule=interleaved_1f1b",
            )
        )
    if m.pp_layers is not None:
        stages = pp * stages_per_rank(schedule, int(m.pp_chunks))
        sizes = parse_layers(m.pp_layers)
        if len(sizes) != stages or sum(sizes) != model.num_layers:
            out.append(
                Refusal(
                    "method.pp_layers",
                    f"{m.pp_layers!r} gives {len(sizes)} stages of {sum(sizes)} layers; {model.name} with pp={pp} "
                    f"({schedule}, {stages} stages) needs {stages} counts summing to its {model.num_layers} layers, "
                    "such as " + "+".join(map(str, _even(model.num_layers, stages))),
                )
            )
    return out


def _even(num_layers: int, stages: int) -> list[int]:
    """An even split of ``num_layers`` over ``stages``, the later stages taking the remainder."""
    low, extra = divmod(num_layers, max(stages, 1))
    return [low + (1 if i >= stages - extra else 0) for i in range(stages)]
