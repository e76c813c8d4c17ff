"""The suite's two lanes on two xdist workers (tests/conftest.py): SLURM tests never beside each other."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLURM_FILES, lane, scope


def test_every_integration_file_with_slurm_tests_is_in_the_slurm_lane() -> None:
    integration = Path(__file__).resolve().parents[1] / "integration"
    for path in integration.glob("test_*.py"):
        expected = "slurm" if "pytest.mark.slurm" in path.read_text() else "local"
        assert lane(f"tests/integration/{path.name}::test_x[a@b]") == expected, path.name
    assert {"tests/integration/test_soak.py", "tests/integration/test_slurm_sweep.py"} <= SLURM_FILES


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
