"""Shared fixtures: compose the real config from conf/, as users' commands do."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.planning import compose_cache
from orchestrator.planning.plan import plan

INTEGRATION = Path(__file__).parent / "integration"


def _slurm_tests(path: Path) -> set[str]:
    """The tests of an integration file that use the local SLURM cluster: "*" for all of them (the module's
    ``pytestmark`` has ``slurm``), else the names of the test functions marked ``@pytest.mark.slurm``."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and "slurm" in ast.unparse(node):
            return {"*"}
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any("mark.slurm" in ast.unparse(d) for d in node.decorator_list)
    }


SLURM_TESTS = {f"tests/integration/{path.name}": _slurm_tests(path) for path in INTEGRATION.glob("test_*.py")}
"""Integration tests that use SLURM, by file: a lane's tests share one local cluster, and one kills a node another's
job uses."""


SECOND_SLURM_LANE = frozenset(("tests/integration/test_lifecycle.py", "tests/integration/test_slurm_states.py"))
"""The SLURM test files of the lane ``slurm-2``; every other file's SLURM tests are the lane ``slurm``.

With one SLURM lane it was the suite's critical path (about 906 s of a 918 s run, the local lane and the unit tests
done at 706 s), and its last 200 s mostly waited on sleeping cells and time limits while the other worker idled.
``slurm-2`` (about 150 s of cells that sleep: lifecycles, holds, cancels, pending reasons, no DeepSpeed) goes out
after the two lanes, so the worker that ends the local lane first takes it, on a local cluster of its own, and the
unit test files fill in behind both."""


def lane(nodeid: str) -> str | None:
    """The lane an integration test runs in, one test at a time: ``slurm`` or ``slurm-2`` (on this worker's local
    cluster, :data:`SECOND_SLURM_LANE`) or ``local`` (DeepSpeed and FSDP on this machine's CPU, and local sweeps);
    None for a unit test, which may run anywhere, beside anything."""
    path, _, name = nodeid.partition("::")
    if not path.startswith("tests/integration/"):
        return None
    marked = SLURM_TESTS.get(path, set())
    if "*" not in marked and name.split("[", 1)[0] not in marked:
        return "local"
    return "slurm-2" if path in SECOND_SLURM_LANE else "slurm"


SHARED_COMPOSITIONS = {
    "tests/unit/test_domains.py": "every shipped model on 8 A100s",
    "tests/unit/analysis/test_predictor_models.py": "every shipped model on 8 A100s",
}
"""Unit test files that plan the same grid (every model in conf/model, ~40 Hydra compositions): on one worker,
the second plans it from the compositions the first kept (:func:`compositions_kept_between_plans`)."""


def scope(nodeid: str) -> str:
    """What one xdist worker runs whole: a lane, or a unit test file (so that its module fixtures, some of which
    compose dozens of configs, are made once rather than on both workers), or the files that compose the same
    configs (:data:`SHARED_COMPOSITIONS`)."""
    path = nodeid.split("::", 1)[0]
    return lane(nodeid) or SHARED_COMPOSITIONS.get(path, path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In each SLURM lane, the tests that run no DeepSpeed (not marked ``deepspeed``) go first, each file's in its
    order; the lanes keep their places in the collection, so ``slurm`` and ``local`` still go out first and
    ``slurm-2`` (collected after both begin) third.

    DeepSpeed compiles its CPU ops at first use, once per environment (a minute or more on a busy machine, under a
    lock that every other user of the op waits on). On a fresh checkout both lanes' first tests ran DeepSpeed and
    both waited for that build; now the local lane's first test builds it while the SLURM lane runs its tests
    of sleeping cells (faults, limits, crashes), and its DeepSpeed tests find it built."""
    for name in ("slurm", "slurm-2"):
        places = [i for i, item in enumerate(items) if lane(item.nodeid) == name]
        ordered = sorted((items[i] for i in places), key=lambda item: item.get_closest_marker("deepspeed") is not None)
        for i, item in zip(places, ordered, strict=True):
            items[i] = item


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``-n 2``: each lane whole on one worker, its tests one after another; each unit test file whole on
    either (:func:`scope`).

    Scopes go out in the order they are collected, not xdist's largest first: tests/integration is collected
    before tests/unit, so the two longest lanes, ``slurm`` and ``local``, start at once on the two workers; the
    worker that nears the end of its lane first takes ``slurm-2`` (xdist hands a worker its next scope when two
    or fewer of its tests are left), and the unit test files fill in behind.

    xdist's own ``loadgroup`` cannot do this here: it reads the group from a suffix it adds to a test's node id,
    and pytest 9.2 builds node ids without it, so grouped tests spread over both workers.
    """
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    config.option.loadscopereorder = False
    return LaneScheduling(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures benchmark tests recorded (``record_property("benchmark", ...)``), whichever worker ran them."""
    lines = [
        f"{report.nodeid}: {value}"
        for report in terminalreporter.stats.get("passed", [])
        if report.when == "call"
        for name, value in report.user_properties
        if name == "benchmark"
    ]
    if lines:
        terminalreporter.section("benchmark figures")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def compositions_kept_between_plans() -> Iterator[None]:
    """The tests plan hundreds of times in one process, a ``gpudays`` command once: for the session, plans share
    Hydra's compositions (keyed by the config files' bytes, so an edited file is read again), as no command needs."""
    compose_cache.keep_between_plans(True)
    yield
    compose_cache.keep_between_plans(False)


@pytest.fixture
def make_cell() -> Callable[..., dict[str, Any]]:
    """Compose one runnable-or-not cell from overrides and return its resolved config."""

    def _make(*overrides: str) -> dict[str, Any]:
        p = plan(list(overrides) or ["model=pythia-tiny"], sweep_dir=None)
        cells = p.cells + p.skipped
        assert len(cells) == 1, f"{overrides} gives {len(cells)} cells"
        return cells[0].config

    return _make


@pytest.fixture
def make_typed(make_cell: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """Like ``make_cell``, as the schema's typed ``Config`` (what submission and the job take)."""
    from orchestrator.config.schema import to_config

    return lambda *overrides: to_config(make_cell(*overrides))
