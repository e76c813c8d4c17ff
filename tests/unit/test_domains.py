"""Every field has a domain, declared beside it in the schema, and a value outside it never reaches a job.

The refusal names the cell, the key, the value, where the value came from (the command line or the config file)
and what would be accepted; it comes from `gpudays plan`, `sweep` and `--dry-run` alike (they share
``orchestrator.planning.plan.plan``), and the job side refuses such a cell again as ``invalid``, never ``failed``.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml

from analysis.predict.predictor import plan as predict_plan
from orchestrator.config.domains import DOMAIN, Domain, describe_all
from orchestrator.config.schema import Config
from orchestrator.job import entry as jobside
from orchestrator.planning.plan import SweepError, plan
from orchestrator.store.paths import CELL_CONFIG_NAME, SweepPaths
from orchestrator.store.record import read_record
from orchestrator.store.states import RecordStatus

CONF = Path(__file__).resolve().parents[2] / "conf"

CHECKED_ELSEWHERE = {
    "model.family": "orchestrator.models.config_errors: the families are the modules of orchestrator/models",
    "name": "orchestrator.cells.cell.check_scheduler_strings: it becomes a folder and a job name",
    "cluster.partition": "check_scheduler_strings: SLURM's own syntax, shell characters refused",
    "cluster.account": "check_scheduler_strings",
    "cluster.qos": "check_scheduler_strings",
    "cluster.constraint": "check_scheduler_strings",
    "cluster.wckey": "check_scheduler_strings",
    "cluster.gres_by_gpu": "check_scheduler_strings, each value",
    "cluster.constraint_by_gpu": "check_scheduler_strings, each value",
    "cluster.partition_by_gpu": "check_scheduler_strings, each value",
    "cluster.qos_by_gpu": "check_scheduler_strings, each value",
    "cluster.account_by_gpu": "check_scheduler_strings, each value",
    "cluster.setup": "check_scheduler_strings: one shell line an item",
    "cluster.env": "check_scheduler_strings: names [A-Za-z_][A-Za-z0-9_]*, single-line values",
    "cluster.template": "check_scheduler_strings: a file name under sbatch_templates/",
    "cluster.sbatch_extra": "orchestrator.slurm.options.problems: option names, none gpudays sets, single-line values",
    "cluster.srun_args": "orchestrator.slurm.options.problems: none of the srun options gpudays sets",
    "cluster.exclusive": "OmegaConf: true, false or null (auto)",
    "cluster.python": "orchestrator.slurm.options.problems: one non-empty command line",
    "cluster.gpus_per_node_by_gpu": "orchestrator.cells.cell.check_scheduler_strings: each value an integer >= 1",
    "cluster.cpus_per_gpu_by_gpu": "check_scheduler_strings: each value an integer >= 1",
    "cluster.mem_gb_per_gpu_by_gpu": "check_scheduler_strings: each value an integer >= 1",
}
"""Fields whose rules are more than a domain, and the check that holds them."""


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, Any, Any]]:
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, Any, Any]] = []
    for f in fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and is_dataclass(kind):
            out += _leaves(kind, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", kind, f.metadata.get(DOMAIN)))
    return out


def test_every_field_has_a_domain_or_is_a_flag_or_is_checked_elsewhere() -> None:
    missing = [
        key for key, kind, d in _leaves(Config) if d is None and kind is not bool and key not in CHECKED_ELSEWHERE
    ]
    assert missing == []
    assert all(isinstance(d, Domain) for _, _, d in _leaves(Config) if d is not None)


def _outside(d: Domain) -> Any:
    """A value of the field's type that its domain refuses."""
    if d.ge is not None:
        return int(d.ge) - 1 if d.integer else d.ge - 0.5
    if d.gt is not None:
        return int(d.gt) if d.integer else d.gt
    if d.choices:
        return 7 if isinstance(d.choices[0], int) else "banana"
    assert d.pattern is not None
    if re.fullmatch(d.pattern, "not/a-name"):  # free text (a price's source): too long for one line
        return "x" * 201
    return "not/a-name"


BAD = [(key, _outside(d)) for key, _, d in _leaves(Config) if d is not None]
BASE = ["model=pythia-160m", "gpu=a100-80gb", "num_gpus=2", "cluster=local"]


@pytest.mark.parametrize(("key", "value"), BAD, ids=[k for k, _ in BAD])
def test_a_value_outside_its_domain_is_refused_before_submission_naming_all_of_it(key: str, value: Any) -> None:
    with pytest.raises(SweepError) as caught:
        plan([*BASE, f"{key}={value}"])
    message = str(caught.value)
    assert "nothing was submitted" in message
    assert "in the cell model=pythia-160m" in message  # the cell
    assert f"{key}: {value!r}" in message or f"{key}: {value}" in message  # the key and the value
    assert "use " in message  # what is accepted
    assert "set on the command line" in message  # where it came from


def test_a_relation_between_fields_is_checked() -> None:
    with pytest.raises(SweepError, match=r"probe.max_steps: 5 is below min_steps \(10\); use 10 or more"):
        plan([*BASE, "probe.min_steps=10", "probe.max_steps=5"])


def test_a_bad_value_in_a_config_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    shipped = yaml.safe_load((CONF / "model" / "pythia-160m.yaml").read_text())
    shipped.update(name="pythia-broken", seq_length=0)
    (tmp_path / "model" / "pythia-broken.yaml").write_text(yaml.safe_dump(shipped))
    with pytest.raises(SweepError) as caught:
        plan(["model=pythia-broken", "gpu=a100-80gb", "cluster=local"], search_dirs=[tmp_path])
    assert "model.seq_length: 0 is not accepted; use an integer >= 1 (from conf/model/pythia-broken.yaml)" in str(
        caught.value
    )


def test_the_domains_read_as_a_list_for_the_readme() -> None:
    listed = dict(describe_all(Config))
    assert listed["probe.step_timing"] == "one of composed, whole"
    assert listed["model.num_kv_heads"] == "an integer >= 1 (or null)"
    assert listed["method.micro_batch_size"] == "auto or an integer >= 1"
    assert listed["probe.max_steps"] == "an integer >= 1, at least min_steps"


def test_no_figure_plan_prints_is_negative_or_nan_for_a_cell_inside_its_domains() -> None:
    models = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    # Every model on one GPU type (the composition tests/unit/analysis/test_predictor_models.py shares), and the
    # other kinds of device (no bf16, a CPU without peaks) on one model each.
    grids = [
        ["gpu=a100-80gb", "num_gpus=8", "cluster=local", f"model={','.join(models)}"],
        ["model=pythia-160m,llama-3.2-1b", "gpu=rtx3090,v100-32gb,cpu", "num_gpus=1,8", "cluster=local"],
    ]
    cells = [c for grid in grids for p in [plan(grid)] for c in [*p.cells, *p.skipped]]
    frame = predict_plan([c.config for c in cells])
    numbers = frame.select_dtypes("number")
    assert not numbers.empty
    for column in numbers.columns:
        values = pd.to_numeric(numbers[column], errors="coerce").dropna()
        assert (values >= 0).all(), column
    # Step time and peak memory are there for every runnable cell on a GPU (the CPU has no peak: NaN means unknown
    # there; bf16 on a V100 is refused, and has no peak either).
    runnable = pd.Series([not c.refusals for c in cells], index=frame.index)
    gpu_rows = frame[(frame["gpu"] != "cpu") & runnable]
    assert len(gpu_rows) >= 20
    assert gpu_rows["predicted_peak_memory_gib"].map(math.isfinite).all()
    assert gpu_rows["predicted_step_time_s"].map(math.isfinite).all()


def test_the_job_refuses_an_edited_cell_as_invalid_without_building_it(
    tmp_path: Path, make_cell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = make_cell("model=pythia-tiny", "gpu=cpu")
    cell["probe"]["max_steps"] = 0  # edited after planning, or written by hand
    paths = SweepPaths(tmp_path)
    paths.cell_dir("abc").mkdir(parents=True)
    (paths.cell_dir("abc") / CELL_CONFIG_NAME).write_text(yaml.safe_dump(cell))
    fake = SimpleNamespace(global_rank=0, num_tasks=1, local_rank=0, num_nodes=1, job_id="7", hostnames=["here"])
    monkeypatch.setattr(jobside.submitit, "JobEnvironment", lambda: fake)
    monkeypatch.setattr(jobside, "set_distributed_env", lambda *args: None)

    def no_probe(*args: Any) -> None:
        raise AssertionError("an invalid cell must not reach the probe")

    monkeypatch.setattr("orchestrator.job.probe.run_probe", no_probe)
    assert jobside.run_cell(str(tmp_path), "abc", 1) == RecordStatus.INVALID.value
    record = read_record(paths.record("abc"), "abc")
    assert record.status is RecordStatus.INVALID
    assert "probe.max_steps: 0 is not accepted" in str(record.reason)


def test_the_readme_lists_every_domain_as_the_schema_declares_it() -> None:
    readme = (CONF.parent / "README.md").read_text()
    for key, accepted in describe_all(Config):
        assert f"| `{key}` | {accepted} |" in readme, key


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_a_bad_value_added_on_the_command_line_is_said_to_come_from_it(prefix: str) -> None:
    with pytest.raises(SweepError) as caught:
        plan([*BASE, f"{prefix}cluster.inter_node_gbits_s=-5"])
    assert "cluster.inter_node_gbits_s: -5.0 is not accepted; use a number > 0 (or null) (set on the command line)" in (
        str(caught.value)
    )
