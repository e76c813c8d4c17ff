"""The engine registry: every engine is found by its folder, owns its fields (refused under any other engine), its
label and its predictor terms; and an engine registered from outside the package (a third, made up here) is picked
up by the cells' checks, the labels and the predictor without a change anywhere else."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from analysis.predict.inputs import flat_cell, inputs_from_columns, memory_terms
from analysis.predict.predictor import predict_cell
from analysis.predict.step_time import step_terms
from analysis.report.scaling import sharding_label
from analysis.report.tables import engine_label, settings_label
from analysis.sweeps.catalog import Catalog
from orchestrator.cells import cell as cells
from orchestrator.cells import row as rows
from orchestrator.config.domains import domain_of
from orchestrator.config.refusal import Refusal
from orchestrator.config.schema import Config, MethodConfig, to_config
from orchestrator.engines import registry
from orchestrator.engines.memory import EXPANDABLE_OVERHEAD, GIB
from orchestrator.engines.registry import engine_folders
from orchestrator.engines.spec import MEMORY_HOLDERS, STEP_TIME_TERMS, EngineSpec, Links
from orchestrator.planning.plan import plan


@pytest.fixture(scope="module")
def base() -> Config:
    p = plan(["model=pythia-70m", "gpu=h100-80gb", "num_gpus=8", "cluster=slurm"], sweep_dir=None)
    (cell,) = p.cells + p.skipped
    return to_config(cell.config)


def with_method(config: Config, method_type: type[MethodConfig] = MethodConfig, **settings: Any) -> Config:
    fields = {f.name: getattr(config.method, f.name) for f in dataclasses.fields(MethodConfig)}
    return dataclasses.replace(config, method=method_type(**{**fields, **settings}))


PATTERN_EXAMPLES = {"pp_layers": "3+3"}
"""A value inside the domain of each method field that a pattern, not a list, declares."""


def off_default(key: str) -> Any:
    """A value of method field ``key`` other than its default, inside its domain."""
    default = MethodConfig.__dataclass_fields__[key].default
    if isinstance(default, bool):
        return not default
    domain = domain_of(MethodConfig, key)
    if domain is not None and not domain.choices and domain.integer:
        return int(default) + 1  # an integer field (mesh3d's sizes): the next one is in its domain
    if domain is not None and domain.pattern and key in PATTERN_EXAMPLES:
        return PATTERN_EXAMPLES[key]
    assert domain is not None and domain.choices, f"method.{key}: no domain to pick a value from"
    return next(v for v in domain.choices if v != default)


def test_every_engine_folder_is_registered_and_accepted_by_the_schema() -> None:
    assert registry.ENGINES == registry.engine_names() == engine_folders()
    assert set(registry.ENGINES) == set(domain_of(MethodConfig, "engine").choices), (
        "method.engine's domain must accept every engine folder"
    )
    assert registry.ENGINES[0] == MethodConfig.engine  # the default first
    for name in registry.ENGINES:
        spec = registry.engine_spec(name)
        assert spec.name == name and spec.fields and spec.not_fit_advice
        assert set(spec.fields) <= set(MethodConfig.__dataclass_fields__)
    owned = [key for spec in registry.engine_specs() for key in spec.fields]
    assert len(owned) == len(set(owned)), "a method field belongs to one engine"
    with pytest.raises(ValueError, match="accepted are deepspeed, fsdp"):
        registry.engine_spec("megatron")


@pytest.mark.parametrize(
    ("engine", "owner", "key"),
    [
        (engine, owner.name, key)
        for engine in registry.ENGINES
        for owner in registry.engine_specs()
        if owner.name != engine
        for key in owner.fields
    ],
)
def test_every_engines_fields_are_refused_under_another_engine(base: Config, engine: str, owner: str, key: str) -> None:
    value, default = off_default(key), MethodConfig.__dataclass_fields__[key].default
    refusals = [
        r for r in cells.check_runnable(with_method(base, engine=engine, **{key: value})) if r.key == f"method.{key}"
    ]
    assert refusals, f"method.{key}={value!r} accepted under method.engine={engine}"
    reason = refusals[0].reason
    assert registry.engine_spec(owner).setting in reason and repr(default) in reason, reason
    assert "method.engine=" in reason, reason


def test_an_engines_own_fields_are_not_refused_as_another_engines(base: Config) -> None:
    for spec in registry.engine_specs():
        for key in spec.fields:
            config = with_method(base, engine=spec.name, **{key: off_default(key)})
            assert not any("setting;" in r.reason for r in cells.check_runnable(config)), (spec.name, key)


def test_the_refusals_keep_their_words(base: Config) -> None:
    under_fsdp = cells.check_runnable(with_method(base, engine="fsdp", zero_stage=2))
    assert (
        Refusal(
            "method.zero_stage",
            "2 is a DeepSpeed setting; with method.engine=fsdp leave it at 0 and shard with method.fsdp_sharding "
            "(full, grad_op, none, hybrid) and offload with method.fsdp_offload=true",
        )
        in under_fsdp
    )
    under_deepspeed = cells.check_runnable(with_method(base, fsdp_reduce_precision="bf16"))
    assert under_deepspeed == [
        Refusal(
            "method.fsdp_reduce_precision",
            "'bf16' is an FSDP setting; use method.engine=fsdp, or leave it at 'fp32' with DeepSpeed "
            "(which shards with method.zero_stage)",
        )
    ]


LABELS = [
    ({"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": True, "offload_params": False}, "zero2 offload-opt"),
    ({"zero_stage": 3, "offload_optimizer": True, "offload_params": True}, "zero3 offload-opt offload-params"),
    ({"engine": None, "zero_stage": 1.0}, "zero1"),
    ({"engine": "deepspeed", "zero_stage": float("nan")}, "zero?"),
    ({"engine": "megatron", "zero_stage": 0}, "megatron zero0"),
    ({"engine": "fsdp", "fsdp_sharding": "grad_op", "fsdp_offload": True, "fsdp_reduce_precision": "bf16"},
     "fsdp-grad_op offload reduce-bf16"),
    ({"engine": "fsdp", "fsdp_sharding": "hybrid", "fsdp_offload": False, "fsdp_reduce_precision": "fp32"},
     "fsdp-hybrid"),
    ({"engine": "fsdp", "fsdp_sharding": None, "fsdp_offload": None, "fsdp_reduce_precision": None}, "fsdp-full"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "expected"), LABELS)
def test_labels_are_what_they_were(settings: dict[str, Any], expected: str) -> None:
    assert registry.method_label(settings) == expected == engine_label(settings)


def test_cell_and_table_labels_are_what_they_were(base: Config) -> None:
    assert cells.label(base) == "pythia-70m h100-80gb x8 zero0 bf16 mb=auto"
    zero3 = with_method(base, zero_stage=3, offload_optimizer=True, offload_params=True, activation_checkpointing=True)
    assert cells.label(zero3) == "pythia-70m h100-80gb x8 zero3 offload-opt offload-params ckpt bf16 mb=auto"
    fsdp = with_method(base, engine="fsdp", fsdp_sharding="grad_op", fsdp_offload=True, fsdp_reduce_precision="bf16")
    assert cells.label(fsdp) == "pythia-70m h100-80gb x8 fsdp-grad_op offload reduce-bf16 bf16 mb=auto"
    row = {**cells.settings(zero3), "micro_batch_size": 4, "grad_accum_steps": 2, "num_nodes": 2}
    assert settings_label(row) == "zero3 offload-opt offload-params ckpt mb4x2 bf16 2nodes"
    assert sharding_label(row) == "zero3 offload-opt offload-params"  # scaling's label is the engine's
    row = {**cells.settings(fsdp), "micro_batch_size": 8, "grad_accum_steps": 1}
    assert settings_label(row) == "fsdp-grad_op offload reduce-bf16 mb8x1 bf16"


COLUMNS: dict[str, list[Any]] = {
    "model_family": ["gpt_neox"] * 3, "model_num_layers": [6] * 3, "model_hidden_size": [512] * 3,
    "model_num_heads": [8] * 3, "model_vocab_size": [50304] * 3, "model_seq_length": [2048] * 3,
    "model_global_batch_size": [1024] * 3, "gpu": ["h100-80gb"] * 3, "gpu_architecture": ["hopper"] * 3,
    "gpu_memory_gib": [80] * 3, "gpu_peak_tflops_bf16": [989.0] * 3, "num_gpus": [16] * 3, "num_nodes": [2] * 3,
    "zero_stage": [3, 3, 3], "offload_optimizer": [True] * 3, "offload_params": [True] * 3,
    "fsdp_sharding": ["hybrid"] * 3, "fsdp_offload": [True] * 3, "precision": ["bf16"] * 3,
}  # fmt: skip


@pytest.mark.parametrize("spec", registry.engine_specs(), ids=lambda s: s.name)
def test_every_engine_gives_every_memory_and_step_time_term(spec: EngineSpec) -> None:
    x = inputs_from_columns({**COLUMNS, "engine": [spec.name] * 3}, 3)
    links = Links(np.full(3, 3e11), 1.2e10, np.full(3, 4e10), 1e9)
    memory = spec.memory_terms(x)
    step = spec.step_time_terms(x, np.full(3, 4.0), links)
    assert set(memory) == set(MEMORY_HOLDERS) and set(step) == set(STEP_TIME_TERMS)
    for value in (*memory.values(), *step.values()):
        assert np.shape(value) == (3,) and np.all(np.isfinite(value)) and np.all(np.asarray(value) >= 0)
    assert np.all(step["communication_s"] + step["overlappable_s"] > 0)  # 2 nodes
    # offload on, for the engines that offload (mesh3d has none: it fits by splitting the model instead)
    assert np.all(step["offload_s"] > 0) or "offload" not in spec.not_fit_advice


def test_the_specs_and_the_checks_import_no_numerics() -> None:
    code = (
        "import sys, orchestrator.cells.cell, orchestrator.engines.registry; "
        "print(sorted(m for m in ('numpy', 'torch', 'pandas', 'deepspeed') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- a third engine, registered from outside orchestrator/engines/ ----------------------------------------------


@dataclasses.dataclass
class PipeMethod(MethodConfig):
    """MethodConfig with the made-up engine's one field."""

    pipe_stages: int = 1


def _pipe_check(cell: Config) -> list[Refusal]:
    stages = getattr(cell.method, "pipe_stages", 1)
    return [] if cell.num_gpus % stages == 0 else [Refusal("method.pipe_stages", "must divide num_gpus")]


def _pipe_label(settings: Mapping[str, Any]) -> str:
    return f"pipe{settings.get('pipe_stages')}"


PIPE_BYTES = 7.0 * 2**30
"""Bytes per GPU of each holder with one pipeline stage; ``pipe_stages`` divides them."""
PIPE_SECONDS = 0.125
"""Seconds of each step-time term with one pipeline stage; ``pipe_stages`` multiplies them."""

PIPE = EngineSpec(
    name="pipe",
    setting="a pipeline setting",
    fields=("pipe_stages",),
    check=_pipe_check,
    foreign=lambda owner, value, default: (
        f"{value!r} is {owner.setting}; with method.engine=pipe leave it at {default!r}"
    ),
    label=_pipe_label,
    memory_terms=lambda x: {k: PIPE_BYTES / x.method["pipe_stages"] for k in MEMORY_HOLDERS},
    step_time_terms=lambda x, accum, links: {
        k: PIPE_SECONDS * x.method["pipe_stages"] * (k in ("communication_s", "offload_s")) for k in STEP_TIME_TERMS
    },
    not_fit_advice="more pipeline stages",
)


@pytest.fixture
def pipe() -> Any:
    with registry.registered(PIPE, PipeMethod) as spec:
        yield spec
    assert "pipe" not in registry.engine_names() and registry.method_type() is MethodConfig


def test_a_third_engine_is_checked_against_the_others_and_they_against_it(base: Config, pipe: EngineSpec) -> None:
    assert registry.engine_names() == (*registry.ENGINES, "pipe") and registry.engine_spec("pipe") is pipe
    assert "pipe_stages" in registry.identity_keys_if_set()
    piped = with_method(base, PipeMethod, engine="pipe", pipe_stages=3, zero_stage=2, fsdp_offload=True)
    refused = {r.key: r.reason for r in cells.check_runnable(piped)}
    assert refused["method.zero_stage"] == "2 is a DeepSpeed setting; with method.engine=pipe leave it at 0"
    assert refused["method.fsdp_offload"] == "True is an FSDP setting; with method.engine=pipe leave it at False"
    assert refused["method.pipe_stages"] == "must divide num_gpus"  # its own check: 8 GPUs, 3 stages
    for engine in ("deepspeed", "fsdp"):
        other = with_method(base, PipeMethod, engine=engine, pipe_stages=2)
        (refusal,) = [r for r in cells.check_runnable(other) if r.key == "method.pipe_stages"]
        assert "2 is a pipeline setting" in refusal.reason and "leave it at 1" in refusal.reason
    assert cells.check_runnable(with_method(base, PipeMethod, engine="pipe", pipe_stages=4)) == []


def test_a_third_engine_labels_its_cells(base: Config, pipe: EngineSpec) -> None:
    piped = with_method(base, PipeMethod, engine="pipe", pipe_stages=4)
    assert cells.label(piped) == "pythia-70m h100-80gb x8 pipe4 bf16 mb=auto"
    assert settings_label({"engine": "pipe", "pipe_stages": 4, "precision": "bf16"}) == "pipe4 bf16"


def test_the_predictor_takes_a_third_engines_terms_for_its_cells_only(pipe: EngineSpec) -> None:
    engines = ["deepspeed", "pipe", "fsdp"]
    x = inputs_from_columns({**COLUMNS, "engine": engines}, 3)
    accum = np.full(3, 4.0)
    memory, step = memory_terms(x), step_terms(x, accum)
    with_pipe = {k: memory[k][1] for k in MEMORY_HOLDERS}
    assert with_pipe == dict.fromkeys(MEMORY_HOLDERS, PIPE_BYTES)
    assert list(step[1, 1:3]) == [PIPE_SECONDS, PIPE_SECONDS]
    for row, engine in ((0, "deepspeed"), (2, "fsdp")):
        alone = inputs_from_columns({**COLUMNS, "engine": [engine] * 3}, 3)
        assert {k: memory[k][row] for k in memory} == {k: v[row] for k, v in memory_terms(alone).items()}
        assert list(step[row]) == list(step_terms(alone, accum)[row])


def test_a_third_engines_field_reaches_the_inputs_the_table_the_labels_and_its_terms(
    base: Config, pipe: EngineSpec
) -> None:
    # The predictor's inputs: a number array under the field's name, its default (1) where a cell has none.
    x = inputs_from_columns({**COLUMNS, "engine": ["pipe"] * 3, "pipe_stages": [4, None, "two"]}, 3)
    assert x.method["pipe_stages"].dtype == float and list(x.method["pipe_stages"]) == [4.0, 1.0, 1.0]
    # Its terms read it there.
    memory, step = memory_terms(x), step_terms(x, np.full(3, 4.0))
    assert list(memory["params"]) == [PIPE_BYTES / 4, PIPE_BYTES, PIPE_BYTES]
    assert list(step[:, 1]) == [PIPE_SECONDS * 4, PIPE_SECONDS, PIPE_SECONDS]
    # The cells table: converted by its declared kind (int), from the config or the record's settings; empty
    # (not applicable) in another engine's row, as FSDP's fields are in a DeepSpeed cell's.
    catalog = Catalog()

    def table_row(method: dict[str, Any], settings: dict[str, Any] | None = None) -> dict[str, Any]:
        cell, _ = catalog.cell({"method": method}, settings or {})  # a damaged record: read leniently
        return rows.row(cell)

    assert table_row({"engine": "pipe", "pipe_stages": "4"})["pipe_stages"] == 4
    assert table_row({}, {"engine": "pipe", "pipe_stages": 2.0})["pipe_stages"] == 2
    under_fsdp = table_row({"engine": "fsdp", "fsdp_sharding": "grad_op", "pipe_stages": 4})
    assert under_fsdp["pipe_stages"] is None and under_fsdp["fsdp_sharding"] == "grad_op"
    assert table_row({"pipe_stages": 4})["pipe_stages"] is None  # no engine: the default one
    # The labels: best.csv's settings and scaling.csv's sharding.
    row = {"engine": "pipe", "pipe_stages": 4, "precision": "bf16", "micro_batch_size": 2, "grad_accum_steps": 8}
    assert settings_label(row) == "pipe4 mb2x8 bf16" and sharding_label(row) == "pipe4"
    # A whole cell, as `gpudays plan` predicts it (typed: MethodConfig has no pipe_stages for to_config to read).
    piped = with_method(base, PipeMethod, engine="pipe", pipe_stages=2)
    assert flat_cell(piped)["pipe_stages"] == 2
    prediction = predict_cell(piped, micro_batch_size=1)
    assert prediction.params_gib == pytest.approx(
        PIPE_BYTES / 2 * EXPANDABLE_OVERHEAD / GIB
    )  # a planned cell: the probe's allocator
    assert prediction.offloaded_gib == pytest.approx(PIPE_BYTES / 2 / GIB)


def test_an_engine_registered_from_outside_declares_its_fields() -> None:
    with pytest.raises(ValueError, match="pipe_stages not fields of MethodConfig"), registry.registered(PIPE):
        pass
    assert "pipe" not in registry.engine_names() and registry.method_type() is MethodConfig


def test_a_compile_scope_an_engine_does_not_compile_is_refused_naming_what_it_does(base: Config) -> None:
    whole = with_method(base, compile=True, compile_scope="whole")
    assert "method.compile_scope" not in {r.key for r in cells.check_runnable(whole)}, "DeepSpeed compiles whole"
    for engine in ("fsdp", "mesh3d"):
        refusals = [
            r for r in cells.check_runnable(with_method(whole, engine=engine)) if r.key == "method.compile_scope"
        ]
        assert len(refusals) == 1 and f"method.engine={engine}" in refusals[0].reason, refusals
        assert "use regional" in refusals[0].reason
        regional = with_method(base, engine=engine, compile=True)
        assert "method.compile_scope" not in {r.key for r in cells.check_runnable(regional)}
    # A scope without compile says nothing: refused, naming the fix.
    (alone,) = [
        r for r in cells.check_runnable(with_method(base, compile_scope="whole")) if r.key == "method.compile_scope"
    ]
    assert "method.compile=true" in alone.reason


def test_the_compile_scope_joins_id_and_label_only_where_it_is_not_the_default(base: Config) -> None:
    compiled = with_method(base, compile=True)
    assert cells.cell_id(with_method(base, compile=True, compile_scope="regional")) == cells.cell_id(compiled)
    whole = with_method(base, compile=True, compile_scope="whole")
    assert cells.cell_id(whole) != cells.cell_id(compiled)
    assert "compile-whole" in cells.label(whole) and "compile-whole" not in cells.label(compiled)
    assert settings_label({**flat_cell(dataclasses.asdict(whole)), "compile": True}).count("compile-whole") == 1
    assert flat_cell(dataclasses.asdict(base))["compile_scope"] is None, "empty where nothing is compiled"
    assert cells.settings(compiled)["compile_scope"] == "regional" and cells.settings(base)["compile_scope"] is None
