"""The FSDP and mesh3d engines build on the meta device and give each rank only its shards: every shard, gathered,
holds exactly what the unsplit model holds (same seed, same values), on four ranks over gloo, under FSDP (full
sharding) and under mesh3d (tensor and pipeline parallelism, a tied output layer copied onto the last stage; tensor
parallelism beside FSDP's data parallelism, each weight split over both)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import forked_ranks
import pytest
import torch
from test_probe import _free_port, compose_cell

from orchestrator.config.batch import BatchPlan
from orchestrator.config.schema import to_config
from orchestrator.engines.base import create_engine
from orchestrator.engines.materialising import materialised

WORLD = 4
CELLS = {
    "fsdp": ("method.engine=fsdp", "method.fsdp_sharding=full"),
    "mesh3d-tp-pp": ("method.engine=mesh3d", "method.tp=2", "method.pp=2", "method.pp_microbatches=2"),
    "mesh3d-tp-dp": ("method.engine=mesh3d", "method.tp=2"),
}


def _stage_names(engine: Any) -> list[tuple[str, Any]]:
    """A mesh3d rank's parameters with their names in the unsplit model."""
    layers = engine.layout.stage_layers(engine.config.model.num_layers)
    out = []
    for index, stage in engine.stages:
        for name, param in stage.named_parameters():
            part, _, rest = name.partition(".")
            if part == "layers":
                i, _, rest = rest.partition(".")
                prefix = f"model.layers.{layers[index][int(i)]}"
            else:
                prefix = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}[part]
            out.append((f"{prefix}.{rest}", param))
    return out


def _rank(rank: int, port: int, cells: dict[str, dict[str, Any]], out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    lines = []
    for kind, cell in cells.items():
        config = to_config(cell)
        whole = dict(materialised(config, torch.device("cpu")).named_parameters(remove_duplicate=False))
        engine: Any = create_engine(config, torch.device("cpu"), rank)
        engine.build(BatchPlan(config.model.global_batch_size, getattr(engine, "batch_split", WORLD), 1))
        params = _stage_names(engine) if kind.startswith("mesh3d") else list(engine.module.named_parameters())
        assert params and all(isinstance(p, torch.distributed.tensor.DTensor) for _, p in params)
        held = sum(p.to_local().numel() for _, p in params)
        assert held < sum(p.numel() for p in set(whole.values())) / 2, f"{kind}: rank {rank} holds {held}"
        for name, param in params:
            assert torch.equal(param.full_tensor(), whole[name]), f"{kind} {name}: differs from the unsplit model's"
        lines.append(f"{kind} {len(params)}")
        engine.release()
    dist.destroy_process_group()
    Path(out, f"rank{rank}").write_text("\n".join(lines))


@pytest.mark.fsdp
@pytest.mark.mesh3d
def test_every_shard_holds_the_unsplit_models_values(tmp_path: Path) -> None:
    # smollm2-tiny ties its output layer to the embedding; 2 key/value heads split over 2 tensor ranks.
    cells = {kind: compose_cell("model=smollm2-tiny", "num_gpus=4", *o) for kind, o in CELLS.items()}
    forked_ranks.spawn(_rank, (_free_port(), cells, str(tmp_path)), nprocs=WORLD)
    for rank in range(WORLD):
        assert [line.split()[0] for line in (tmp_path / f"rank{rank}").read_text().splitlines()] == list(CELLS)
