"""Benchmark: published pre-training runs against what ``gpudays plan`` would tell a user.

    python benchmarks/published_runs.py [--only ID,ID] [--table FILE]

Each run of ``benchmarks/published_runs.toml`` (source, shape, tokens, sequence length, batch, GPU type and count,
the published layout where there is one, and the published GPU-hours or throughput, wall-clock or steady-state) is
planned with the code ``gpudays plan`` runs (``orchestrator.planning.plan.plan`` with ``costing=True``, then
``orchestrator.cli.display.prediction.predict``, uncalibrated: no records), over the settings a user would plan:
DeepSpeed ZeRO 0-3 and FSDP full/grad_op, each with and without activation checkpointing, plus the 3-D layouts the
plan offers (``analysis.predict.layouts.offers``, each planned as the mesh3d cell its sweep line describes). The row's
answer is the fastest of those predicted to fit, as the plan's answer line gives it. Beside it, where the run
published its layout and the planner can express it (mesh3d tp/pp, FSDP data parallelism, or DeepSpeed ZeRO data
parallelism), that layout's prediction, with checkpointing and the micro-batch as published where they were;
where it cannot, the reason (the engine's refusal).

For each row: predicted / published GPU-hours, the plan's 90% interval, whether the published figure falls inside
it, and the interval's high/low ratio. Steady-state figures (FLOP/s, tokens/s, step time) are turned into the
GPU-hours of the same tokens first. A wall-clock figure also holds restarts, evaluations and checkpoints: it is
scored against the plan's wall-clock GPU-hours (the steps' over the plan's ``goodput``), a steady-state figure
against the steps' own. The summary gives the share within ±30%, the median
|error|, the interval's coverage and its median high/low ratio, for all rows, each kind, the confirmed rows, the
published layouts the planner expresses, and every row as it was run (its published layout's prediction where there
is one, else the fastest setting's: a run that chose a slower layout than the plan's fastest is compared like for
like).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib

if TYPE_CHECKING:
    from orchestrator.config.schema import Config
    from orchestrator.planning.plan import Cell

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = Path(__file__).with_name("published_runs.toml")
KINDS = ("wall-clock", "steady-state")
FIGURES = ("gpu_hours", "tflops_per_gpu", "tokens_per_s_per_gpu", "step_s")
REQUIRED = (
    "id", "name", "source", "verified", "kind", "figure", "value", "gpu", "num_gpus", "model", "seq_length",
    "global_batch", "tokens",
)  # fmt: skip
SETTINGS = (
    "method.engine=deepspeed,fsdp", "method.zero_stage=0,1,2,3", "method.fsdp_sharding=full,grad_op",
    "method.activation_checkpointing=false,true",
)  # fmt: skip
"""The data-parallel settings a user plans: DeepSpeed ZeRO 0-3 and FSDP full and grad_op, with and without
activation checkpointing (one sweep; the plan refuses the crossings of one engine's setting with the other
engine)."""
WITHIN = 0.30


@dataclass(frozen=True)
class Run:
    """One row of the table (see the file's header for each field)."""

    id: str
    name: str
    source: str
    verified: str
    kind: str
    figure: str
    value: float
    gpu: str
    num_gpus: int
    model: str
    seq_length: int
    global_batch: int
    tokens: float
    gpus_published: bool = True
    shape: Mapping[str, Any] = field(default_factory=dict)
    stand_in: str = ""
    layout: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""

    @property
    def confirmed(self) -> bool:
        return not self.verified.lower().startswith("unconfirmed")

    @property
    def train_steps(self) -> int:
        return math.ceil(self.tokens / (self.global_batch * self.seq_length))

    def overrides(self) -> list[str]:
        """The ``gpudays plan`` overrides of the run's cell: its model (or stand-in) and recipe, GPU and count."""
        out = [f"model={self.model}", f"model.name={self.id}", "model.num_parameters=null"]
        out += [f"model.{key}={value}" for key, value in self.shape.items()]
        out += [
            f"model.seq_length={self.seq_length}",
            f"model.global_batch_size={self.global_batch}",
            f"model.train_steps={self.train_steps}",
            f"gpu={self.gpu}",
            f"num_gpus={self.num_gpus}",
            "cluster=slurm",
        ]
        return out


def parse(text: str) -> list[Run]:
    """The table's runs; ValueError naming the row and the field where a field is missing or out of its set."""
    rows = tomllib.loads(text).get("run", [])
    out: list[Run] = []
    for i, row in enumerate(rows):
        where = f"run {i + 1} ({row.get('id', 'no id')})"
        missing = [key for key in REQUIRED if row.get(key) in (None, "")]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if row["kind"] not in KINDS:
            raise ValueError(f"{where}: kind {row['kind']!r} is not one of {', '.join(KINDS)}")
        if row["figure"] not in FIGURES:
            raise ValueError(f"{where}: figure {row['figure']!r} is not one of {', '.join(FIGURES)}")
        unknown = set(row) - set(Run.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        out.append(Run(**row))
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return out


def load(path: Path = TABLE) -> list[Run]:
    return parse(path.read_text())


def published_gpu_hours(run: Run, flops_per_token: float) -> float:
    """The published figure as GPU-hours of the run's tokens (its train steps, for a step time)."""
    if run.figure == "gpu_hours":
        return float(run.value)
    if run.figure == "tokens_per_s_per_gpu":
        return run.tokens / (run.value * 3600.0)
    if run.figure == "tflops_per_gpu":
        return run.tokens * flops_per_token / (run.value * 1e12 * 3600.0)
    if run.figure == "step_s":
        return run.train_steps * run.value * run.num_gpus / 3600.0
    raise ValueError(f"{run.id}: unknown figure {run.figure!r}")


def mfu(run: Run, gpu_hours: float, flops_per_token: float, peak_tflops: float) -> float:
    """The model-FLOPs utilisation ``gpu_hours`` imply for the run's tokens: model FLOPs (the project's count per
    token, times the tokens) over the GPU-seconds at the GPU's dense peak for the precision. Of a wall-clock figure it is the
    effective one, restarts and evaluations included."""
    return run.tokens * flops_per_token / (gpu_hours * 3600.0 * peak_tflops * 1e12)


@dataclass(frozen=True)
class Score:
    """A prediction against the published figure."""

    ratio: float
    """Predicted / published."""
    inside: bool
    """The published figure lies in the prediction's 90% interval."""
    spread: float
    """The interval's high / low."""

    @property
    def abs_error(self) -> float:
        return abs(self.ratio - 1.0)


def score(predicted: float, low: float, high: float, published: float) -> Score:
    return Score(predicted / published, low <= published <= high, high / low)


@dataclass(frozen=True)
class Answer:
    """One setting's predicted GPU-hours (with the plan's 90% interval), or why there is none."""

    setting: str = ""
    gpu_hours: float = math.nan
    low: float = math.nan
    high: float = math.nan
    fits: bool = True
    reason: str = ""
    goodput: float = 1.0
    """The share of the run's wall-clock time the plan takes its steps to be (its ``goodput``): a wall-clock
    published figure is scored against the plan's wall-clock GPU-hours, the steps' over it."""

    @property
    def answered(self) -> bool:
        return math.isfinite(self.gpu_hours)


def _float(value: object) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return out


def _answer(cell: Cell) -> Answer:
    from orchestrator.cells import cell as cells_mod

    p, typed = cell.prediction, cell.typed
    # The label less what the row already says: the model, the GPUs and their nodes.
    head = f"{typed.model.name} {typed.gpu.name} x{typed.num_gpus} " + (
        f"on {typed.num_nodes} nodes " if typed.num_nodes > 1 else ""
    )
    return Answer(
        setting=cells_mod.label(typed).removeprefix(head),
        gpu_hours=_float(p.get("predicted_gpu_hours")),
        low=_float(p.get("predicted_gpu_hours_low")),
        high=_float(p.get("predicted_gpu_hours_high")),
        fits=p.get("predicted_fits") is not False,
        goodput=_float(p.get("goodput")) or 1.0,
    )


def planned(overrides: Sequence[str], run_anyway: bool = False) -> tuple[list[Cell], list[Cell]]:
    """The cells ``gpudays plan`` composes, judges and predicts for ``overrides``: (runnable, refused)."""
    from orchestrator.cli.display import prediction
    from orchestrator.planning.plan import plan

    p = plan(list(overrides), costing=True)
    prediction.predict(p, run_anyway=run_anyway)
    return p.cells, p.skipped


def _reasons(cells: Sequence[Cell]) -> str:
    """The refusals of ``cells``, the most common first (those every cell shares before those of some)."""
    counts: dict[str, int] = {}
    for c in cells:
        for r in c.refusals:
            counts[f"{r.key}: {r.reason}"] = counts.get(f"{r.key}: {r.reason}", 0) + 1
    found = sorted(counts, key=lambda text: -counts[text])
    return "; ".join(found[:2]) + (f" (+{len(found) - 2} more)" if len(found) > 2 else "")


def fastest(run: Run) -> tuple[Answer, Config | None]:
    """What the plan tells a user: the fastest setting predicted to fit, of the data-parallel settings and the
    3-D layouts the plan offers (each planned as its mesh3d cell), offered also where every data-parallel cell is
    refused; else why none. With it, the run's cell as the plan composes it, with its model, GPU and precision (None
    where the run could not be planned)."""
    from analysis.predict.layouts import offers
    from orchestrator.planning.plan import SweepError

    try:
        fitting, refused = planned([*run.overrides(), *SETTINGS])
        typed = [*fitting, *refused][0].typed
        found = offers((c.typed, c.prediction) for c in [*fitting, *refused])
        for offer in found:
            cells, skipped = planned([*run.overrides(), *offer.overrides])
            fitting += cells
            refused += skipped
    except SweepError as e:
        return Answer(reason=f"cannot plan: {e}"), None
    answers = [a for a in map(_answer, fitting) if a.answered]
    if not answers:
        return Answer(reason=f"no setting fits and no 3-D layout is offered: {_reasons(refused)}"), typed
    return min(answers, key=lambda a: a.gpu_hours), typed


def published_layout(run: Run) -> Answer | None:
    """The published layout's prediction (the fastest of it with and without checkpointing), or why the planner
    cannot express it; None where the run published none."""
    from orchestrator.planning.plan import SweepError

    lay = run.layout
    if not lay:
        return None
    tp, pp = int(lay.get("tp", 1)), int(lay.get("pp", 1))
    # Checkpointing as published where it was, else the faster of with and without.
    published = lay.get("checkpointing")
    checkpointing = "method.activation_checkpointing=" + (
        "false,true" if published is None else str(bool(published)).lower()
    )
    if lay.get("fsdp"):
        method = ["method.engine=fsdp", checkpointing]
    elif "zero_stage" in lay and tp == pp == 1:
        method = ["method.engine=deepspeed", f"method.zero_stage={int(lay['zero_stage'])}", checkpointing]
    else:
        method = ["method.engine=mesh3d", f"method.tp={tp}", f"method.pp={pp}", checkpointing]
        if pp > 1:
            micro = int(lay.get("micro_batch", 1))
            replicas = max(1, run.num_gpus // (tp * pp))
            method += [f"method.micro_batch_size={micro}"]
            method += [f"method.pp_microbatches={max(1, run.global_batch // (replicas * micro))}"]
            if "schedule" in lay:  # as published, its stages a rank as published or the plan's default
                method += [f"method.pp_schedule={lay['schedule']}"]
                method += [f"method.pp_chunks={int(lay['chunks'])}"] if "chunks" in lay else []
    if pp == 1 and "micro_batch" in lay:
        method += [f"method.micro_batch_size={int(lay['micro_batch'])}"]
    try:
        cells, skipped = planned([*run.overrides(), *method], run_anyway=True)
    except SweepError as e:
        return Answer(reason=f"cannot plan: {e}")
    answers = [a for a in map(_answer, cells) if a.answered]
    if not answers:
        return Answer(reason=_reasons(skipped) or "no prediction")
    best = min(answers, key=lambda a: (not a.fits, a.gpu_hours))
    return best


@dataclass(frozen=True)
class Row:
    run: Run
    published: float
    """The published figure as GPU-hours."""
    answer: Answer
    layout: Answer | None
    flops_per_token: float = math.nan
    """The model's FLOPs per token (:func:`orchestrator.models.flops_per_token`), for :meth:`mfus`."""
    peak_tflops: float = math.nan
    """The GPU's dense peak for the planned precision (:func:`orchestrator.models.peak_tflops`), for :meth:`mfus`."""

    def goodput(self, a: Answer) -> float:
        """What an answer's GPU-hours are divided by to be scored: its goodput for a wall-clock published figure
        (against the plan's wall-clock GPU-hours), 1 for a steady-state one (against the steps')."""
        return a.goodput if self.run.kind == "wall-clock" else 1.0

    def mfus(self) -> tuple[float, float]:
        """The model-FLOPs utilisation the published figure implies, and the one of the scored prediction."""
        a = self.answer
        predicted = (
            mfu(self.run, a.gpu_hours / self.goodput(a), self.flops_per_token, self.peak_tflops)
            if a.answered
            else math.nan
        )
        return mfu(self.run, self.published, self.flops_per_token, self.peak_tflops), predicted

    def _score(self, a: Answer | None) -> Score | None:
        if a is None or not a.answered:
            return None
        g = self.goodput(a)
        return score(a.gpu_hours / g, a.low / g, a.high / g, self.published)

    @property
    def score(self) -> Score | None:
        return self._score(self.answer)

    @property
    def layout_score(self) -> Score | None:
        return self._score(self.layout)

    @property
    def as_run_score(self) -> Score | None:
        """The run as it was run: its published layout's prediction where the planner expresses it (fitting or
        not: the run's own GPU-hours are of that layout), else the fastest setting's. The fastest setting scores
        the plan's answer; a published run that chose a slower layout than the plan's fastest differs from it by
        that choice as well as by the predictor's error, and this score takes the choice out where it is known."""
        return self.layout_score or self.score


def evaluate(run: Run) -> Row:
    from orchestrator.models import flops_per_token, peak_tflops

    answer, typed = fastest(run)
    if typed is None:
        return Row(run, math.nan, answer, published_layout(run))
    per_token = flops_per_token(typed.model)
    peak = _float(peak_tflops(typed.gpu, typed.method))
    return Row(run, published_gpu_hours(run, per_token), answer, published_layout(run), per_token, peak)


def summary(scores: Sequence[Score]) -> str:
    """Share within ±30%, median |error|, coverage of the 90% interval, median high/low ratio."""
    if not scores:
        return "no rows"
    n = len(scores)
    within = sum(s.abs_error <= WITHIN + 1e-12 for s in scores) / n  # 30% itself is within
    inside = sum(s.inside for s in scores) / n
    return (
        f"{n} rows: within ±{WITHIN:.0%} {within:.0%}, median |error| {statistics.median(s.abs_error for s in scores):.0%}, "
        f"90% interval coverage {inside:.0%}, median high/low {statistics.median(s.spread for s in scores):.1f}"
    )


def _num(value: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _score_cells(s: Score | None) -> list[str]:
    if s is None:
        return ["-", "-", "-"]
    return [f"{s.ratio:.2f}", "yes" if s.inside else "no", f"{s.spread:.1f}"]


def render(rows: Sequence[Row]) -> str:
    head = ["run", "kind", "gpus", "published_gpu_h", "fastest setting", "pred_gpu_h", "90% interval",
            "pred/pub", "inside", "hi/lo", "MFU pub/pred", "published layout", "layout pred/pub"]  # fmt: skip
    table: list[list[str]] = [head]
    below: list[str] = []
    for row in rows:
        r, a = row.run, row.answer
        gpus = f"{r.num_gpus}{'' if r.gpus_published else '*'}"
        flag = "" if r.confirmed else " (unconfirmed)"
        if a.answered:
            g = row.goodput(a)  # the figure scored: wall-clock where published so
            setting, pred, interval = a.setting, _num(a.gpu_hours / g), f"{_num(a.low / g)}-{_num(a.high / g)}"
        else:
            setting, pred, interval = "(none)", "-", "-"
            below.append(f"  {r.id}: {a.reason}")
        lay = row.layout
        if lay is None:
            lay_text, lay_ratio = "not published", "-"
        elif lay.answered:
            lay_text = lay.setting + ("" if lay.fits else " (predicted not to fit)")
            lay_text += " (layout unconfirmed)" if r.layout.get("confirmed") is False else ""
            s = row.layout_score
            lay_ratio = f"{s.ratio:.2f}" if s else "-"
        else:
            lay_text, lay_ratio = "cannot express", "-"
            below.append(f"  {r.id} published layout {_layout_text(r)}: {lay.reason}")
        table.append([r.id + flag, r.kind, gpus, _num(row.published), setting, pred, interval,
                      *_score_cells(row.score), _mfu_text(row), lay_text, lay_ratio])  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table)
    notes = "\n".join(f"  {r.run.id}: stand-in: {r.run.stand_in}" for r in rows if r.run.stand_in)
    out = [text, "* GPU count not published: assumed (see the table's notes)",
           "pred_gpu_h: the whole run's (wall-clock, at the plan's goodput) for a wall-clock row, the steps' for a "
           "steady-state one",
           "MFU pub/pred: the model-FLOPs utilisation the published and the predicted figure imply (the model's FLOPs "
           "per token x tokens over GPU-hours at the GPU's dense peak for the planned precision; a wall-clock row's includes goodput)"]  # fmt: skip
    if below:
        out += ["why a row has no figure:", *below]
    if notes:
        out += ["stand-ins (no model family for the shape):", notes]
    return "\n".join(out)


def _mfu_text(row: Row) -> str:
    published, predicted = row.mfus()
    return "/".join("-" if not math.isfinite(m) else f"{m:.0%}" for m in (published, predicted))


def _layout_text(run: Run) -> str:
    lay = run.layout
    if lay.get("fsdp"):
        return "FSDP"
    if "zero_stage" in lay and int(lay.get("tp", 1)) == int(lay.get("pp", 1)) == 1:
        return f"DeepSpeed ZeRO-{int(lay['zero_stage'])} dp{run.num_gpus}"
    return (
        f"tp{lay.get('tp', 1)} pp{lay.get('pp', 1)} dp{run.num_gpus // (int(lay.get('tp', 1)) * int(lay.get('pp', 1)))}"
    )


def summaries(rows: Sequence[Row]) -> list[str]:
    scored = [(r, r.score) for r in rows if r.score is not None]
    lines = [f"fastest setting, all: {summary([s for _, s in scored])}"]
    for kind in KINDS:
        lines.append(f"fastest setting, {kind}: {summary([s for r, s in scored if r.run.kind == kind])}")
    lines.append(f"fastest setting, confirmed figures: {summary([s for r, s in scored if r.run.confirmed])}")
    counted = [s for r, s in scored if r.run.confirmed and r.run.gpus_published]
    lines.append(f"fastest setting, confirmed figures on the published GPU count: {summary(counted)}")
    laid = [s for s in (r.layout_score for r in rows) if s is not None]
    lines.append(f"published layouts the planner expresses: {summary(laid)}")
    as_run = [s for s in (r.as_run_score for r in rows) if s is not None]
    lines.append(f"as run (the published layout where expressed, else the fastest setting), all: {summary(as_run)}")
    unanswered = [r.run.id for r in rows if r.score is None]
    if unanswered:
        lines.append(f"no answer: {', '.join(unanswered)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated run ids")
    parser.add_argument("--table", type=Path, default=TABLE, help="the table of runs (default: %(default)s)")
    args = parser.parse_args(argv)
    runs = load(args.table)
    if args.only:
        wanted = set(args.only.split(","))
        runs = [r for r in runs if r.id in wanted]
    from orchestrator.planning import compose_cache

    compose_cache.keep_between_plans(True)  # the runs share their config-group choices: compose each set once
    start = time.monotonic()
    rows = [evaluate(r) for r in runs]
    print(render(rows))
    print()
    print("\n".join(summaries(rows)))
    print(
        f"predictor: the plan's step-time model, uncalibrated (no records); {len(rows)} runs in "
        f"{time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
