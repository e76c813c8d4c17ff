"""``gpudays budget`` (what a budget buys) and ``gpudays shortest`` (the shortest possible training).

Both read ``conf/model``, ``conf/gpu`` and ``conf/cluster``; ``budget --from SWEEP_DIR`` adds measured throughput
from a sweep's records. Each writes a CSV (every column) and prints a table (the main columns); their arguments are
``orchestrator.cli.parser``'s.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.cli.display.views import MODEL_COLUMNS, OPTIMAL_COLUMNS, SHORTEST_COLUMNS
from orchestrator.store.durable import write_text_atomic

# The analysis (numpy, pandas, rich) is imported when a command runs: ``gpudays`` loads this module only then.
if TYPE_CHECKING:
    import pandas as pd
    from _typeshed import DataclassInstance
    from rich.console import Console

    from analysis.planners.budget import Measured
    from orchestrator.cli.display.tabular import Column, Tabular
    from orchestrator.config.schema import ClusterConfig, GpuConfig, ModelConfig
    from orchestrator.config.values import Container, Row

T = TypeVar("T", bound="DataclassInstance")


SMALLEST_DEFAULT_MODEL = 10_000_000
"""Models under this many parameters (the CPU demo model) are left out unless named."""


def _typed(cls: type[T], data: Container, where: str) -> T:
    names = {f.name for f in fields(cls)}
    unknown = sorted(k for k in data if k not in names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(names))}")
    return cls(**data)


def _group(group: str) -> dict[str, Container]:
    from orchestrator.config.groups import read_group
    from orchestrator.config.places import CONF_DIR

    return read_group(CONF_DIR / group)


def _pick(group: str, cls: type, names: list[str]) -> list[Any]:
    known = _group(group)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {group} {', '.join(unknown)}; known (conf/{group}): {', '.join(sorted(known))}")
    return [_typed(cls, known[n], f"conf/{group}/{n}.yaml") for n in names]


def _whole(value: object) -> int:
    return value if isinstance(value, int) else 0


def _names(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def _gpus(text: str | None) -> list[GpuConfig]:
    from orchestrator.config.schema import GpuConfig

    names = _names(text) or [n for n, d in _group("gpu").items() if d.get("accelerator", "cuda") != "cpu"]
    return list(_pick("gpu", GpuConfig, names))


def _models(text: str | None, sizes: str | None, default_all: bool) -> list[ModelConfig]:
    from analysis.planners.budget import parse_size, sized_model
    from orchestrator.config.schema import ModelConfig
    from orchestrator.models import SCALING_LAW_FAMILIES, scaling_law_error

    names = _names(text)
    if not names and not _names(sizes) and default_all:  # --size alone: those models, not every bundled one
        names = [
            n
            for n, d in _group("model").items()
            if _whole(d.get("num_parameters")) >= SMALLEST_DEFAULT_MODEL
            and d.get("family", "gpt_neox") in SCALING_LAW_FAMILIES
        ]
    models = list(_pick("model", ModelConfig, names))
    refused = [error for m in models if (error := scaling_law_error(m, "budget and shortest")) is not None]
    if refused:
        raise ValueError("; ".join(refused))
    models += [sized_model(parse_size(size)) for size in _names(sizes)]
    return models


def _cluster(name: str | None) -> ClusterConfig | None:
    from orchestrator.config.schema import ClusterConfig

    return _pick("cluster", ClusterConfig, [name])[0] if name else None


@dataclass(frozen=True)
class FromRecords:
    """What a sweep's records tell: measured throughput by (model, GPU type), and a calibrated efficiency by GPU."""

    measured: dict[tuple[str, str], Measured] = field(default_factory=dict)
    efficiency: dict[str, tuple[float, str]] = field(default_factory=dict)


def from_records(sweep_dirs: list[str]) -> FromRecords:
    """The best measured tokens/s per GPU of each (model, GPU type) among the ``ok`` records of the sweeps, and
    the median achieved share of the peak (HFU, else MFU) of each GPU type's records."""
    import pandas as pd

    from analysis.planners.budget import Measured
    from analysis.report.layout_check import layout_efficiency, sweep_records
    from analysis.sweeps.records import load_cells

    for folder in sweep_dirs:
        if not (Path(folder) / "cells").is_dir():
            raise ValueError(f"--from {folder}: not a sweep folder (it has no cells/ folder)")
    frame = load_cells([Path(d) for d in sweep_dirs]).frame
    out = FromRecords()
    if frame.empty or "tokens_per_s_per_gpu" not in frame:
        return out
    ok = frame[(frame["status"] == "ok") & frame["tokens_per_s_per_gpu"].notna()]
    for (model, gpu), group in ok.groupby(["model", "gpu"]):
        best = group.loc[group["tokens_per_s_per_gpu"].idxmax()]
        mfu = best.get("mfu")
        out.measured[(str(model), str(gpu))] = Measured(
            float(best["tokens_per_s_per_gpu"]), None if pd.isna(mfu) else float(mfu), int(best["num_gpus"]),
            str(best["sweep"]),
        )  # fmt: skip
    # The achieved share of the peak in the records (hardware FLOPs, recomputation included) stands in for the
    # default efficiency on that GPU type; the median, so that one odd cell does not decide it.
    share = ok["hfu"].fillna(ok["mfu"]) if "hfu" in ok and "mfu" in ok else pd.Series(dtype=float)
    for gpu, values in share.dropna().groupby(ok["gpu"]):
        median = float(values.median())
        if 0.0 < median <= 1.0:
            out.efficiency[str(gpu)] = (median, f"median of {len(values)} record(s)")
    # Where the sweeps measured 3D layouts on a GPU type, their achieved rate decides instead: the planners cost
    # their layouts at it (analysis/report/layout_check.py).
    out.efficiency.update(layout_efficiency(sweep_records([Path(d) for d in sweep_dirs])))
    return out


def _fmt(column: str, value: Any) -> str:
    """A value of ``budget``'s and ``shortest``'s tables: tokens in billions, shares in percent, dollars whole, any
    other number as every table writes it (``figures``)."""
    import numbers

    import pandas as pd

    from orchestrator.cli.display.figures import count, figure

    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, str):
        return value
    if column in ("tokens", "compute_optimal_tokens"):
        return f"{value / 1e9:,.1f}B"
    if column == "mfu" or column == "bubble_fraction":
        return f"{value:.1%}"
    if column.endswith("_usd"):
        return f"${value:,.0f}"
    if column in ("days", "wall_clock_days"):
        return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"
    if isinstance(value, float):
        return figure(value)
    if isinstance(value, numbers.Integral):
        return count(int(value))
    return str(value)


def _view(frame: pd.DataFrame, columns: tuple[Column, ...]) -> Tabular:
    """The frame as a table: ``columns`` on a terminal (left out for width in their stated order), every column
    with ``--format``."""
    from rich.text import Text

    from orchestrator.cli.display.tabular import Tabular

    rows = frame.to_dict(orient="records")
    shown = tuple(c for c in columns if c.key in frame.columns)
    return Tabular(shown, rows, text=lambda key, value: Text(_fmt(key, value)))


def _print(console: Console, title: str, frame: pd.DataFrame, columns: tuple[Column, ...]) -> None:
    import pandas as pd
    from rich.text import Text

    console.print(Text(title, style="italic"))
    console.print(_view(frame, columns))
    if "reason" not in frame.columns:
        return
    missing = frame["num_gpus"].isna() if "num_gpus" in frame.columns else pd.Series(True, index=frame.index)
    for _, row in frame[missing].iterrows():
        console.print(Text(f"{row.get('model') or ''} on {row['gpu']}: {row['reason']}", style="yellow"))


def _machine(form: str, tables: dict[str, pd.DataFrame]) -> None:
    """``--format csv|json`` on stdout: every column of every table; in CSV one table with a ``table`` column
    naming each row's (``models``, ``optimal``; ``shortest``), in JSON an object of lists, one per table."""
    import json

    import pandas as pd

    from orchestrator.cli.display.tabular import as_csv

    if form == "csv":
        frames = [f.assign(table=name)[["table", *f.columns]] for name, f in tables.items() if not f.empty]
        rows = pd.concat(frames, ignore_index=True).to_dict(orient="records") if frames else []
        sys.stdout.write(as_csv(rows))
    else:
        out = {name: json.loads(f.to_json(orient="records")) for name, f in tables.items()}
        sys.stdout.write(json.dumps(out, indent=1) + "\n")


def _predictor_note(gpus: list[GpuConfig], cluster: ClusterConfig | None) -> str:
    from analysis.predict.estimates import goodput_of
    from analysis.predict.parallelism import PREDICTOR
    from orchestrator.config.prices import cloud_prices, price_note

    given = cluster is not None and cluster.goodput is not None
    whose = "the cluster config's goodput" if given else "cluster.goodput unset: the published figure of large runs"
    wall = (
        f"days and gpu_hours: the training steps' (steady state); wall_clock_days and wall_clock_gpu_hours: the "
        f"whole run's at {goodput_of(cluster.goodput if cluster else None):.0%} goodput ({whose}: restarts, "
        "evaluations and checkpoints)"
    )
    return f"predicted rows: the {PREDICTOR}\n{wall}\n" + price_note(cloud_prices(gpus))


def _with_wall_clock(frame: pd.DataFrame, cluster: ClusterConfig | None) -> pd.DataFrame:
    """``frame`` with ``goodput`` and the whole run's ``wall_clock_days`` and ``wall_clock_gpu_hours`` beside each
    row's steady-state ``days`` and ``gpu_hours``, as ``plan`` and the report give them."""
    from analysis.predict.estimates import goodput_of, wall_clock

    if frame.empty or "days" not in frame.columns:
        return frame
    goodput = goodput_of(cluster.goodput if cluster else None)
    days = frame.columns.get_loc("days") + 1
    out = frame.copy()
    out.insert(int(days), "wall_clock_days", wall_clock(out["days"].astype(float), goodput))
    out["goodput"] = goodput
    out["wall_clock_gpu_hours"] = wall_clock(out["gpu_hours"].astype(float), goodput)
    return out


def _write(frame: pd.DataFrame, out: str | None, name: str, console: Console) -> None:
    if out:
        path = Path(out) / name
        write_text_atomic(path, frame.to_csv(index=False))
        console.print(f"wrote {path}")


def _efficiency(args: argparse.Namespace, records: FromRecords, gpu: GpuConfig) -> tuple[float, str]:
    from analysis.predict.step_time import DEFAULT_EFFICIENCY

    if args.efficiency is not None:
        if not 0.0 < args.efficiency <= 1.0:
            raise ValueError(f"--efficiency {args.efficiency:g}: a share of the peak, above 0 and at most 1")
        return args.efficiency, "given"
    return records.efficiency.get(gpu.name, (DEFAULT_EFFICIENCY, "default"))


def run_budget(args: argparse.Namespace, console: Console) -> int:
    import pandas as pd

    from analysis.planners.budget import (
        DEFAULT_MAX_DAYS,
        DEFAULT_OVERRUN_PCT,
        optimal_for_budget,
        parse_budget,
        tokens_for_budget,
    )
    from analysis.predict.network import network_for
    from analysis.predict.parallelism import PREDICTOR
    from orchestrator.models import num_parameters

    max_days = DEFAULT_MAX_DAYS if args.max_days is None else args.max_days
    overrun_pct = DEFAULT_OVERRUN_PCT if args.overrun_pct is None else args.overrun_pct
    budget = parse_budget(args.gpu_hours, args.usd, args.pricing, args.gpus, args.days)
    gpus, cluster = _gpus(args.gpu), _cluster(args.cluster)
    models = sorted(_models(args.model, args.size, default_all=True), key=num_parameters)
    records = from_records(args.sweeps) if args.sweeps else FromRecords()
    model_rows: list[Row] = []
    optimal_rows: list[Row] = []
    for gpu in gpus:
        network = network_for(gpu, cluster)
        efficiency, source = _efficiency(args, records, gpu)
        tags: Row = {
            "efficiency": efficiency, "efficiency_source": source, "network": network.source, "predictor": PREDICTOR,
        }  # fmt: skip
        for row in optimal_for_budget(gpu, budget, network, efficiency, overrun_pct=overrun_pct, max_days=max_days):
            optimal_rows.append({**row, **tags})
        for model in models:
            measured = records.measured.get((model.name, gpu.name))
            for row in tokens_for_budget(model, gpu, budget, network, measured, max_days, efficiency):
                model_rows.append({**row, **tags} if row["source"] == "predicted" else {**row, "network": None})
    models_frame = _with_wall_clock(pd.DataFrame(model_rows), cluster)
    optimal_frame = _with_wall_clock(pd.DataFrame(optimal_rows), cluster)
    if args.format != "table":
        _machine(args.format, {"models": models_frame, "optimal": optimal_frame})
    else:
        _print(console, f"What {budget.describe()} trains (a)", models_frame, MODEL_COLUMNS)
        _print(console, f"The compute-optimal model for {budget.describe()} (b)", optimal_frame, OPTIMAL_COLUMNS)
        console.print(_predictor_note(gpus, cluster), highlight=False)
    _write(models_frame, args.out, "budget_models.csv", console)
    _write(optimal_frame, args.out, "budget_optimal.csv", console)
    return 0


def run_shortest(args: argparse.Namespace, console: Console) -> int:
    import pandas as pd

    from analysis.planners.shortest import MAX_GPUS, shortest_training
    from analysis.predict.estimates import parse_token_budget, train_tokens
    from analysis.predict.network import network_for
    from analysis.predict.parallelism import PREDICTOR
    from orchestrator.models import num_parameters

    max_gpus = MAX_GPUS if args.max_gpus is None else args.max_gpus
    gpus, cluster = _gpus(args.gpu), _cluster(args.cluster)
    models = _models(args.model, args.size, default_all=False)
    if not models:
        raise ValueError("name at least one model: --model pythia-1b[,pythia-12b] or --size 70B")
    token_budget = parse_token_budget(args.tokens)
    conf_names = set(_names(args.model))
    records = from_records(args.sweeps) if args.sweeps else FromRecords()
    rows: list[Row] = []
    for gpu in gpus:
        network = network_for(gpu, cluster)
        efficiency, source = _efficiency(args, records, gpu)
        for model in models:
            own = float(model.train_steps * model.global_batch_size * model.seq_length)
            # A model described by size has no training run of its own: compute-optimal, 20 tokens a parameter.
            budget = token_budget if args.tokens or model.name in conf_names else parse_token_budget("20x")
            run_tokens = train_tokens(budget, own, num_parameters(model))
            assert run_tokens is not None  # parse_token_budget gives every absolute budget its value
            tokens = float(run_tokens)
            for run in shortest_training(
                model, gpu, network, tokens, args.loss, args.global_batch, efficiency, max_gpus
            ):
                est = run.estimate
                rate = gpu.cloud_usd_per_gpu_hour
                rows.append({
                    "model": run.model, "num_parameters": run.num_parameters, "gpu": run.gpu, "source": "predicted",
                    "parallelism": run.parallelism, "point": run.point, "tokens": run.tokens,
                    "loss_nats": run.loss_nats, "loss_source": run.loss_source,
                    "critical_batch_tokens": run.critical_batch_tokens, "global_batch_size": run.global_batch_size,
                    "batch_source": run.batch_source, "max_gpus_by_batch": run.max_gpus_by_batch,
                    "num_gpus": run.num_gpus, "layout": est.layout.describe() if est else None,
                    "memory_gib": est.memory_gib if est else None, "mfu": est.mfu if est else None,
                    "bubble_fraction": est.bubble_fraction if est else None, "step_time_s": est.step_time_s if est else None,
                    "train_steps": run.train_steps, "days": run.days, "gpu_hours": run.gpu_hours,
                    "cloud_cost_usd": run.gpu_hours * rate if run.gpu_hours and rate else None, "reason": run.reason,
                    "efficiency": efficiency, "efficiency_source": source,
                })  # fmt: skip
    frame = _with_wall_clock(pd.DataFrame(rows).assign(predictor=PREDICTOR), cluster) if rows else pd.DataFrame(rows)
    if args.format != "table":
        _machine(args.format, {"shortest": frame})
    else:
        _print(console, "The shortest training (predicted)", frame, SHORTEST_COLUMNS)
        console.print(_predictor_note(gpus, cluster), highlight=False)
    _write(frame, args.out, "shortest.csv", console)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``budget`` or ``shortest``; a user's mistake is one line on stderr and exit status 2."""
    from orchestrator.cli.display.console import make_console

    if getattr(args, "format", "table") != "table":  # stdout carries the data alone
        console = make_console(stderr=True)
    else:
        console = make_console(width=getattr(args, "width", None))
    try:
        if args.budget_command == "shortest":
            return run_shortest(args, console)
        return run_budget(args, console)
    except ValueError as exc:
        print(f"gpudays {args.budget_command}: error: {exc}", file=sys.stderr)
        return 2
