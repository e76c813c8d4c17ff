"""Unit-tier settings.

One torch thread: these tests count FLOPs and bytes on tiny modules, they never time them, and on a shared 2-core
machine OpenMP's second thread spins waiting for a core another process holds (a 256×64 matmul took 20 ms instead
of 0.2 ms under load). The probe's own thread choice (``orchestrator/job/ranks.py``) is untouched: it runs in its own
processes, which read ``OMP_NUM_THREADS`` and the cores they are given, not this setting.
"""

from __future__ import annotations

import inspect
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from orchestrator.job.entry import CellJob

try:
    import torch
except ImportError:  # pragma: no cover - torch is a dependency; the tests that need it say so themselves
    torch = None

if torch is not None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def layout_searches_kept() -> Iterator[None]:
    """The tests ask the layout search (``analysis.predict.layout_search.best_by_count``, a second or more each)
    the same question many times: ``budget`` and ``shortest`` run at each terminal width and as JSON, the planners
    and the commands over the same budget, the settling rounds of a compute-optimal size. The search reads nothing
    but its arguments, so for the session a question asked before is answered from the first answer (fresh lists,
    which callers may sort or extend); a test that patches what the search calls must ask a question of its own."""
    from analysis.planners import shortest
    from analysis.predict import layout_search

    search = layout_search.best_by_count
    signature = inspect.signature(search)
    kept: dict[str, dict[int, list[Any]]] = {}

    def remembered(*args: Any, **kwargs: Any) -> dict[int, list[Any]]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments["counts"] = list(bound.arguments["counts"])  # a generator's repr is not its values
        key = repr(sorted(bound.arguments.items()))
        if key not in kept:
            kept[key] = search(*bound.args, **bound.kwargs)
        return {n: list(found) for n, found in kept[key].items()}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout_search, "best_by_count", remembered)
        patch.setattr(shortest, "best_by_count", remembered)
        yield


@pytest.fixture
def slurm_cell_job(
    tmp_path: Path, make_cell: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., CellJob]]:
    """A ``CellJob`` as submitit starts it on SLURM, for one rank of ``num_tasks``: submitit's job environment
    faked, the job side's signal state fresh, ``was_cancelled`` answering ``cancelled``, and cell ``abc`` of
    ``overrides`` written to a sweep in ``tmp_path``. The process's SIGTERM, SIGUSR2 and SIGINT handlers are put
    back afterwards."""
    from orchestrator.job import entry as jobside
    from orchestrator.slurm import commands as slurm
    from orchestrator.store.paths import CELL_CONFIG_NAME, SweepPaths

    def _job(*overrides: str, rank: int = 0, num_tasks: int = 1, cancelled: bool = False) -> CellJob:
        fake = SimpleNamespace(
            global_rank=rank, num_tasks=num_tasks, local_rank=rank, num_nodes=1, job_id="7", hostnames=["here"]
        )
        fake._usr_sig = lambda: signal.SIGUSR2
        monkeypatch.setattr(jobside.submitit, "JobEnvironment", lambda: fake)
        monkeypatch.setattr(jobside, "set_distributed_env", lambda *args: None)
        monkeypatch.setattr(jobside, "_time_limit_signal", None)
        monkeypatch.setattr(jobside, "_probe_done", False)
        monkeypatch.setattr(jobside, "_requeuing", False)
        monkeypatch.setattr(slurm, "was_cancelled", lambda job_id: cancelled and job_id == "7")
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        for name in ("DS_ACCELERATOR", "OMP_NUM_THREADS", "SLURM_JOB_NODELIST", "SLURM_ARRAY_JOB_ID"):
            monkeypatch.delenv(name, raising=False)
        paths = SweepPaths(tmp_path)
        paths.cell_dir("abc").mkdir(parents=True, exist_ok=True)
        (paths.cell_dir("abc") / CELL_CONFIG_NAME).write_text(yaml.safe_dump(make_cell(*overrides)))
        return jobside.CellJob(str(tmp_path), "abc", 1)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)}
    try:
        yield _job
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
