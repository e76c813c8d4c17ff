"""One flattener: every table of cells takes a cell's columns from ``orchestrator.cells.row.row`` of the typed cell.

The plan's rows (``gpudays plan``), the cells table that cells.csv is written from (``analysis.sweeps.records``) and
the predictor's inputs (``analysis.predict.inputs.flat_cell``) of the same cell agree on every column they share;
a record's config is read as the typed cell, and only a damaged one, or one of an older schema, leniently.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import synthetic

from analysis.predict.inputs import flat_cell
from analysis.sweeps.catalog import Catalog, stored_cell
from analysis.sweeps.records import load_cells
from orchestrator.cells import row as rows
from orchestrator.cli.display.prediction import predict
from orchestrator.cli.display.views import plan_rows
from orchestrator.config.schema import to_config, to_container
from orchestrator.engines.allocator import DEFAULT_CUDA_ALLOC_CONF
from orchestrator.planning.plan import plan


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _same(a: object, b: object) -> bool:
    """Equal, or both missing (None, NaN, NA): a table's empty cell."""
    if a is None or b is None or a is pd.NA or b is pd.NA:
        return (a is None or a is pd.NA or (isinstance(a, float) and math.isnan(a))) and (
            b is None or b is pd.NA or (isinstance(b, float) and math.isnan(b))
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def test_the_plan_the_cells_table_and_the_predictor_agree_on_every_column_they_share(
    tmp_path: Path, catalog: Catalog
) -> None:
    overrides = ["model=pythia-160m", "gpu=a100-80gb", "num_gpus=2", "method.engine=deepspeed,fsdp", "cluster=local"]
    p = plan(overrides, sweep_dir=None)
    predict(p)
    planned = {r["cell_id"]: r for r in plan_rows(p)}
    sweep = tmp_path / "sweep"
    for cell in p.cells:
        config = to_container(cell.typed)
        record = synthetic.record(cell.cell_id, config, "ok", synthetic.metrics(config, 1.5, 4))
        # As this version's probe records the allocator it ran with (orchestrator.job.env).
        allocator = {"pytorch_alloc_conf": None, "pytorch_cuda_alloc_conf": DEFAULT_CUDA_ALLOC_CONF}
        record = dataclasses.replace(record, environment={**record.environment, **allocator})
        synthetic.write_cell(sweep, cell.cell_id, config, record)
    table = load_cells([sweep], catalog=catalog).frame.set_index("cell_id")
    assert {c.typed.method.engine for c in p.cells} == {"deepspeed", "fsdp"}
    for cell in p.cells:
        flat = rows.row(cell.typed)
        assert flat_cell(cell.config) == flat_cell(cell.typed) == flat, "the predictor's input is the row"
        assert flat["fsdp_sharding"] is None if cell.typed.method.engine == "deepspeed" else flat["zero_stage"] == 0
        for name, source in (("plan", planned[cell.cell_id]), ("cells table", table.loc[cell.cell_id].to_dict())):
            shared = set(source) & set(flat)
            assert {"model", "gpu", "num_gpus", "num_nodes", "engine", "fsdp_sharding", "precision"} <= shared, name
            differ = {k: (source[k], flat[k]) for k in sorted(shared) if not _same(source[k], flat[k])}
            assert not differ, f"{name} of {cell.label}: {differ}"
        assert set(table.columns) >= set(flat), "the cells table holds the whole row"


def test_a_record_of_this_schema_is_read_as_to_config_reads_it(catalog: Catalog) -> None:
    config = synthetic.cell_config("pythia-160m", "a100-80gb", 2, catalog=catalog, compile=True)
    cell, problems = catalog.cell(config, {})
    assert cell == to_config(config) and not problems
    assert rows.row(cell)["compile_scope"] == "regional"
    assert stored_cell(config) == cell


def test_a_record_of_an_older_schema_or_damaged_is_read_leniently(tmp_path: Path, catalog: Catalog) -> None:
    config = synthetic.cell_config("pythia-160m", "a100-80gb", 2, catalog=catalog, compile=True, zero_stage=1)
    older = json.loads(json.dumps(config))
    del older["method"]["compile_scope"]  # before compile_scope, compile compiled the whole model: no default
    retired = json.loads(json.dumps(config))
    retired["method"]["retired_setting"] = 3  # a key this schema does not know
    sweep = tmp_path / "sweep"
    for cell_id, stored in (("this", config), ("older", older), ("retired", retired), ("lost", {})):
        record = synthetic.record(cell_id, config, "ok")
        # The older record's settings, written from the same method, lack compile_scope too.
        settings = {k: v for k, v in record.settings.items() if k != "compile_scope" or cell_id != "older"}
        record = dataclasses.replace(record, config=stored, settings=settings)
        synthetic.write_cell(sweep, cell_id, stored or config, record)
    (sweep / "cells" / "lost" / "cell.yaml").unlink()  # neither config nor cell.yaml: the settings remain
    loaded = load_cells([sweep], catalog=catalog)
    table = loaded.frame.set_index("cell_id")
    assert table.loc["this", "compile_scope"] == "regional"
    assert table.loc["older", "compile"] and pd.isna(table.loc["older", "compile_scope"])
    for cell_id in ("older", "retired", "lost"):
        assert table.loc[cell_id, "zero_stage"] == 1 and table.loc[cell_id, "model_num_layers"] == 12, cell_id
    assert "retired_setting" not in table.columns
    # Without a config, the record's settings say what the cell was; what they do not name is empty, not a default.
    cell, _ = catalog.cell({}, {"model": "pythia-160m", "gpu": "a100-80gb", "num_gpus": 2, "zero_stage": 1})
    flat = rows.row(cell)
    assert (flat["model"], flat["num_gpus"], flat["zero_stage"], flat["precision"]) == ("pythia-160m", 2, 1, None)
    assert flat["model_hidden_size"] == 768 and flat["gpu_memory_gib"] == 80
    assert any("cells/lost/cell.yaml is missing" in line for line in loaded.problems)
