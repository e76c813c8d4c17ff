"""Benchmark: the uncalibrated predictor's reserved peak against every committed GPU record, by record folder.

Each record of ``tests/data/gpu-records/<folder>`` is predicted as ``plan`` would (no calibration), at the
micro-batch and accumulation it ran with and with the allocator setting its record says it ran with (the H100's
ran before gpudays set one; the H200's with expandable segments). Printed per folder: the median and largest
|predicted / measured − 1| of the reserved peak, and how many measured peaks lie inside their 90% intervals. The
allocator's figures (``orchestrator/engines/memory.py``) were set on these same records: in-sample.

    python benchmarks/reserved_peaks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from intervals import RECORDS, records_table  # noqa: E402

from analysis.predict.predictor import predict_frame  # noqa: E402


def main() -> None:
    folders = sorted(p.name for p in RECORDS.iterdir() if p.is_dir() and any(p.glob("*.json")))
    print(f"reserved peak, uncalibrated, against the records of {RECORDS} (in-sample for the allocator's figures)")
    for folder in folders:
        table = records_table(folder)
        table = table[(table["status"] == "ok") & (table["peak_memory_reserved_gib"].astype(float) > 0)]
        if table.empty:
            continue
        table = table.reset_index(drop=True)
        pred = predict_frame(
            table, micro_batch_size=table["micro_batch_size"], grad_accum_steps=table["grad_accum_steps"]
        )
        measured = table["peak_memory_reserved_gib"].to_numpy(dtype=float)
        error = np.abs(pred["predicted_peak_memory_gib"].to_numpy(dtype=float) / measured - 1.0)
        low = pred["predicted_peak_memory_gib_low"].to_numpy(dtype=float)
        high = pred["predicted_peak_memory_gib_high"].to_numpy(dtype=float)
        inside = int(((measured >= low) & (measured <= high)).sum())
        expandable = int(table["allocator_expandable_segments"].astype(bool).sum())
        print(
            f"  {folder:<20} {len(table):>2} records ({expandable} with expandable segments): median |error| "
            f"{100 * np.median(error):.1f}%, max {100 * error.max():.1f}%, inside the 90% interval {inside} of {len(table)}"
        )


if __name__ == "__main__":
    main()
