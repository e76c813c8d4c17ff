"""A quick start: ``gpudays --help`` and ``gpudays status`` load none of the heavy libraries (Hydra, submitit,
pandas, numpy, scipy, matplotlib, torch), and the job side loads no Hydra. Each is run in a fresh interpreter, since
this one has loaded them all for other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.schema import to_config
from orchestrator.store.durable import append_jsonl
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import RECORD_SCHEMA_VERSION
from orchestrator.submission import launch

HEAVY = ("hydra", "submitit", "pandas", "numpy", "scipy", "matplotlib", "torch")
"""Never loaded by ``--help`` or ``status``."""
NOT_FOR_HELP = (*HEAVY, "omegaconf", "rich", "jinja2", "yaml", "deepspeed", "transformers")
"""``--help`` loads none of these either: it parses arguments and prints."""

_PROBE = """
import json, sys
from orchestrator.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _loaded(*argv: str) -> tuple[int, set[str]]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    found = json.loads(last)
    return found["code"], set(found["loaded"])


def test_help_loads_only_the_parser() -> None:
    code, loaded = _loaded("--help")
    assert code == 0
    assert not loaded & set(NOT_FOR_HELP), f"--help loaded {sorted(loaded & set(NOT_FOR_HELP))}"


def test_a_commands_help_loads_only_the_parser() -> None:
    code, loaded = _loaded("budget", "--help")
    assert code == 0
    assert not loaded & set(NOT_FOR_HELP), f"budget --help loaded {sorted(loaded & set(NOT_FOR_HELP))}"


def _cell(paths: SweepPaths, config: dict[str, Any], status: str) -> None:
    cid = f"{status}{len(paths.cell_ids())}"
    launch.write_cell(paths, cid, to_config(config))
    append_jsonl(paths.attempts(cid), {"cell_id": cid, "attempt": 1, "job_id": "999999999", "backend": "local"})
    record = {"schema_version": RECORD_SCHEMA_VERSION, "status": status, "cell_id": cid, "attempt": 1}
    paths.record(cid).write_text(json.dumps({**record, "config": config, "metrics": {}, "environment": {}}))


def test_status_loads_no_heavy_library(tmp_path: Path, make_cell: Any) -> None:
    tiny_config = make_cell("model=pythia-tiny", "gpu=cpu", "num_gpus=1")
    paths = SweepPaths(tmp_path)
    _cell(paths, tiny_config, "ok")
    _cell(paths, tiny_config, "failed")
    code, loaded = _loaded("status", str(tmp_path), "--check")
    assert code == 1, "a failed cell needs a rerun: status said otherwise, so it did not read the folder"
    assert not loaded & set(HEAVY), f"status loaded {sorted(loaded & set(HEAVY))}"


@pytest.mark.parametrize("module", ["orchestrator.job.entry", "orchestrator.job.probe"])
def test_the_job_side_loads_no_hydra(module: str) -> None:
    probe = f"import importlib, sys; importlib.import_module({module!r}); print('hydra' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False", f"{module} loads Hydra"
