"""Memory-bound work and compile's share of it (analysis/predict/memory_bound.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from analysis.predict.inputs import inputs_from_columns
from analysis.predict.memory_bound import (
    BYTES_PER_TOKEN_HIDDEN_LAYER,
    COMPILED_SHARE,
    RECOMPUTED_SHARE,
    compiled_share,
    memory_bound_s,
    stream_bytes_s,
)


@dataclass(frozen=True)
class Stream:
    op: str
    bytes_moved: int
    seconds: float


@dataclass(frozen=True)
class Measured:
    memory: tuple[Stream, ...]
    collectives: tuple[()] = ()
    matmuls: tuple[()] = ()
    attention: tuple[()] = ()


def test_the_stream_bandwidth_is_the_faster_figure() -> None:
    profile = Measured((Stream("copy", 2 * 10**9, 1.0), Stream("add", 3 * 10**9, 1.0)))
    assert stream_bytes_s(profile) == 3e9
    assert np.isnan(stream_bytes_s(Measured(())))


def test_bytes_over_the_profiled_bandwidth_and_checkpointing_runs_the_forward_again() -> None:
    profiles = {"h200": Measured((Stream("copy", 4 * 10**12, 1.0),))}
    gpu = np.array(["h200", "h200", "a100-80gb"], dtype=object)
    seconds = memory_bound_s(gpu, np.array([1e9, 1e9, 1e9]), np.array([False, True, False]), profiles)
    assert seconds[0] == pytest.approx(BYTES_PER_TOKEN_HIDDEN_LAYER * 1e9 / 4e12)
    assert seconds[1] == pytest.approx(seconds[0] * (1 + RECOMPUTED_SHARE))
    assert np.isnan(seconds[2])  # no profile of that GPU: the fixed cost per micro-step stands for it


def test_compile_leaves_its_scope_s_share_except_on_the_cpu() -> None:
    share = compiled_share(
        np.array([False, True, True, True, True]),
        np.array(["regional", "regional", "whole", "", "regional"], dtype=object),
        np.array(["hopper", "hopper", "hopper", "hopper", "cpu"], dtype=object),
    )
    assert share.tolist() == [1.0, COMPILED_SHARE["regional"], COMPILED_SHARE["whole"], COMPILED_SHARE["regional"], 1.0]


def test_a_compiled_record_that_names_no_scope_compiled_the_whole_model() -> None:
    # Records from before regional compile carry no compile_scope: the engine then compiled the whole model.
    cells = pd.DataFrame({"compile": [True, True], "compile_scope": [None, "regional"]})
    x = inputs_from_columns({c: cells[c] for c in cells.columns}, len(cells))
    assert x.method["compile_scope"].tolist() == ["whole", "regional"]
