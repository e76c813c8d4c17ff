"""mesh3d's pipeline schedules as settings: the domains of ``pp_schedule``, ``pp_chunks`` and ``pp_layers`` and
their refusals, the ids they leave alone, and the bubble, in-flight activations, largest rank and pace each
schedule and split gives (pure; the schedules run in tests/integration/test_probe_mesh3d.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from orchestrator.cells import cell as cells
from orchestrator.config.choices import PP_SCHEDULES
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.engines.mesh3d.config import layout_of, pipeline_imbalance, refusals, stage_sizes
from orchestrator.engines.mesh3d.memory import activation_share, rank_parameters
from orchestrator.engines.mesh3d.pipeline import bubble_share, in_flight_share, parse_layers, user_split
from orchestrator.engines.mesh3d.step_time import bubble, imbalance
from orchestrator.engines.registry import method_label
from orchestrator.planning.plan import SweepError

MESH = "method.engine=mesh3d"
LLAMA8 = [MESH, "model=smollm2-tiny", "model.num_layers=8", "model.num_parameters=null", "num_gpus=2", "method.pp=2"]


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(engine="mesh3d"), **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        # pp_chunks is for the interleaved schedules, and the stages it makes must not outnumber the layers
        ([*LLAMA8, "method.pp_chunks=4"], "method.pp_chunks", "interleaved_1f1b, interleaved_zb"),
        ([*LLAMA8, "method.pp_schedule=interleaved_zb", "method.pp_chunks=5"], "method.pp", "has 8 layers"),
        ([MESH, "num_gpus=2", "method.pp_chunks=3"], "method.pp_chunks", "no pipeline"),
        ([MESH, "num_gpus=2", "method.pp_layers=1+1"], "method.pp_layers", "no pipeline"),
        # torch's rounds: max(1, m // p) must divide m
        (
            [
                *LLAMA8[:-2],
                "num_gpus=4",
                "method.pp=4",
                "method.pp_schedule=interleaved_zb",
                "method.pp_microbatches=9",
                "method.pp_chunks=2",
                "model.global_batch_size=36",
            ],
            "method.pp_microbatches",
            "multiple of 4",
        ),  # fmt: skip
        # torch splits a zero-bubble backward, which it does not do on compiled stages
        ([*LLAMA8, "method.pp_schedule=interleaved_zb", "method.compile=true"], "method.compile", "compile false"),
        # nor twice through a region under selective checkpointing (the probe failed so on two ranks)
        (
            [
                *LLAMA8,
                "method.pp_schedule=interleaved_zb",
                "method.activation_checkpointing=true",
                "method.checkpoint_policy=selective",
            ],
            "method.checkpoint_policy",
            "checkpoint_policy=full",
        ),  # fmt: skip
        # the user's layers: one count a stage, summing to the model's layers, naming the model and the stages
        ([*LLAMA8, "method.pp_layers=3+4"], "method.pp_layers", "smollm2-tiny with pp=2"),
        (
            [*LLAMA8, "method.pp_schedule=interleaved_1f1b", "method.pp_layers=4+4"],
            "method.pp_layers",
            "needs 4 counts summing to its 8 layers, such as 2+2+2+2",
        ),
    ],
)
def test_schedules_mesh3d_cannot_run_are_refused_naming_the_key(make_cell, overrides, key, fragment) -> None:
    found = cells.check_runnable(to_config(make_cell(*overrides)))
    assert key in [r.key for r in found], found
    assert any(fragment in r.reason for r in found if r.key == key), found


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("method.pp_layers=4-4", "method.pp_layers: '4-4' is not accepted; use layers per stage joined by +"),
        ("method.pp_schedule=zbv", "method.pp_schedule: 'zbv' is not accepted; use one of 1f1b, interleaved_1f1b, "
         "interleaved_zb"),
        ("method.pp_chunks=1", "method.pp_chunks: 1 is not accepted; use an integer >= 2"),
    ],
)  # fmt: skip
def test_values_outside_the_domains_are_refused_at_the_config_edge(make_cell, override, message) -> None:
    with pytest.raises(SweepError) as raised:
        make_cell(*LLAMA8, override)
    assert message in str(raised.value) and "model=smollm2-tiny" in str(raised.value)  # the cell named


@pytest.mark.parametrize(
    "overrides",
    [
        [*LLAMA8, "method.pp_schedule=interleaved_zb"],
        [*LLAMA8, "method.pp_schedule=interleaved_zb", "method.pp_chunks=4", "method.pp_layers=1+1+1+1+1+1+1+1"],
        [
            *LLAMA8,
            "method.pp_schedule=interleaved_1f1b",
            "method.pp_chunks=3",
            "method.pp_microbatches=6",
            "model.global_batch_size=12",
        ],  # fmt: skip
        [*LLAMA8, "method.pp_layers=5+3"],
    ],
)
def test_the_schedules_and_splits_mesh3d_runs_are_accepted(make_cell, overrides) -> None:
    cfg = to_config(make_cell(*overrides))
    assert cells.check_values(cfg) == [] and refusals(cfg) == [] and cells.check_runnable(cfg) == []


def test_a_new_setting_joins_only_the_ids_of_cells_that_set_it(make_cell) -> None:
    assert PP_SCHEDULES[:2] == ("1f1b", "interleaved_1f1b")  # the values ids were made of before
    plain = to_config(make_cell(*LLAMA8))
    zb = to_config(make_cell(*LLAMA8, "method.pp_schedule=interleaved_zb"))
    chunks = to_config(make_cell(*LLAMA8, "method.pp_schedule=interleaved_1f1b", "method.pp_chunks=4"))
    split = to_config(make_cell(*LLAMA8, "method.pp_layers=5+3"))
    assert not {"method.pp_chunks", "method.pp_layers"} & set(cells.identity(plain))
    assert cells.identity(split)["method.pp_layers"] == "5+3" and cells.identity(chunks)["method.pp_chunks"] == 4
    assert len({cells.cell_id(c) for c in (plain, zb, chunks, split)}) == 4
    # the labels: unchanged where nothing new is set
    assert method_label(vars(plain.method)) == "tp1 pp2 1f1b-m8"
    assert method_label(vars(chunks.method)) == "tp1 pp2 interleaved_1f1b-v4-m8"
    assert method_label(vars(zb.method)) == "tp1 pp2 interleaved_zb-m8"
    assert method_label(vars(split.method)) == "tp1 pp2 1f1b-m8 layers=5+3"


def test_the_layout_takes_the_users_layers_and_holds_its_chunks_looped() -> None:
    lay = layout_of(method(pp=2, pp_schedule="interleaved_zb", pp_chunks=3, pp_layers="1+2+1+1+2+1"), 2)
    assert lay.num_stages == 6 and lay.stages_of(1) == [1, 3, 5] and lay.layers == (1, 2, 1, 1, 2, 1)
    assert [len(r) for r in lay.stage_layers(8)] == [1, 2, 1, 1, 2, 1]
    assert [len(r) for r in layout_of(method(pp=2, pp_schedule="interleaved_zb", pp_chunks=3), 2).stage_layers(8)] == (
        stage_sizes(8, 6)
    )
    assert parse_layers("5+6+6+5") == (5, 6, 6, 5) and parse_layers("5,6") == () and parse_layers(None) == ()
    assert user_split("4+4", 8, 2) == (4, 4) and user_split("4+4", 9, 2) == () and user_split("4+4", 8, 4) == ()


def test_the_bubble_follows_the_schedule() -> None:
    # interleaved with v chunks: (p - 1)/(v·m) of the ideal; zero bubble (ZB-H1): a third of it
    for v in (2, 3, 4):
        x = 3 / (v * 8)
        assert bubble_share(4, 8, v, "interleaved_1f1b") == pytest.approx(x / (1 + x))
        assert bubble_share(4, 8, v, "interleaved_zb") == pytest.approx((x / 3) / (1 + x / 3))
    assert bubble_share(4, 8, 4, "1f1b") == pytest.approx(3 / 11)  # pp_chunks means nothing to 1F1B
    assert bubble_share(1, 8, 2, "interleaved_zb") == 0.0
    got = bubble(np.array([4.0, 4.0, 4.0]), 8, np.array(["1f1b", "interleaved_1f1b", "interleaved_zb"], dtype=object),
                 np.array([2.0, 4.0, 4.0]))  # fmt: skip
    assert list(got) == pytest.approx([3 / 11, 3 / 35, 1 / 33])
    assert layout_of(method(pp=4, pp_schedule="interleaved_zb", pp_chunks=4), 4).bubble == pytest.approx(1 / 33)


def test_the_first_ranks_activations_in_flight_follow_the_schedule() -> None:
    # 1F1B: p micro-batches of a stage (all the layers once); interleaved: torch's warm-up of (v - 1)·p + 2(p - 1)
    # chunks and one more, Megatron's 1 + (p - 1)/(v·p); zero bubble: one hop a rank, 1F1B's
    assert in_flight_share(4, 8, 2, "1f1b") == pytest.approx(1.0)
    assert in_flight_share(4, 2, 2, "1f1b") == pytest.approx(0.5)
    for v in (2, 4):
        assert in_flight_share(4, 8, v, "interleaved_1f1b") == pytest.approx(1 + 3 / (v * 4))
        assert in_flight_share(4, 8, v, "interleaved_zb") == pytest.approx(1.0)
    # four micro-batches: the warm-up of 4 + 6 runs out of its 2 × 4 forwards, all in flight before a backward
    assert in_flight_share(4, 4, 2, "interleaved_1f1b") == pytest.approx(8 / 8)
    assert in_flight_share(1, 8, 2, "interleaved_1f1b") == 1.0
    share = activation_share(1, np.array([4.0, 4.0]), 8, np.array([2.0, 2.0]), 0.0, False, False,
                             np.array(["1f1b", "interleaved_1f1b"], dtype=object))  # fmt: skip
    assert list(share) == pytest.approx([1.0, 1.375])


def test_the_largest_rank_and_the_pace_are_those_of_its_looped_stages() -> None:
    psi, e, layers = 1.0e9, 1.0e8, 8
    per_layer = (psi - 2 * e) / layers
    # the user's 5+3: the first rank holds five layers and the embedding
    assert rank_parameters(psi, e, 1, 2, layers, split="5+3") == pytest.approx(5 * per_layer + e)
    assert pipeline_imbalance(layers, 2, 0.0, layers="5+3") == pytest.approx(5 / 4)
    assert float(imbalance(psi, e, layers, 2, (2, "1f1b", "5+3"))) == pytest.approx(
        pipeline_imbalance(layers, 2, e / per_layer, layers="5+3")
    )
    # interleaved, four chunks over two ranks of 1+1+1+1+1+1+1+1: rank 0 holds stages 0, 2, 4, 6 and the embedding,
    # rank 1 the output layer: even, the ends' matrices each on one rank
    even = "+".join(["1"] * 8)
    assert rank_parameters(psi, e, 1, 2, layers, False, 4, "interleaved_zb", even) == pytest.approx(4 * per_layer + e)
    assert pipeline_imbalance(layers, 2, 1.0, 4, even) == pytest.approx(1.0)
    # a split that does not fit the stages is the cost-balanced one's
    assert rank_parameters(psi, e, 1, 2, layers, split="4+4+4") == rank_parameters(psi, e, 1, 2, layers)


def test_the_predictor_reads_the_schedule_settings_of_each_cell(make_cell) -> None:
    # The predictor's arrays carry pp_chunks, pp_schedule and pp_layers to the engine's terms, cell by cell.
    from analysis.predict.inputs import flat_cell, inputs_from_columns, layout_terms
    from orchestrator.engines.mesh3d.spec import memory_terms, step_time_terms
    from orchestrator.engines.spec import Links

    configs = [
        to_config(make_cell(*LLAMA8)),
        to_config(make_cell(*LLAMA8, "method.pp_layers=5+3")),
        to_config(make_cell(*LLAMA8, "method.pp_schedule=interleaved_1f1b")),
        to_config(make_cell(*LLAMA8, "method.pp_schedule=interleaved_1f1b", "method.pp_chunks=4")),
    ]
    rows = [flat_cell(c) for c in configs]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    share = layout_terms(x)["activation_share"]
    # The user's 5 + 3 gives the first rank, which keeps the most forwards in flight, 5 layers of the mean 4.
    assert list(share) == pytest.approx([in_flight_share(2, 8, v, s) * f for v, s, f in
                                         ((2, "1f1b", 1.0), (2, "1f1b", 5 / 4), (2, "interleaved_1f1b", 1.0),
                                          (4, "interleaved_1f1b", 1.0))])  # fmt: skip
    params = memory_terms(x)["params"]
    assert params[1] > params[0], "the user's 5 + 3 holds more on the first rank than the balanced split"
    stretch = layout_terms(x)["compute_stretch"]
    assert stretch[1] > stretch[0] > 1.0, "the uneven split waits for its slowest rank, every split for the bubble"
    assert stretch[3] < stretch[2] < stretch[0], "more stages a rank, a smaller bubble"
    # The wait is the compute's (costed at its achieved rate), not the links': the communication is the same.
    links = Links(intra_node=1e11, inter_node=1e10, host=1e10, cpu_adam_params_per_s_per_node=1e9)
    communication = step_time_terms(x, np.ones(len(rows)), links)["communication_s"]
    assert communication[1] == pytest.approx(communication[0])


def test_the_activations_peak_on_the_rank_whose_forwards_in_flight_times_its_layers_are_most() -> None:
    from orchestrator.engines.mesh3d.config import peak_rank_layers, stage_sizes
    from orchestrator.engines.mesh3d.pipeline import in_flight_stages

    # BLOOM: 70 layers in 12 stages of 5, ten of 6, 5 (the ends weighed for their vocabulary matrices). Under 1F1B
    # rank r keeps 12 - r forwards: the second rank's 11 of 6 layers beat the first's 12 of 5.
    sizes = stage_sizes(70, 12, 1.0)
    assert sizes == [5, *[6] * 10, 5]
    assert [in_flight_stages(12, 256, 1, "1f1b", r) for r in (0, 1, 11)] == [12, 11, 1]
    assert peak_rank_layers(70, 12, 1.0, 1, None, 256, "1f1b") == pytest.approx(11 * 6 / (12 * 70 / 12))
    # An even split peaks on the first rank, as in_flight_share counts it; with few micro-batches every rank
    # keeps them all, so the heaviest stage sets the peak.
    assert peak_rank_layers(8, 2, 0.0, 1, None, 8, "1f1b") == 1.0
    assert peak_rank_layers(8, 2, 0.0, 1, "3+5", 1, "1f1b") == pytest.approx(5 / 4)
    assert in_flight_stages(4, 8, 2, "interleaved_1f1b", 1) == in_flight_stages(4, 8, 2, "interleaved_1f1b", 0) - 2


TINY_TP = [MESH, "model=pythia-tiny", "num_gpus=2", "method.tp=2", "gpu=cpu"]


def test_every_tensor_rank_runs_the_whole_output_layer_unless_the_vocabulary_is_split(make_cell) -> None:
    # The share of the step that every tensor rank runs whole is the output layer's, as FlopCounterMode counts it
    # on the real module: parallelize.apply_tensor_parallel leaves the head whole without loss or sequence
    # parallelism, so the step's compute is (1 - s + t·s) times the even split's.
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from analysis.predict.inputs import flat_cell, inputs_from_columns, layout_terms
    from orchestrator.models import FAMILIES

    configs = [to_config(make_cell(*TINY_TP)), to_config(make_cell(*TINY_TP, "method.tp_loss_parallel=true")),
               to_config(make_cell(MESH, "model=pythia-tiny", "num_gpus=2", "gpu=cpu"))]  # fmt: skip
    rows = [flat_cell(c) for c in configs]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    stretch = layout_terms(x)["compute_stretch"]
    assert stretch[1] == stretch[2] == 1.0, "a split vocabulary, or no tensor ranks: the even split"

    model = configs[0].model
    family = FAMILIES[model.family]
    build = getattr(transformers, family.BUILDER.causal_lm_class)
    module = build._from_config(family.build_model_config(model, "eager"), attn_implementation="eager")
    batch = family.synthetic_batch(model, 2, torch.Generator().manual_seed(0), torch.float32)
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    # What the model runs outside its decoder stack: the output layer (the embedding is a lookup, no FLOPs).
    counts, name = counter.get_flop_counts(), type(module).__name__
    head = sum(counts[name].values()) - sum(counts[f"{name}.gpt_neox"].values())
    share = head / counter.get_total_flops()
    assert 0.1 < share < 0.3
    assert stretch[0] == pytest.approx(1.0 + (2 - 1) * share, rel=1e-9)
