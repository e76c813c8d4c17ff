"""Every registered family provides the whole Family protocol, and every shipped model plans under its family."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from orchestrator.models import FAMILIES, Family, LanguageFamily, language_families
from orchestrator.planning.plan import plan

CONF_MODELS = sorted((Path(__file__).resolve().parents[3] / "conf" / "model").glob("*.yaml"))
PROTOCOL = [name for name, _ in inspect.getmembers(Family, inspect.isfunction) if not name.startswith("_")]
PER_TOKEN = [
    name
    for name, _ in inspect.getmembers(LanguageFamily, inspect.isfunction)
    if not name.startswith("_") and name not in PROTOCOL
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_provides_the_protocol_with_its_parameters(family: str) -> None:
    module = FAMILIES[family]
    assert (module.SAMPLE, module.THROUGHPUT_UNIT) in {("sequence", "tokens"), ("image", "images")}, family
    language = family in language_families()
    assert language == (module.SAMPLE == "sequence"), family
    for name in PROTOCOL + (PER_TOKEN if language else []):
        assert hasattr(module, name), f"{family} lacks {name}"
        wanted = list(inspect.signature(getattr(LanguageFamily, name)).parameters)[1:]
        got = list(inspect.signature(getattr(module, name)).parameters)
        assert got[: len(wanted)] == wanted, f"{family}.{name}{got} does not take {wanted}"


def test_every_shipped_model_names_a_known_family() -> None:
    for path in CONF_MODELS:
        family = (yaml.safe_load(path.read_text()) or {}).get("family", "gpt_neox")
        assert family in FAMILIES, f"{path.name}: family {family!r}"


def test_a_grid_can_mix_families_and_every_cell_gets_a_prediction() -> None:
    p = plan(["model=smollm2-135m,pythia-160m,qwen3-0.6b,olmo2-1b", "gpu=h100-80gb", "num_gpus=8"], sweep_dir=None)
    assert len(p.cells) == 4
    from orchestrator.cli.display.prediction import predict

    predict(p, run_anyway=True)
    for cell in p.cells:
        assert cell.prediction["predicted_step_time_s"] > 0, cell.label
        assert cell.prediction["predicted_peak_memory_gib"] > 0, cell.label


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model=pythia-410m", "model.num_heads=7"], "model.num_heads"),
        (["model=pythia-410m", "model.num_kv_heads=4", "model.num_parameters=null"], "model.num_kv_heads"),
        (["model=smollm2-135m", "model.num_kv_heads=4"], "model.num_kv_heads"),
    ],
)
def test_a_shape_the_module_cannot_build_is_refused_at_planning(overrides: list[str], key: str) -> None:
    from orchestrator.planning.plan import SweepError

    with pytest.raises(SweepError, match=key):
        plan(["gpu=h100-80gb", *overrides], sweep_dir=None)


def test_the_scaling_law_planners_refuse_other_families_by_name_and_leave_them_out_of_their_defaults() -> None:
    from orchestrator.cli.budget import _models
    from orchestrator.models import SCALING_LAW_FAMILIES

    with pytest.raises(ValueError) as err:
        _models("vit-b16,roberta-base,pythia-160m", None, default_all=False)
    for words in ("'vit-b16' is of family 'vit'", "'roberta-base' is of family 'roberta'", "gpt_neox, llama"):
        assert words in str(err.value)
    assert "pythia-160m" not in str(err.value)
    defaults = _models(None, None, default_all=True)
    assert defaults and {m.family for m in defaults} <= set(SCALING_LAW_FAMILIES)
