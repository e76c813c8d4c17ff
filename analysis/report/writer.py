"""``gpudays report``: from sweep folders to CSV tables, plots and a short report.md.

Files written into the output folder (the first sweep folder unless given):

- ``cells.csv``: one row per cell, every cell of every sweep (merged on the cell id; a cell measured more than
  once keeps its newest ``ok`` record, and a plumbing check's record, ``probe.kind`` sleep or fail, never
  replaces a measurement's);
- ``best.csv``: the fastest setting for each model × GPU type × GPU count, measured or (``answer``) predicted,
  with its interval;
- ``frontier.csv``: for each model, the measured cells that no other beats on both days and cost;
- ``layouts.csv`` (where mesh3d cells were measured): each one's measured step time, peak memory and bubble
  beside analysis/predict/parallelism.py's prediction and its terms (``analysis.report.layout_check``);
- ``engines.csv``: DeepSpeed's and FSDP's fastest cells side by side for each model × GPU type × GPU count, and
  the difference (:mod:`analysis.report.engine_comparison`);
- ``scaling.csv``: throughput, energy and cost per token against GPU count and nodes for each model × GPU type ×
  sharding option, with the knee beyond which an added GPU stops paying;
- ``days_vs_gpus.png``, ``cost_vs_days.png``, ``scaling_efficiency.png``;
- ``report.md``: the above tied together, the predictor's accuracy, and the problems found.

Schema of ``cells.csv`` (stable; an empty field means unknown or not applicable)
--------------------------------------------------------------------------------

Identity and settings

- ``sweep``: name of the sweep folder the row comes from. ``cell_id``: stable hash of the cell's settings.
- ``model``, ``gpu``: config names (``conf/model``, ``conf/gpu``). ``num_gpus``, ``num_nodes``: integers.
- ``zero_stage`` (0-3), ``offload_optimizer``, ``offload_params``, ``activation_checkpointing``, ``compile``,
  ``tf32`` (True/False), ``precision`` (bf16, fp16, fp32), ``attention`` (sdpa, eager, flash_attention_2),
  ``micro_batch_size_setting`` (``auto`` or the sequences per micro-batch asked for).
- ``engine`` (``deepspeed``, ``fsdp``; ``deepspeed`` for records from before there was a choice);
  ``fsdp_sharding`` (full, grad_op, none, hybrid), ``fsdp_offload`` (True/False), ``fsdp_reduce_precision``
  (fp32, bf16), ``fsdp_accumulation`` (sharded, unsharded; ``unsharded`` for FSDP records from before the
  setting): FSDP's options, empty for a DeepSpeed cell; ``zero_stage`` and the offload flags are
  DeepSpeed's, empty for a cell of another engine. ``sharding``: the engine's label of how the cell shards
  (``zero2 offload-opt``, ``fsdp-full``, ``fsdp-hybrid``, a mesh3d layout), the column that tells them apart.

Outcome

- ``status``: ``ok``; ``does_not_fit`` (not even micro-batch 1 fits) or ``oom``; a failure (``failed``,
  ``comm_error``, ``compile_error``, ``timeout``, ``invalid``...); ``corrupt`` (record unusable, as ``gpudays
  status`` says); ``no_record`` (no record yet), or the state passed in. ``reason``: text. ``attempt``: submission number of the record.

Measured by the probe (per GPU unless said otherwise)

- ``micro_batch_size`` (sequences), ``grad_accum_steps``, ``per_gpu_batch_size`` (sequences per optimizer step),
  ``tokens_per_step`` (tokens per optimizer step, all GPUs), ``steps_timed``.
- ``step_time_s`` (s per optimizer step, the point estimate), ``step_time_mean_s``, ``step_time_std_s``,
  ``step_time_iqr_s`` (s), ``step_time_ci95_pct`` (half-width of the 95% confidence interval of the mean, % of it).
- ``tokens_per_s`` (all GPUs), ``tokens_per_s_per_gpu`` (empty for a model whose samples are not tokens);
  ``throughput_unit`` (``tokens`` or ``images``: the model family's own), ``throughput_per_s`` (in that unit, all
  GPUs), ``throughput_per_s_per_gpu``; ``model_tflops_per_gpu``, ``hardware_tflops_per_gpu``
  (TFLOP/s); ``mfu``, ``hfu`` (fractions of the dense peak, 0-1).
- ``peak_memory_gib`` (peak allocated GPU memory, GiB), ``peak_memory_reserved_gib``, ``host_rss_gib`` (GiB).
- ``num_parameters`` (count), ``probe_wall_s`` (s the probe ran).

Estimates for the whole training run (cells with status ``ok``, and cells whose ``answer`` is predicted: from
the predicted step time, the days' interval then the prediction's 90% one)

- ``train_tokens`` (tokens of the budget), ``train_steps`` (optimizer steps: the model's ``train_steps`` for its own
  budget, else budget ÷ ``tokens_per_step`` rounded up).
- ``time_to_train_days`` = train_steps × step_time_s / 86400 (days); ``time_to_train_days_low`` and ``_high``: the
  same ∓ ``step_time_ci95_pct`` (rebuilt from std and steps_timed with Student's t when the probe gave none).
- ``gpu_hours`` = num_gpus × train_steps × step_time_s / 3600 (GPU-hours).
- ``cloud_usd_per_gpu_hour`` (USD, from ``conf/gpu``); ``cost_usd_cloud`` = gpu_hours × that (USD);
  ``cloud_price_source`` and ``cloud_price_date``: the list the price is read from and when (or why there is none).
- ``machine_price_usd`` (USD): buying the cell's hardware, per node a base machine ($1,000 / 1,500 / 7,500 /
  10,500 for 1 / 2 / 4 / 8 GPU slots) plus its GPUs at ``purchase_price_usd``; ``cost_usd_amortised`` =
  machine_price_usd × time_to_train_days / (5 × 365) (USD; the "$100K or 100 Days" paper's five-year write-off).
- ``board_power_w`` (W per GPU, from ``conf/gpu``); ``energy_kwh`` = gpu_hours × board_power_w / 1000 (kWh; GPU
  boards at rated power, host and cooling not included).
- The figures above are the training steps' (steady state). ``goodput``: the share of the whole run's wall-clock
  time the steps take (``cluster.goodput``, else 0.90, the published figure of large runs:
  ``analysis.predict.estimates.DEFAULT_GOODPUT``); ``wall_clock_days`` = time_to_train_days / goodput and
  ``wall_clock_gpu_hours`` = gpu_hours / goodput: the run with its restarts, evaluations and checkpoints, as
  published totals count it.

Predicted (see ``analysis/predict/predictor.py``; calibrated on the same report's ``ok`` records where there are any)

- ``predicted_fits``: whether the cell's smallest micro-batch is predicted to fit (True/False);
  ``measured_fits``: True for ``ok``, False for ``does_not_fit``/``oom``, empty otherwise; ``fit_agrees``.
- ``predicted_micro_batch_size``: the micro-batch the predictions below are for (the measured one where there is
  one). ``predicted_peak_memory_gib`` (GiB per GPU), ``memory_error_pct`` = 100 × (predicted ÷ measured − 1) (%).
- ``predicted_step_time_s`` (s), ``step_time_error_pct`` = 100 × (predicted ÷ measured − 1) (%); ``*_low``, ``*_high``:
  90% intervals (``analysis/predict/uncertainty.py``); ``predicted_from_records``: records calibrating the GPU type (0: none);
  ``answer``: measured, does_not_fit, predicted (with its interval) or unknown (``analysis/report/accuracy.py``).

Provenance

- ``hostnames`` (space-separated), ``device_name``, ``torch_version``, ``deepspeed_version``, ``slurm_job_id``,
  ``started_at``, ``finished_at`` (ISO 8601); ``shared_node``: True where another job ran on the cell's nodes at its
  start or end (squeue, on the job side; listed in the problems), False where none did, empty where unknown.
- ``host_load_avg_1m``, ``host_cpus_given``, ``host_other_cpu_use``: the host while the cell was timed (the larger
  load average of start and end, the cores the cell had, others' share of those cores' time, 0-1).

Doubts (:mod:`analysis.report.caveats`; each also listed in the problems)

- ``under_load``: True where others took a quarter of the cell's cores' time, or (that unknown) the load average
  was twice its cores. ``repeat_step_times_s``: every measured step time of a cell measured more than once (merged
  sweeps, earlier attempts); ``repeats_disagree``: True where their 95% intervals do not all overlap.
  ``caveats``: the cell's doubts in words (these two, and an in-sample prediction 50% or more off).

The other tables reuse these names and units; their own columns: ``settings`` (a short label of the settings),
``cells_compared`` (answered cells of that model × GPU × count, measured or predicted), ``cost_basis`` and ``cost_usd`` (the cost the
frontier is drawn on: ``cost_usd_cloud``, or ``gpu_hours`` where no cloud price is known and ``cost_usd`` is
empty). Those of ``scaling.csv`` (speed-up, marginal speed-up per added GPU, the knee, tokens per kWh, dollars
per billion tokens) are described in :mod:`analysis.report.scaling`.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.predict.estimates import TokenBudget, parse_token_budget
from analysis.predict.network import MeasuredProfile
from analysis.predict.predictor import DEFAULT_MARGIN, Calibration, calibrate
from analysis.report import caveats, engine_comparison, layout_check, scaling, tables
from analysis.report.accuracy import adaptive_section, prediction_section
from analysis.report.caveats import CAVEAT_COLUMNS
from analysis.report.repeats import repeat_measurements
from analysis.sweeps.records import HOST_LOAD_COLUMNS, Catalog, load_cells
from orchestrator.config.prices import CloudPrice, price_note
from orchestrator.config.values import Row, Scalar
from orchestrator.engines.registry import identity_keys, identity_keys_if_set
from orchestrator.store.durable import staged_folder

CELLS_COLUMNS: tuple[str, ...] = (
    "sweep", "cell_id", "model", "gpu", "num_gpus", "num_nodes",
    *identity_keys(), "activation_checkpointing", "precision",
    "micro_batch_size_setting", "compile", "compile_scope", "tf32", "attention",
    "engine", *identity_keys_if_set(), "sharding",
    "status", "reason", "attempt",
    "micro_batch_size", "grad_accum_steps", "per_gpu_batch_size", "tokens_per_step", "steps_timed",
    "step_time_s", "step_time_mean_s", "step_time_std_s", "step_time_iqr_s", "step_time_ci95_pct",
    "tokens_per_s", "tokens_per_s_per_gpu", "throughput_unit", "throughput_per_s", "throughput_per_s_per_gpu",
    "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
    "peak_memory_gib", "peak_memory_reserved_gib", "host_rss_gib", "num_parameters", "probe_wall_s",
    "train_tokens", "train_steps", "time_to_train_days", "time_to_train_days_low", "time_to_train_days_high",
    "gpu_hours", "cloud_usd_per_gpu_hour", "cloud_price_source", "cloud_price_date", "cost_usd_cloud",
    "machine_price_usd", "cost_usd_amortised",
    "board_power_w", "energy_kwh", "goodput", "wall_clock_days", "wall_clock_gpu_hours",
    "predicted_fits", "measured_fits", "fit_agrees", "predicted_micro_batch_size", "predicted_peak_memory_gib",
    "predicted_peak_memory_gib_low", "predicted_peak_memory_gib_high", "memory_error_pct", "predicted_step_time_s",
    "predicted_step_time_s_low", "predicted_step_time_s_high", "predicted_from_records", "answer",
    "step_time_error_pct",
    "hostnames", "device_name", "torch_version", "deepspeed_version", "slurm_job_id", "started_at", "finished_at",
    "shared_node", *HOST_LOAD_COLUMNS, *CAVEAT_COLUMNS,
)  # fmt: skip
"""Columns of cells.csv, in order (documented in this module's docstring); the engines' fields from the registry."""

CSV_FLOAT_FORMAT = "%.10g"
MAX_MARKDOWN_ROWS = 60
MAX_MARKDOWN_PROBLEMS = 200


@dataclass
class Report:
    """What :func:`write_report` produced. ``cells`` also carries the model and GPU inputs (``model_*``,
    ``gpu_*`` columns) that :func:`analysis.predict.predictor.calibrate` reads; cells.csv holds :data:`CELLS_COLUMNS`."""

    cells: pd.DataFrame
    best: pd.DataFrame
    frontier: pd.DataFrame
    scaling: pd.DataFrame
    problems: list[str]
    files: list[Path]
    calibration: Calibration = field(default_factory=Calibration)
    budget: TokenBudget = field(default_factory=TokenBudget)
    out_dir: Path | None = None
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Cells the sweeps refused before submission (``skipped.jsonl``): sweep, cell_id, label, reasons."""
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    """engines.csv: DeepSpeed against FSDP per model × GPU type × GPU count."""
    knee: float = scaling.KNEE_MARGINAL_SPEEDUP
    """The marginal speed-up per added GPU below which scaling.csv counts returns as diminished."""


def calibration_from(
    sweep_dirs: Sequence[Path], catalog: Catalog | None = None, profiles: Mapping[str, MeasuredProfile] | None = None
) -> Calibration:
    """Calibrate the predictor on the measured records of some sweeps (none measured: an empty calibration), on
    the links of ``profiles`` (GPU name to its measured profile) where given."""
    frame = load_cells([Path(d) for d in sweep_dirs], catalog=catalog).frame
    if frame.empty or "step_time_s" not in frame.columns:
        return Calibration(profiles=profiles)
    return calibrate(frame, profiles)


def build_tables(
    frame: pd.DataFrame,
    budget: TokenBudget,
    margin: float = DEFAULT_MARGIN,
    problems: list[str] | None = None,
    profiles: Mapping[str, MeasuredProfile] | None = None,
) -> tuple[pd.DataFrame, Calibration]:
    """Estimates, calibration and predictions for the loaded cells; sorted, with stable dtypes."""
    problems = problems if problems is not None else []
    frame = frame.reindex(columns=list(dict.fromkeys([*CELLS_COLUMNS, *frame.columns])))
    cells = tables.add_estimates(frame, budget)
    try:
        calibration = calibrate(cells, profiles)
    except (ValueError, np.linalg.LinAlgError) as exc:  # a calibration failure must not cost the report
        problems.append(f"calibration failed ({exc}); predictions use the uncalibrated defaults")
        calibration = Calibration(profiles=profiles)
    cells = tables.add_predictions(cells, calibration, margin)
    cells = tables.add_predicted_estimates(cells, budget)
    cells = tables.normalise_dtypes(cells)
    order = pd.to_numeric(cells["num_parameters"], errors="coerce")
    cells = (
        cells.assign(_order=order)
        .sort_values(["_order", "model", "gpu", "num_gpus", "num_nodes", "cell_id"], kind="stable", na_position="last")
        .drop(columns="_order")
        .reset_index(drop=True)
    )
    return cells, calibration


def write_report(
    sweep_dirs: Sequence[Path],
    out_dir: Path | None = None,
    tokens: str | None = None,
    plots: bool = True,
    states: Mapping[str, str] | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    catalog: Catalog | None = None,
    knee: float = scaling.KNEE_MARGINAL_SPEEDUP,
    profiles: Mapping[str, MeasuredProfile] | None = None,
) -> Report:
    """Read the sweeps' records and write cells.csv, best.csv, frontier.csv, scaling.csv, plots and report.md.

    ``tokens``: ``None`` for each model's own training run, ``"20x"`` for 20 tokens per parameter, or a count
    such as ``"300e9"`` / ``"300B"`` (a bad value raises ``ValueError`` before anything is read). ``states`` maps
    cell ids to scheduler states, shown as the status of cells that have no record yet. Bad input (a missing,
    empty or corrupt sweep, record or config, an unknown GPU) never stops the report: it is listed in
    ``Report.problems`` and in report.md. ``margin`` is the share of GPU memory the fit prediction keeps free;
    ``knee`` the marginal speed-up per added GPU below which scaling.csv marks returns as diminished;
    ``profiles``: each GPU type's measured profile (its links), where the sweeps hold one.
    """
    budget = parse_token_budget(tokens)
    knee = scaling.check_knee(knee)
    sweep_dirs = [Path(d) for d in sweep_dirs]
    if not sweep_dirs and out_dir is None:
        raise ValueError("write_report needs at least one sweep folder, or an out_dir to write an empty report to")
    loaded = load_cells(sweep_dirs, states=states, catalog=catalog)
    problems = list(loaded.problems)
    cells, calibration = build_tables(loaded.frame, budget, margin, problems, profiles)
    repeats = repeat_measurements(sweep_dirs)
    cells = caveats.add_caveats(cells, repeats)
    problems.extend(caveats.problems(cells, repeats))
    best = tables.best_cells(cells)
    front = tables.frontier(cells)
    scale = scaling.scaling(cells, knee)
    engines = engine_comparison.compare_engines(cells)

    target = Path(out_dir) if out_dir is not None else sweep_dirs[0]
    report = Report(cells, best, front, scale, problems, [], calibration, budget, target, loaded.skipped, engines, knee)
    # Every file is written into a new folder first and renamed into place once all are written: a full disk
    # leaves the old report whole, and the error names the file.
    with staged_folder(target) as new:
        tables_written = [
            _write_csv(tables.csv_cells(cells, CELLS_COLUMNS), new / "cells.csv"),
            _write_csv(best, new / "best.csv"),
            _write_csv(front, new / "frontier.csv"),
            _write_csv(scale, new / "scaling.csv"),
            _write_csv(engines, new / "engines.csv"),
        ]
        # Only the mesh3d cells' records are read again (a large sweep of other engines has none to check).
        meshed = set(cells.loc[cells["engine"] == "mesh3d", "cell_id"]) if "engine" in cells else set()
        layouts = layout_check.check_rows(layout_check.check_sweeps(sweep_dirs, meshed)) if meshed else []
        if layouts:  # mesh3d cells measured: each layout's prediction beside the measurement
            tables_written.append(_write_csv(pd.DataFrame(layouts), new / "layouts.csv"))
        plot_files: list[Path] = []
        if plots:
            try:
                from analysis.report.plots import write_plots

                # The plots draw measurements only: a predicted best would read as measured there.
                measured_best = tables.best_cells(cells, predicted=False)
                plot_files = write_plots(cells, measured_best, front, scale, new, knee)
            except OSError:
                raise
            except Exception as exc:  # a plotting bug must not cost the tables; say what happened instead
                problems.append(f"plots were not drawn: {type(exc).__name__}: {exc}")
        (new / "report.md").write_text(render_markdown(report, sweep_dirs, [target / p.name for p in plot_files]))
    report.files = [target / p.name for p in [*tables_written, *plot_files]] + [target / "report.md"]
    return report


def _write_csv(frame: pd.DataFrame, path: Path) -> Path:
    tables.floats_as_text(frame, CSV_FLOAT_FORMAT).to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)
    return path


# --------------------------------------------------------------------------------------------------------------
# Text output
# --------------------------------------------------------------------------------------------------------------


def _prices(cells: pd.DataFrame) -> str:
    """The source and date of every cloud price the report's costs use (``orchestrator.config.prices``)."""

    def text(value: Scalar) -> str | None:
        return None if value is None or pd.isna(value) else str(value)

    rows: list[Row] = []
    if "cloud_price_source" in cells.columns:
        # The note names each GPU once, by its last row, in the order the GPUs first appear: one row per GPU
        # read here, not one per cell.
        table = cells[["gpu", "cloud_usd_per_gpu_hour", "cloud_price_source", "cloud_price_date"]].astype(object)
        order = {gpu: i for i, gpu in enumerate(table["gpu"].drop_duplicates())}
        last = table.drop_duplicates("gpu", keep="last").to_dict(orient="records")
        rows = sorted(last, key=lambda r: order.get(r["gpu"], len(order)))
    rate = [pd.to_numeric(r.get("cloud_usd_per_gpu_hour"), errors="coerce") for r in rows]
    return price_note(
        CloudPrice(str(r.get("gpu")), None if pd.isna(x) else float(x), text(r.get("cloud_price_source")),
                   text(r.get("cloud_price_date"))) for r, x in zip(rows, rate, strict=True)
    )  # fmt: skip


def _fmt(value: object) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == 0:
            return "0"
        for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
            if abs(v) >= scale:  # 13,917,914,991 tokens/kWh reads as 13.9 billion; the CSV has every digit
                return f"{v / scale:.3g} {word}"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(value)


def _markdown_table(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    if frame.empty:
        return "_none_\n"
    shown = frame.head(MAX_MARKDOWN_ROWS)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in shown.reindex(columns=list(columns)).itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v).replace("|", "/") for v in row) + " |")
    if len(frame) > MAX_MARKDOWN_ROWS:
        lines.append(f"\n_{len(frame) - MAX_MARKDOWN_ROWS} more rows in the CSV._")
    return "\n".join(lines) + "\n"


def render_markdown(report: Report, sweep_dirs: Sequence[Path], plot_files: Sequence[Path]) -> str:
    """The text of report.md."""
    cells = report.cells
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    out = ["# gpudays report", ""]
    out.append(f"Generated {now} from {len(sweep_dirs)} sweep folder(s): " + ", ".join(f"`{d}`" for d in sweep_dirs))
    out.append("")
    out.append(f"Token budget: {report.budget.describe()}.")
    out.append("")
    out.append("## Cells")
    out.append("")
    if cells.empty:
        out.append("No cells were found.")
    else:
        counts = cells["status"].fillna("unknown").value_counts()
        out.append(f"{len(cells)} cells: " + ", ".join(f"{n} {status}" for status, n in counts.items()) + ".")
        out.append("Every cell, its settings, measurements, estimates and predictions: `cells.csv`.")
    out.append("")
    out.append("## Fastest setting per model, GPU type and GPU count (`best.csv`)")
    out.append("")
    out.append(
        "`answer`: measured (the interval is the probe's 95% one) or predicted (the prediction's 90% interval). "
        "Days, GPU-hours and costs are the training steps' (steady state); `wall_clock_days` is the whole "
        "run's at `goodput` (restarts, evaluations and checkpoints included)."
    )
    out.append("")
    best_columns = ["model", "gpu", "num_gpus", "settings", "answer", "time_to_train_days", "time_to_train_days_low",
                    "time_to_train_days_high", "gpu_hours", "cost_usd_cloud", "cost_usd_amortised", "energy_kwh",
                    "wall_clock_days", "goodput", "caveats"]  # fmt: skip
    out.append(_markdown_table(report.best, best_columns))
    out.append("## Days against cost: the frontier (`frontier.csv`)")
    out.append("")
    out.append("Cells no other cell beats on both time to train and cost (cloud cost; GPU-hours where no price).")
    out.append("")
    out.append(
        _markdown_table(
            report.frontier,
            ["model", "gpu", "num_gpus", "settings", "time_to_train_days", "cost_basis", "cost_usd", "gpu_hours"],
        )
    )
    out.extend(["## DeepSpeed against FSDP (`engines.csv`)", "", engine_comparison.describe(report.engines), ""])
    out.append(_markdown_table(engine_comparison.both_measured(report.engines), engine_comparison.MARKDOWN_COLUMNS))
    out.append("## Scaling: where returns diminish (`scaling.csv`)")
    out.append("")
    knees = scaling.knees(report.scaling)
    out.append(scaling.describe_knee(knees, report.knee))
    out.append("")
    if shared := scaling.shared_cpu_probes(report.cells):
        out.append("**Warning:** CPU probes that shared cores with other probes (they ran on the same host at the "
                   "same time): their step times, and any comparison between them, measure the sharing too.")  # fmt: skip
        out.extend(
            [""]
            + [f"- {line}" for line in shared[:20]]
            + ([f"- ... {len(shared) - 20} more"] * (len(shared) > 20))
            + [""]
        )
    out.append(_markdown_table(knees, list(knees.columns)))
    out.append(_markdown_table(report.scaling, scaling.MARKDOWN_COLUMNS))
    out.extend(prediction_section(report.cells, report.calibration, _markdown_table))
    out.extend(adaptive_section(sweep_dirs, report.cells))
    if not report.skipped.empty:
        out.append("## Refused before submission")
        out.append("")
        out.append("Cells that cannot run as asked (from each sweep's `skipped.jsonl`), with the reason:")
        out.append("")
        out.append(_markdown_table(report.skipped, ["label", "reasons", "cell_id"]))
    if plot_files:
        out.append("## Plots")
        out.append("")
        out.extend(f"![{p.stem}]({p.name})" for p in plot_files)
        out.append("")
    out.append("## Problems")
    out.append("")
    if report.problems:
        out.extend(f"- {p}" for p in report.problems[:MAX_MARKDOWN_PROBLEMS])
        if len(report.problems) > MAX_MARKDOWN_PROBLEMS:
            out.append(f"- ... and {len(report.problems) - MAX_MARKDOWN_PROBLEMS} more (see `status` in cells.csv)")
    else:
        out.append("None.")
    out.append("")
    out.append("## How the figures are made")
    out.append("")
    out.append(
        "Days = training steps × measured step time; the interval is the probe's 95% confidence interval of the "
        "mean step time (a cell answered by its prediction: the predicted step time and its 90% interval). Cloud cost = GPU-hours × the hourly price in `conf/gpu`. Amortised cost = (base machine "
        "+ GPUs) × days / (5 × 365), the cost model of Khandelwal et al. 2024. Energy = GPU-hours × board power: "
        "GPUs only, at rated power. Predictions are calibrated on this report's own measured cells, so their "
        "errors here are in-sample."
    )
    out.extend(["", _prices(cells), ""])
    return "\n".join(out)
