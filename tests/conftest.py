"""Shared fixtures: compose the real config from conf/, as users' commands do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.sweep import plan


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


@pytest.fixture
def make_cell() -> Callable[..., dict[str, Any]]:
    """Compose one runnable-or-not cell from overrides and return its resolved config."""

    def _make(*overrides: str) -> dict[str, Any]:
        p = plan(list(overrides) or ["model=pythia-tiny"], sweep_dir=None)
        cells = p.cells + p.skipped
        assert len(cells) == 1, f"{overrides} gives {len(cells)} cells"
        return cells[0].config

    return _make
