"""The report's CSV files for a fixed synthetic sweep, against reviewed golden copies in tests/golden/.

The golden files are never written by the test. After a deliberate change to the report (or to a price or
figure in conf/), regenerate them with

    PYTHONPATH=tests python tests/unit/test_analysis_golden.py --write

and review the diff before committing it: every changed number should be explained by the change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import synthetic

from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
TABLES = ("cells.csv", "best.csv", "frontier.csv", "scaling.csv")

# (cell id, model, gpu, GPUs, nodes, method settings, status, step time s, micro-batch, peak GiB). Step times
# are set near 30-45% of the GPUs' dense peak, as real measurements would be.
CELLS = [
    ("tiny-1", "pythia-tiny", "cpu", 1, 1, {}, "ok", 0.210, 8, None),
    ("tiny-2", "pythia-tiny", "cpu", 2, 1, {}, "ok", 0.130, 8, None),
    ("tiny-2-ckpt", "pythia-tiny", "cpu", 2, 1, {"activation_checkpointing": True}, "ok", 0.150, 8, None),
    ("m160-a100-1", "pythia-160m", "a100-80gb", 1, 1, {}, "ok", 18.6, 16, 61.2),
    ("m160-a100-2", "pythia-160m", "a100-80gb", 2, 1, {}, "ok", 9.86, 16, 61.9),
    ("m160-a100-4", "pythia-160m", "a100-80gb", 4, 1, {"zero_stage": 1}, "ok", 5.08, 16, 58.0),
    ("m160-h100-1", "pythia-160m", "h100-80gb", 1, 1, {}, "ok", 6.84, 16, 61.0),
    ("m1b-a100-1", "pythia-1b", "a100-80gb", 1, 1, {"activation_checkpointing": True}, "ok", 124.6, 32, 70.1),
    ("m1b-a100-8", "pythia-1b", "a100-80gb", 8, 1, {"zero_stage": 2}, "ok", 12.5, 8, 44.0),
    ("m1b-a100-16", "pythia-1b", "a100-80gb", 16, 2, {"zero_stage": 2}, "ok", 7.10, 8, 40.5),
    ("m1b-3090-4", "pythia-1b", "rtx3090", 4, 1, {"zero_stage": 2, "offload_optimizer": True}, "ok", 180.0, 2, 21.0),
    ("m1b-3090-1", "pythia-1b", "rtx3090", 1, 1, {}, "does_not_fit", None, None, None),
    ("m12b-a100-1", "pythia-12b", "a100-80gb", 1, 1, {}, "does_not_fit", None, None, None),
    ("m410-l40s-2", "pythia-410m", "l40s", 2, 1, {"micro_batch_size": 64}, "oom", None, None, None),
    ("m410-l40s-4", "pythia-410m", "l40s", 4, 1, {}, "comm_error", None, None, None),
    ("m410-l40s-1", "pythia-410m", "l40s", 1, 1, {}, None, None, None, None),
]


def build_golden_sweep(root: Path) -> Path:
    """Write the fixed synthetic sweep into ``root / "golden"`` and return its folder."""
    catalog = Catalog.load()
    sweep = root / "golden"
    for cell_id, model, gpu, gpus, nodes, method, status, step, micro, peak in CELLS:
        config = synthetic.cell_config(model, gpu, gpus, nodes, catalog=catalog, name="golden", **method)
        if status is None:
            synthetic.write_cell(sweep, cell_id, config)
            continue
        metrics = synthetic.metrics(config, step, micro, peak) if status == "ok" else None
        reason = {"comm_error": "NCCL watchdog timeout", "oom": "CUDA out of memory at micro-batch 64"}.get(status)
        synthetic.write_cell(
            sweep, cell_id, config, synthetic.record(cell_id, config, status, metrics, reason, "golden")
        )
    synthetic.write_cell(sweep, "corrupt", synthetic.cell_config("pythia-70m", "a6000", 1, catalog=catalog), '{"sta')
    return sweep


@pytest.mark.parametrize("name", TABLES)
def test_report_tables_match_the_golden_files(tmp_path: Path, name: str) -> None:
    golden = GOLDEN_DIR / name
    assert golden.is_file(), f"{golden} is missing; generate it with `python {__file__} --write` and review it"
    sweep = build_golden_sweep(tmp_path)
    write_report([sweep], plots=False)
    produced = pd.read_csv(sweep / name)
    expected = pd.read_csv(golden)
    assert list(produced.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(produced, expected, check_exact=False, rtol=1e-9, atol=1e-12)


def _write_golden() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sweep = build_golden_sweep(Path(tmp))
        write_report([sweep], plots=False)
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for name in TABLES:
            (GOLDEN_DIR / name).write_text((sweep / name).read_text())
            print(f"wrote {GOLDEN_DIR / name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write   (regenerates {GOLDEN_DIR}; review the diff)")
    _write_golden()
