"""The probe, for real on the CPU, on a tiny model of every family beyond the dense decoders, with both engines on
two ranks: each trains (its own batch: masked tokens, images with classes, routed tokens), is timed, and its
record gives throughput in the family's unit and says how the library ran it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_probe import CONF_DIR, run_probe_ranks

from orchestrator.planning.compose_cache import register_configs

TINY = {
    "roberta-tiny": "tokens",
    "mamba-tiny": "tokens",
    "olmoe-tiny": "tokens",
    "mixtral-tiny": "tokens",
    "vit-mini": "images",
    "convnext-mini": "images",
}
ENGINES = [pytest.param("deepspeed", marks=pytest.mark.deepspeed), pytest.param("fsdp", marks=pytest.mark.fsdp)]


def cell_of(model: str, engine: str) -> dict[str, Any]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        quick = ["probe=quick", "probe.min_steps=2", "probe.max_steps=3", "method.micro_batch_size=4"]
        cfg = compose(
            config_name="config",
            overrides=[f"model={model}", "gpu=cpu", "num_gpus=2", f"method.engine={engine}", *quick],
        )
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", sorted(TINY))
def test_every_family_trains_on_both_engines_with_its_own_unit(model: str, engine: str, tmp_path: Path) -> None:
    cell = cell_of(model, engine)
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    for result in results:
        assert result["status"] == "ok", (result["reason"], result["traceback"])
        m = result["metrics"]
        assert m["throughput_unit"] == TINY[model]
        assert m["samples_per_s"] > 0 and m["model_tflops_per_gpu"] > 0
        assert (m["micro_batch_size"], m["grad_accum_steps"]) == (4, 2)  # 16 samples over 2 ranks, 4 at a time
        if TINY[model] == "images":
            assert m["tokens_per_s"] is None and m["tokens_per_step"] is None, "an image classifier has no tokens"
        else:
            assert m["tokens_per_step"] == cell["model"]["global_batch_size"] * cell["model"]["seq_length"]
        implementation = result["environment"]["model_implementation"]
        if model == "mamba-tiny":
            assert implementation == {"mamba_scan": "reference"}
        if model in ("olmoe-tiny", "mixtral-tiny"):
            assert implementation["moe_experts"] in ("grouped_mm", "eager")
