"""The suite's three lanes on two xdist workers (tests/conftest.py): a lane's SLURM tests never beside each other,
each SLURM lane on a cluster of its own."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import SECOND_SLURM_LANE, SLURM_TESTS, lane, scope

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def functions_of(path: Path) -> Iterator[ast.FunctionDef]:
    """The test functions of an integration test file, in their order."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            yield node


def test_every_test_that_uses_the_cluster_is_in_the_slurm_lane() -> None:
    for path in INTEGRATION.glob("test_*.py"):
        for node in functions_of(path):
            uses = "slurm_cluster" in [a.arg for a in node.args.args]
            marked = any("mark.slurm" in ast.unparse(d) for d in node.decorator_list)
            whole = "*" in SLURM_TESTS[f"tests/integration/{path.name}"]
            slurm = "slurm-2" if f"tests/integration/{path.name}" in SECOND_SLURM_LANE else "slurm"
            expected = slurm if whole or uses or marked else "local"
            assert lane(f"tests/integration/{path.name}::{node.name}[a@b]") == expected, (path.name, node.name)
    assert {"*"} == SLURM_TESTS["tests/integration/test_soak.py"] == SLURM_TESTS["tests/integration/test_faults.py"]


def test_the_second_slurm_lane_is_whole_files_of_sleeping_cells_collected_after_both_other_lanes_begin() -> None:
    # Whole files, so that a file's module fixtures and cluster state stay on one cluster; no DeepSpeed, whose CPU
    # ops the local lane builds first; and collected after the first test of each other lane, so that xdist hands
    # it out third, to the worker that ends its lane first (tests/conftest.py).
    files = sorted(INTEGRATION.glob("test_*.py"))
    for name in SECOND_SLURM_LANE:
        assert SLURM_TESTS[name] == {"*"}, name
        assert "deepspeed" not in (INTEGRATION.parents[1] / name).read_text(), name
    first = {}
    for i, path in enumerate(files):
        for node in functions_of(path):
            first.setdefault(lane(f"tests/integration/{path.name}::{node.name}"), i)
    assert set(first) == {"slurm", "slurm-2", "local"}
    assert first["slurm-2"] > max(first["slurm"], first["local"])


def test_a_files_local_tests_leave_the_slurm_lane() -> None:
    # One file, an adaptive sweep on this machine and one on the cluster: only the second waits for SLURM's turn.
    adaptive = "tests/integration/test_adaptive_sweep.py::test_an_adaptive_sweep_"
    assert lane(adaptive + "here_runs_its_rounds_to_the_end") == "local"
    assert lane(adaptive + "on_slurm_submits_a_round_and_resume_goes_on") == "slurm"
    assert lane("tests/integration/test_lifecycle.py::test_a") == lane("tests/integration/test_slurm_states.py::t")
    assert lane("tests/integration/test_lifecycle.py::test_a") == "slurm-2"


def test_unit_tests_belong_to_no_lane() -> None:
    assert lane("tests/unit/test_search.py::test_down_from_the_start_when_nothing_fits_yet") is None
    assert lane("tests/integration/test_probe.py::test_zero3[2]") == "local"


def test_a_unit_test_file_runs_whole_on_one_worker_and_a_lane_whole_on_one() -> None:
    assert scope("tests/unit/test_search.py::test_a[x-y]") == "tests/unit/test_search.py"
    # The two files that plan every shipped model share one worker, and no other file's.
    assert (
        scope("tests/unit/analysis/test_predictor_models.py::test_a[x-y]")
        == scope("tests/unit/test_domains.py::test_b")
        != scope("tests/unit/test_conf.py::test_b")
    )
    assert scope("tests/unit/test_search.py::test_b") != scope("tests/unit/test_sweep.py::test_b")
    assert (
        scope("tests/integration/test_probe.py::test_a")
        == scope("tests/integration/test_compile.py::test_b")
        == "local"
    )


def test_the_slurm_lanes_deepspeed_tests_go_last_and_the_lanes_keep_their_places() -> None:
    from dataclasses import dataclass

    from tests.conftest import pytest_collection_modifyitems

    @dataclass
    class Item:
        nodeid: str
        deepspeed: bool = False

        def get_closest_marker(self, name: str) -> object | None:
            return object() if name == "deepspeed" and self.deepspeed else None

    items = [
        Item("tests/integration/test_adaptive_sweep.py::test_an_adaptive_sweep_here_runs_its_rounds_to_the_end", True),
        Item(
            "tests/integration/test_adaptive_sweep.py::test_an_adaptive_sweep_on_slurm_submits_a_round_and_resume_goes_on",
            True,
        ),
        Item("tests/integration/test_cluster.py::test_a"),
        Item("tests/integration/test_faults.py::test_b", True),
        Item("tests/integration/test_lifecycle.py::test_e", True),
        Item("tests/integration/test_lifecycle.py::test_c"),
        Item("tests/unit/test_search.py::test_d"),
    ]
    before = list(items)
    pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    # Each SLURM lane sorted in its own places: slurm's three, slurm-2's two.
    assert [i.nodeid.split("::")[1] for i in items] == [
        "test_an_adaptive_sweep_here_runs_its_rounds_to_the_end",
        "test_a",
        "test_an_adaptive_sweep_on_slurm_submits_a_round_and_resume_goes_on",
        "test_b",
        "test_c",
        "test_e",
        "test_d",
    ]
    assert [lane(i.nodeid) for i in items] == [lane(i.nodeid) for i in before]
