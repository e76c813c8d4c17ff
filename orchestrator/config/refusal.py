"""Why a cell cannot run: the config key at fault and what would be accepted instead.

A module of its own so that the rules of every owner (orchestrator.cells.cell, each engine's spec under
orchestrator/engines/) build refusals without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """Why a cell cannot run, and what would be accepted instead."""

    key: str
    """The config key at fault, e.g. ``method.precision``."""
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"
