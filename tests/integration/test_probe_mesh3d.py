"""The probe with the mesh3d engine on the CPU over gloo, each rank a process as the job runs it: tensor and
pipeline parallelism together on a 2 × 1 × 2 mesh, the interleaved schedule with a tied output layer (compiled), tensor
parallelism beside FSDP2's data parallelism with accumulation and checkpointing. Mirrors
tests/integration/test_probe_fsdp.py.

What the CPU cannot show: tensor parallelism's all-reduces over NVLink, and stages on different nodes (the SLURM
cluster's two nodes; not run here).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import forked_ranks
import pytest
from test_probe import compose_cell, run_probe_ranks

pytestmark = pytest.mark.mesh3d


def mesh_cell(*overrides: str) -> dict[str, Any]:
    return compose_cell("method.engine=mesh3d", *overrides)


def assert_measured_on_the_mesh(results: list[dict[str, Any]], cell: dict[str, Any], split: int) -> dict[str, Any]:
    """What every mesh3d record must say: ok on every rank with the same decisions, the batch split ``split`` ways
    a micro-step, a finite loss near ln(vocabulary) on every rank (the last stage's, shared), the mesh."""
    first = results[0]
    assert first["status"] == "ok", (first["reason"], first["traceback"])
    m = first["metrics"]
    batch = cell["model"]["global_batch_size"]
    assert m["per_gpu_batch_size"] == batch // split
    assert m["micro_batch_size"] * m["grad_accum_steps"] == m["per_gpu_batch_size"]
    assert m["tokens_per_step"] == batch * cell["model"]["seq_length"]
    assert m["num_parameters"] == cell["model"]["num_parameters"] or cell["model"]["num_parameters"] is None
    for other in results:
        assert other["status"] == "ok"
        o = other["metrics"]
        assert (o["micro_batch_size"], o["step_times_s"]) == (m["micro_batch_size"], m["step_times_s"])
        assert math.isfinite(o["final_loss"]) and abs(o["final_loss"] - math.log(cell["model"]["vocab_size"])) < 2
    env = first["environment"]
    assert env["engine"] == "mesh3d" and env["world_size"] == cell["num_gpus"]
    return dict(env["mesh3d"])


def test_tensor_and_pipeline_parallel_on_four_ranks(tmp_path: Path) -> None:
    cell = mesh_cell("num_gpus=4", "method.tp=2", "method.pp=2", "method.pp_microbatches=4")
    results = run_probe_ranks(cell, tmp_path, world_size=4)
    mesh = assert_measured_on_the_mesh(results, cell, split=1 * 4)  # one replica, four pipeline micro-batches
    assert mesh["mesh_shape"] == [2, 1, 2] and mesh["mesh_dim_names"] == ["pp", "dp", "tp"]
    assert mesh["pp_schedule"] == "1f1b" and mesh["pp_stages"] == 2
    assert mesh["bubble_predicted"] == pytest.approx(1 / 5)
    assert 0.0 < mesh["bubble_measured"] < 1.0, "the first stage waits for the last one's backward"


def test_interleaved_schedule_with_a_tied_output_layer(tmp_path: Path) -> None:
    # smollm2-tiny ties its output layer to the embedding; four layers make two stages on each of two ranks.
    # Compiled (fp32: Inductor's CPU backend fails on these models in bf16): each stage's blocks and the loss.
    cell = mesh_cell(
        "model=smollm2-tiny", "model.num_layers=4", "model.num_parameters=null", "num_gpus=2", "method.pp=2",
        "method.pp_schedule=interleaved_1f1b", "method.pp_microbatches=4", "method.micro_batch_size=2",
        "method.compile=true", "method.precision=fp32",
    )  # fmt: skip
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    mesh = assert_measured_on_the_mesh(results, cell, split=4)
    assert results[0]["environment"]["compile_scope"] == "regional"
    assert (results[0]["metrics"]["micro_batch_size"], results[0]["metrics"]["grad_accum_steps"]) == (2, 2)
    assert mesh["pp_stages"] == 4 and mesh["bubble_predicted"] == pytest.approx(1 / 9)
    assert mesh["bubble_measured"] is not None


def test_tensor_parallel_beside_data_parallel_accumulating_with_checkpointing(tmp_path: Path) -> None:
    # smollm2-tiny: grouped-query attention, 2 key/value heads split over 2 tensor ranks. The two replicas are
    # two HSDP groups (method.dp_replicate=2): FSDP2 on a 2 x 1 data mesh, replicated across, sharded inside.
    cell = mesh_cell(
        "model=smollm2-tiny", "num_gpus=4", "method.tp=2", "method.activation_checkpointing=true",
        "method.micro_batch_size=2", "method.dp_replicate=2",
    )  # fmt: skip
    results = run_probe_ranks(cell, tmp_path, world_size=4)
    mesh = assert_measured_on_the_mesh(results, cell, split=2)  # two replicas, no pipeline
    assert (results[0]["metrics"]["micro_batch_size"], results[0]["metrics"]["grad_accum_steps"]) == (2, 4)
    assert mesh["mesh_shape"] == [1, 2, 2] and mesh["bubble_measured"] is None and mesh["bubble_predicted"] == 0
    assert mesh["data_mesh"] == [2, 1] and mesh["checkpoint_policy"] == "full"
    m = results[0]["metrics"]
    assert m["hardware_tflops_per_gpu"] > m["model_tflops_per_gpu"], "checkpointing reruns the layers"


def test_an_uneven_pipeline_split_computes_what_the_whole_model_does() -> None:
    # Five layers in three stages (the cost balance gives the ends fewer: their vocabulary matrices weigh on them),
    # run one after the other in one process: the same loss and the same gradients as the unsplit model.
    import torch

    from orchestrator.config.schema import to_config
    from orchestrator.engines.mesh3d.config import end_weight, layout_of, stage_sizes
    from orchestrator.engines.mesh3d.parallelize import split_stages
    from orchestrator.models import family_module

    cfg = to_config(mesh_cell("model.num_layers=5", "model.num_parameters=null", "num_gpus=3", "method.pp=3"))
    model, weight = cfg.model, end_weight(cfg.model)
    assert stage_sizes(5, 3, weight) != [5 // 3] * 3 and sum(stage_sizes(5, 3, weight)) == 5
    torch.manual_seed(0)
    whole = family_module(model.family).build_model(model, "eager", torch.float32, torch.device("cpu"))
    tokens = torch.randint(0, model.vocab_size, (2, 16))

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    expected = loss_of(whole(tokens).logits)
    expected.backward()
    grads = {name: p.grad.clone() for name, p in whole.named_parameters() if p.grad is not None}
    whole.zero_grad()
    layout = layout_of(cfg.method, 3)
    stages = [stage for rank in range(3) for _, stage in split_stages(whole, layout, rank, 5, weight)]
    assert [len(s.layers) for s in stages] == stage_sizes(5, 3, weight)
    h = tokens
    for stage in stages:
        h = stage(h)
    got = loss_of(h)
    got.backward()
    torch.testing.assert_close(got, expected)
    for name, p in whole.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


def _tensor_parallel_rank(rank: int, port: int, cell: dict[str, Any], out: str) -> None:
    """One of two tensor ranks: the unsplit model's loss and gradients, then the split stage's, written side by
    side (the gradients gathered) for the test to compare."""
    import copy
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from orchestrator.config.schema import to_config
    from orchestrator.engines.mesh3d.config import SP_PLANS, TP_PLANS, layout_of
    from orchestrator.engines.mesh3d.engine import next_token_loss
    from orchestrator.engines.mesh3d.parallelize import (
        apply_tensor_parallel,
        loss_context,
        selective_checkpointing,
        split_stages,
    )
    from orchestrator.models import enable_activation_checkpointing, family_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = to_config(cell)
    model, method = cfg.model, cfg.method
    torch.manual_seed(0)
    whole = family_module(model.family).build_model(model, "eager", torch.float32, torch.device("cpu"))
    split = copy.deepcopy(whole)
    tokens = torch.randint(0, model.vocab_size, (2, 16))
    expected = next_token_loss(whole(tokens).logits, tokens)
    expected.backward()
    names = {id(m): n for n, m in split.named_modules()}
    runs = [0]
    if method.activation_checkpointing:  # as the engine does: before the split, selective where asked
        assert method.checkpoint_policy == "selective"
        enable_activation_checkpointing(split, selective_checkpointing())
        split.train()
        split.get_decoder().layers[0].input_layernorm.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    ((_, stage),) = split_stages(split, layout_of(method, 2), 0, model.num_layers)
    sequence = SP_PLANS[model.family] if method.tp_sequence_parallel else None
    mesh = init_device_mesh("cpu", (2,))
    apply_tensor_parallel(stage, TP_PLANS[model.family], mesh, method.tp_loss_parallel, sequence)
    with loss_context(method.tp_loss_parallel):
        got = next_token_loss(stage(tokens), tokens)
        got.backward()
    grads = {}
    for module in stage.modules():
        for name, p in module.named_parameters(recurse=False):
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grads[f"{names[id(module)]}.{name}"] = grad
    sharded = isinstance(stage.head.weight, DTensor) and isinstance(stage.embed.weight, DTensor)
    whole_grads = {n: p.grad for n, p in whole.named_parameters()}
    torch.save({"loss": (got.full_tensor() if isinstance(got, DTensor) else got).detach(), "expected": expected.detach(),
                "grads": grads, "whole_grads": whole_grads, "vocabulary_split": sharded, "norm_runs": runs[0]},
               Path(out, f"rank{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


SELECTIVE = ("method.activation_checkpointing=true", "method.checkpoint_policy=selective")


@pytest.mark.parametrize(
    "settings", [("method.tp_loss_parallel=true",), ("method.tp_sequence_parallel=true", *SELECTIVE)]
)
def test_tensor_parallel_computes_what_the_whole_model_does(tmp_path: Path, settings: tuple[str, ...]) -> None:
    # Two tensor ranks over gloo, no pipeline: the split stage's loss and every gradient (gathered) are the
    # unsplit model's with the vocabulary split (row-parallel embedding, column-parallel output layer, the loss on
    # the sharded logits) and with the sequence split between the blocks (sequence parallelism), there with
    # selective checkpointing recomputing each layer's operators but its matrix products and attention.
    import torch
    from test_probe import _free_port

    cell = mesh_cell("num_gpus=2", "method.tp=2", "method.precision=fp32", *settings)
    forked_ranks.spawn(_tensor_parallel_rank, (_free_port(), cell, str(tmp_path)), nprocs=2)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["vocabulary_split"], "the embedding and the output layer split over the vocabulary"
        if SELECTIVE[1] in settings:
            assert got["norm_runs"] == 2, "the first layer's norm ran in the forward and again in the backward"
        torch.testing.assert_close(got["loss"], got["expected"])
        assert set(got["grads"]) == set(got["whole_grads"])
        for name, grad in got["grads"].items():
            torch.testing.assert_close(grad, got["whole_grads"][name], msg=name)


def _hsdp_rank(rank: int, port: int, cell: dict[str, Any], out: str) -> None:
    """One of four data-parallel ranks in two HSDP groups of two (``method.dp_replicate=2``): the unsplit model's
    loss and gradients over the four ranks' sequences, then this rank's loss and its sharded gradients
    (gathered), written side by side."""
    import copy
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    from orchestrator.config.schema import to_config
    from orchestrator.engines.mesh3d.config import data_mesh, layout_of
    from orchestrator.engines.mesh3d.engine import DATA_DIMS, next_token_loss
    from orchestrator.engines.mesh3d.parallelize import apply_fsdp, split_stages
    from orchestrator.models import family_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    world = 4
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = to_config(cell)
    model, method = cfg.model, cfg.method
    torch.manual_seed(0)
    whole = family_module(model.family).build_model(model, "eager", torch.float32, torch.device("cpu"))
    split = copy.deepcopy(whole)
    tokens = torch.randint(0, model.vocab_size, (2 * world, 16))
    expected = next_token_loss(whole(tokens).logits, tokens)
    expected.backward()
    layout = layout_of(method, world)
    shape = data_mesh(layout, method.dp_replicate)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=DATA_DIMS[len(shape) - 1])
    ((_, stage),) = split_stages(split, layout, 0, model.num_layers)
    apply_fsdp(stage, mesh, MixedPrecisionPolicy(), pipelined=False)
    got = next_token_loss(stage(tokens[2 * rank : 2 * rank + 2]), tokens[2 * rank : 2 * rank + 2])
    got.backward()
    names = {id(p): n for n, p in whole.named_parameters()}
    plain = dict(zip(whole.parameters(), split.parameters(), strict=True))
    grads = {}
    for w, p in plain.items():
        grads[names[id(w)]] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
    losses = [torch.zeros(()) for _ in range(world)]
    dist.all_gather(losses, got.detach())
    placements = {str(p.placements) for p in stage.parameters() if isinstance(p, DTensor)}
    torch.save({"loss": torch.stack(losses).mean(), "expected": expected.detach(), "grads": grads, "shape": shape,
                "placements": placements, "whole_grads": {n: p.grad for n, p in whole.named_parameters()}},
               Path(out, f"rank{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


def test_hsdp_computes_what_the_whole_model_does(tmp_path: Path) -> None:
    # Four ranks over gloo, two replica groups of two shards: the mean of the ranks' losses and every gradient
    # (reduce-scattered in a group, all-reduced across the groups, gathered) are the unsplit model's on all the
    # sequences.
    import torch
    from test_probe import _free_port

    cell = mesh_cell("num_gpus=4", "method.dp_replicate=2", "method.precision=fp32")
    forked_ranks.spawn(_hsdp_rank, (_free_port(), cell, str(tmp_path)), nprocs=4)
    for rank in range(4):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["shape"] == (2, 2) and got["placements"] == {"(Replicate(), Shard(dim=0))"}
        torch.testing.assert_close(got["loss"], got["expected"])
        assert set(got["grads"]) == set(got["whole_grads"])
        for name, grad in got["grads"].items():
            torch.testing.assert_close(grad, got["whole_grads"][name], msg=name)


def _pipeline_rank(rank: int, port: int, cell: dict[str, Any], out: str) -> None:
    """One of two pipeline ranks running the cell's schedule over its stages (FSDP2 over one replica and the
    schedule as the engine builds them), and the unsplit model on the whole batch: losses and gradients side by
    side."""
    import copy
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    from orchestrator.config.schema import to_config
    from orchestrator.engines.mesh3d.config import end_weight, layout_of
    from orchestrator.engines.mesh3d.engine import next_token_loss
    from orchestrator.engines.mesh3d.parallelize import apply_fsdp, build_schedule, split_stages
    from orchestrator.models import family_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = to_config(cell)
    model, layout = cfg.model, layout_of(cfg.method, 2)
    torch.manual_seed(0)
    whole = family_module(model.family).build_model(model, "eager", torch.float32, torch.device("cpu"))
    split = copy.deepcopy(whole)
    tokens = torch.randint(0, model.vocab_size, (2 * layout.microbatches, 16))
    expected = next_token_loss(whole(tokens).logits, tokens)
    expected.backward()
    names = {id(m): n for n, m in split.named_modules()}
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("pp", "dp"))
    stages = split_stages(split, layout, rank, model.num_layers, end_weight(model))
    for _, stage in stages:
        apply_fsdp(stage, mesh["dp"], MixedPrecisionPolicy(param_dtype=torch.float32), pipelined=True)
    _, schedule = build_schedule(stages, layout, mesh.get_group("pp"), torch.device("cpu"), next_token_loss)
    losses: list[torch.Tensor] = []
    schedule.step(tokens, target=tokens, losses=losses) if rank == 0 else schedule.step(target=tokens, losses=losses)
    grads = {}
    for _, stage in stages:
        for module in stage.modules():
            for name, p in module.named_parameters(recurse=False):
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[f"{names[id(module)]}.{name}"] = grad
    whole_grads = {n: p.grad for n, p in whole.named_parameters()}
    layers = [len(stage.layers) for _, stage in stages]
    torch.save({"losses": [x.detach() for x in losses], "expected": expected.detach(), "grads": grads,
                "whole_grads": whole_grads, "layers": layers}, Path(out, f"rank{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


def test_an_interleaved_zero_bubble_pipeline_computes_what_the_whole_model_does(tmp_path: Path) -> None:
    # Two pipeline ranks of three stages each (looped: rank 0 holds stages 0, 2, 4), the layers as the user split
    # them, the backward split into input and weight gradients: the mean of the micro-batches' losses and every
    # gradient are the unsplit model's on the whole batch.
    import torch
    from test_probe import _free_port

    cell = mesh_cell(
        "model.num_layers=8", "model.num_parameters=null", "num_gpus=2", "method.pp=2",
        "method.pp_schedule=interleaved_zb", "method.pp_chunks=3", "method.pp_layers=1+2+1+1+2+1",
        "method.pp_microbatches=4", "method.precision=fp32",
    )  # fmt: skip
    forked_ranks.spawn(_pipeline_rank, (_free_port(), cell, str(tmp_path)), nprocs=2)
    first, last = (torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2))
    assert first["layers"] == [1, 1, 2] and last["layers"] == [2, 1, 1]
    assert first["losses"] == [] and len(last["losses"]) == 4
    torch.testing.assert_close(torch.stack(last["losses"]).mean(), last["expected"])
    grads = {**first["grads"], **last["grads"]}
    assert set(grads) == set(first["whole_grads"])
    for name, grad in grads.items():
        torch.testing.assert_close(grad, first["whole_grads"][name], msg=name)
