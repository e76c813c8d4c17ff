"""The report names doubtful measurements: taken under load, repeats that disagree, in-sample predictions far off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import synthetic

from analysis.report import caveats
from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import write_record

QUIET = {"load_avg_1m_start": 0.4, "load_avg_1m_end": 0.5, "host_cpus_given": 2, "other_cpu_use": 0.02}
BUSY = {"load_avg_1m_start": 3.9, "load_avg_1m_end": 4.2, "host_cpus_given": 2, "other_cpu_use": 0.61}


def _cell(sweep: Path, cid: str, step: float, load: dict[str, object], *, gpus: int = 1, ckpt: bool = False,
          attempt: int = 1, aside: tuple[float, dict[str, object]] | None = None) -> None:  # fmt: skip
    """A measured cpu cell of pythia-tiny (and, with ``aside``, an earlier attempt's record kept aside)."""
    config = synthetic.cell_config("pythia-tiny", "cpu", gpus, catalog=CATALOG, activation_checkpointing=ckpt)
    metrics = synthetic.metrics(config, step, 8)
    record = synthetic.record(cid, config, "ok", metrics, sweep=sweep.name, attempt=attempt)
    synthetic.write_cell(sweep, cid, config, dataclasses.replace(record, host_load=load))
    if aside is not None:
        earlier = synthetic.record(cid, config, "ok", synthetic.metrics(config, aside[0], 8), attempt=attempt - 1)
        paths = SweepPaths(sweep)
        write_record(paths.archived_record(cid, attempt - 1), dataclasses.replace(earlier, host_load=aside[1]), durable=False)  # fmt: skip


CATALOG = Catalog.load()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("caveats")
    first, second = root / "first", root / "second"
    # the same cell measured in two sweeps: 0.42 s while others took the host, 0.12 s on a quiet one
    _cell(first, "again", 0.42, BUSY, gpus=2)
    _cell(second, "again", 0.12, QUIET, gpus=2)
    _cell(second, "busy", 0.21, BUSY)  # kept, and under load
    _cell(second, "steady", 0.15, QUIET, gpus=2, ckpt=True, attempt=2, aside=(0.1502, QUIET))  # repeats agree
    _cell(second, "quiet", 0.21, QUIET, ckpt=True)
    _cell(second, "outlier", 6.0, QUIET, gpus=4)  # no calibration of the others can come near it
    out = root / "report"
    return out, write_report([first, second], out, plots=False)


def test_a_measurement_under_load_is_flagged_in_cells_csv_and_the_problems(report) -> None:
    out, rep = report
    cells = pd.read_csv(out / "cells.csv").set_index("cell_id")
    assert cells.loc["busy", "under_load"] == True  # noqa: E712  (the CSV's True)
    assert cells.loc["quiet", "under_load"] == False  # noqa: E712
    assert cells.loc["busy", "host_other_cpu_use"] == pytest.approx(0.61)
    assert cells.loc["busy", "host_load_avg_1m"] == pytest.approx(4.2) and cells.loc["busy", "host_cpus_given"] == 2
    assert "measured under load" in cells.loc["busy", "caveats"]
    lines = [p for p in rep.problems if "measured under load" in p]
    assert len(lines) == 1 and "cell busy" in lines[0] and "others took 61% of its 2 core(s)" in lines[0]
    text = (out / "report.md").read_text().split("## Problems")[1]
    assert "None." not in text.split("##")[0] and "cell busy" in text


def test_repeats_that_disagree_beyond_their_intervals_are_named_and_those_that_agree_are_not(report) -> None:
    out, rep = report
    cells = pd.read_csv(out / "cells.csv").set_index("cell_id")
    assert cells.loc["again", "step_time_s"] == pytest.approx(0.12)
    assert sorted(map(float, cells.loc["again", "repeat_step_times_s"].split())) == [0.12, 0.42]
    assert cells.loc["again", "repeats_disagree"] == True  # noqa: E712
    assert cells.loc["steady", "repeats_disagree"] == False  # noqa: E712  (an earlier attempt, kept aside)
    assert pd.isna(cells.loc["quiet", "repeats_disagree"])  # measured once: nothing to compare
    [line] = [p for p in rep.problems if "disagree" in p]
    assert line.startswith("cell again:") and "0.42 s" in line and "under load" in line and "keeps 0.12 s" in line


def test_a_large_in_sample_error_is_named_and_every_in_sample_figure_says_so(report) -> None:
    out, rep = report
    cells = pd.read_csv(out / "cells.csv").set_index("cell_id")
    error = cells.loc["outlier", "step_time_error_pct"]
    assert abs(error) >= caveats.LARGE_ERROR_PCT
    [line] = [p for p in rep.problems if "cell outlier" in p]
    assert f"{error:+.1f}% off" in line and "in-sample" in line
    # best.csv and its table in report.md carry the doubt with the answer it concerns
    best = pd.read_csv(out / "best.csv").set_index("cell_id")
    assert "in-sample prediction" in best.loc["outlier", "caveats"]
    best_section = (out / "report.md").read_text().split("(`best.csv`)")[1].split("\n## ")[0]
    assert "in-sample prediction" in best_section and "| caveats |" in best_section
    small = cells["step_time_error_pct"].abs() < caveats.LARGE_ERROR_PCT
    assert not any(f"cell {cid} " in p and "in-sample" in p for cid in cells.index[small] for p in rep.problems)
    section = (out / "report.md").read_text().split("## Predicted against measured")[1].split("\n## ")[0]
    assert section.startswith(" (in-sample)") and "in-sample)." in section
    header = next(line for line in section.splitlines() if line.startswith("| gpu |"))
    error_columns = [c.strip() for c in header.strip("|").split("|") if "error" in c or "inside" in c]
    assert error_columns and all(c.startswith("in_sample_") for c in error_columns)
    assert "in_sample_max_abs_step_time_error_pct" in error_columns


def test_under_load_reads_the_share_first_and_the_load_average_only_without_it() -> None:
    frame = pd.DataFrame(
        {
            "host_other_cpu_use": [0.3, 0.05, None, None, None],
            "host_load_avg_1m": [0.1, 9.0, 4.5, 1.0, None],
            "host_cpus_given": [2, 2, 2, 2, None],
        }
    )
    assert caveats.under_load(frame).tolist() == [True, False, True, False, pd.NA]
