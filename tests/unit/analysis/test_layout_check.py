"""The layouts' predictions against measured mesh3d records (analysis/report/layout_check.py): calibrated on the cell without
model parallelism, it predicts that cell back, carries each record's measured bubble beside the schedule's, and
leaves out what it cannot check."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from analysis.report.layout_check import achieved_tflops, cell_layout, check, check_rows
from orchestrator.config.schema import Config, to_config, to_container
from orchestrator.models import flops_per_token
from orchestrator.planning.plan import plan
from orchestrator.store.record import Metrics, Record
from orchestrator.store.states import RecordStatus


def cell(*overrides: str) -> Config:
    p = plan(["model=pythia-tiny", "gpu=cpu", "num_gpus=4", *overrides], sweep_dir=None)
    (found,) = p.cells + p.skipped
    return to_config(found.config)


def record(
    cfg: Config, cell_id: str, step_s: float, memory_gib: float, tflops: float, micro: int, **env: object
) -> Record:
    metrics = Metrics(
        micro_batch_size=micro, grad_accum_steps=1, step_time_s=step_s, peak_memory_allocated_gib=memory_gib,
        hardware_tflops_per_gpu=tflops,
    )  # fmt: skip
    environment: dict[str, object] = {"mesh3d": dict(env)} if env else {}
    return Record(cell_id, RecordStatus.OK, config=to_container(cfg), metrics=metrics, environment=environment)


@functools.cache
def data_parallel() -> Config:
    """The mesh3d cell without model parallelism, planned when a test first asks (not at collection)."""
    return cell("method.engine=mesh3d")


@functools.cache
def pipelined() -> Config:
    return cell("method.engine=mesh3d", "method.pp=2", "method.pp_microbatches=4")


def test_calibrated_on_the_data_parallel_cell_it_predicts_that_cell_back() -> None:
    dp = record(data_parallel(), "dp", step_s=0.30, memory_gib=0.09, tflops=0.002, micro=4)
    pp = record(pipelined(), "pp", step_s=0.40, memory_gib=0.10, tflops=0.0015, micro=2, bubble_measured=0.3)
    assert achieved_tflops([dp, pp]) == 0.002  # the cell without model parallelism only
    by_id = {c.cell_id: c for c in check([dp, pp])}
    assert by_id["dp"].predicted_memory_gib == pytest.approx(0.09)  # the offset is fitted on it
    # its step: the hardware FLOPs of the step at the achieved rate, FSDP2's communication over 4 ranks and the
    # micro-steps' fixed cost, as the predictor predicts the cell
    est = by_id["dp"].estimate
    model = data_parallel().model
    flops = model.global_batch_size * model.seq_length * flops_per_token(model)
    assert est.compute_s == pytest.approx(flops / 4 / 0.002e12)
    assert est.communication_s > 0.0 and est.overhead_s > 0.0
    assert by_id["dp"].predicted_step_s == pytest.approx(est.compute_s + est.communication_s + est.overhead_s)
    assert by_id["dp"].predicted_bubble == 0.0 and by_id["dp"].measured_bubble is None
    assert by_id["pp"].predicted_bubble == pytest.approx(1 / 5) and by_id["pp"].measured_bubble == 0.3
    assert by_id["pp"].predicted_step_s > by_id["pp"].estimate.compute_s  # the bubble stretches the schedule
    assert by_id["pp"].layout == "tp1 pp2 dp2 1f1b-m4 mb2x1"
    rows = check_rows(list(by_id.values()))
    assert {"step_s", "pred_step_s", "mem_gib", "pred_mem_gib", "bubble", "pred_bubble", "pred_comm_s"} <= set(rows[0])


def test_other_engines_and_unmeasured_cells_are_not_checked() -> None:
    fsdp = record(cell("method.engine=fsdp"), "fsdp", 0.3, 0.09, 0.002, 4)
    failed = dataclasses.replace(record(data_parallel(), "failed", 0.3, 0.09, 0.002, 4), status=RecordStatus.FAILED)
    assert check([fsdp, failed]) == []
    # the CPU has no peak and nothing calibrates it
    assert check([record(pipelined(), "pp", 0.4, 0.1, 0.0015, 2)]) == []


def test_a_cells_layout_is_its_mesh_and_schedule() -> None:
    inter = cell(
        "method.engine=mesh3d", "model.num_layers=4", "model.num_parameters=null", "method.pp=2",
        "method.pp_schedule=interleaved_1f1b", "method.pp_microbatches=4",
    )  # fmt: skip
    lay = cell_layout(inter, 2)
    assert (lay.data, lay.tensor, lay.pipeline, lay.micro_batch_size) == (2, 1, 2, 2)
    assert (lay.schedule_micro_batches, lay.stages_per_rank, lay.engine) == (4, 2, "mesh3d")


def test_the_report_writes_layouts_csv_where_mesh3d_cells_were_measured(tmp_path) -> None:
    import synthetic

    from analysis.report.writer import write_report

    sweep = tmp_path / "sweep"
    dp = record(data_parallel(), "dp", step_s=0.30, memory_gib=0.09, tflops=0.002, micro=4)
    pp = record(pipelined(), "pp", step_s=0.40, memory_gib=0.10, tflops=0.0015, micro=2, bubble_measured=0.3)
    for r, cfg in ((dp, data_parallel()), (pp, pipelined())):
        synthetic.write_cell(sweep, r.cell_id, to_container(cfg), dataclasses.replace(r, sweep=sweep.name))
    report = write_report([sweep], plots=False)
    layouts = sweep / "layouts.csv"
    assert layouts in report.files
    import pandas as pd

    table = pd.read_csv(layouts)
    assert sorted(table["cell"]) == ["dp", "pp"] and table.set_index("cell").loc["pp", "bubble"] == 0.3


def gpu_cell(*overrides: str) -> Config:
    p = plan(["model=pythia-1b", "gpu=a100-80gb", "num_gpus=8", "method.engine=mesh3d", *overrides], sweep_dir=None)
    (found,) = p.cells + p.skipped
    return to_config(found.config)


def test_planners_from_a_sweep_of_3d_layouts_cost_them_at_the_calibrated_rate(tmp_path) -> None:
    import synthetic

    from analysis.report.layout_check import layout_efficiency
    from orchestrator.cli.main import main

    sweep, peak = tmp_path / "sweep", 312.0  # the A100's dense bf16 peak (conf/gpu/a100-80gb.yaml)
    dp_cfg, tp_cfg = gpu_cell(), gpu_cell("method.tp=2")
    dp = record(dp_cfg, "dp", step_s=2.0, memory_gib=40.0, tflops=0.25 * peak, micro=4)
    tp = record(tp_cfg, "tp", step_s=2.5, memory_gib=30.0, tflops=0.2 * peak, micro=4)
    for r, cfg in ((dp, dp_cfg), (tp, tp_cfg)):
        synthetic.write_cell(sweep, r.cell_id, to_container(cfg), dataclasses.replace(r, sweep=sweep.name))
    efficiency, source = layout_efficiency([dp, tp])["a100-80gb"]
    assert efficiency == pytest.approx(0.25) and source.startswith("mesh3d calibration (2 cell(s)")
    # no peak, nothing to calibrate
    assert layout_efficiency([record(data_parallel(), "cpu", 0.3, 0.09, 0.002, 4)]) == {}

    import pandas as pd

    frames = {}
    for name, extra in (("default", []), ("calibrated", ["--from", str(sweep)])):
        out = tmp_path / name
        argv = ["shortest", "--model", "pythia-1b", "--gpu", "a100-80gb", "--out", str(out), *extra]
        assert main(argv) == 0
        frames[name] = pd.read_csv(out / "shortest.csv")
    calibrated, default = frames["calibrated"], frames["default"]
    assert list(calibrated["efficiency"]) == pytest.approx([0.25] * len(calibrated))
    assert calibrated["efficiency_source"].str.startswith("mesh3d calibration").all()
    assert (default["efficiency_source"] == "default").all()
    # A quarter of the peak instead of the default share: the same training takes more GPU-hours.
    assert calibrated["gpu_hours"].min() > default["gpu_hours"].min()
    out = tmp_path / "budget"
    assert main(["budget", "--gpu-hours", "1e5", "--model", "pythia-1b", "--gpu", "a100-80gb",
                 "--from", str(sweep), "--out", str(out)]) == 0  # fmt: skip
    models = pd.read_csv(out / "budget_models.csv")
    predicted = models[models["source"] == "predicted"]
    assert len(predicted) and list(predicted["efficiency"]) == pytest.approx([0.25] * len(predicted))
