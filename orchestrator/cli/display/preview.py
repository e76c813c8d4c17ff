"""What ``gpudays plan`` and ``sweep --dry-run`` show: the plan's cells, their predicted cost, and how many of them
a sweep would submit (a cell already in the sweep folder is not submitted again, so it is not counted)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.cli.display import console, prediction
from orchestrator.cli.errors import CommandError, Exit
from orchestrator.cli.flow import check, in_sweep_already
from orchestrator.models import family_module
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import launch

if TYPE_CHECKING:
    from orchestrator.planning.plan import Plan


def show_plan(plan: Plan, predictions: bool) -> None:
    """The plan's folder, its cells and refusals; with ``predictions``, every cell's predicted cost."""
    c = console.make_console()
    c.print(console.plan_summary(plan, preview=predictions))
    for line in plan.notes:
        console.out(line)
    if predictions:
        from analysis.predict.predictor import PREDICTOR

        console.out(
            f"predicted by the {PREDICTOR}, with 90% intervals (wide where 'uncalibrated': no record of that GPU "
            "type yet):"
        )
        console.table_out(console.plan_table(plan))
        # What a family's predictions leave out, once for the plan (a family module's PLAN_CAVEAT, where it has one).
        # A skipped cell counts: "predicted not to fit" is exactly where a caveat on memory matters.
        families = dict.fromkeys(c.typed.model.family for c in (*plan.cells, *plan.skipped) if c.typed is not None)
        for caveat in filter(None, (getattr(family_module(f), "PLAN_CAVEAT", None) for f in families)):
            console.out(caveat)
        if (offered := prediction.layout_offers(plan)) is not None:
            c.print(offered)


def _new_cells(plan: Plan) -> tuple[int, str]:
    """How many of the plan's cells a sweep would submit, and a clause on those it would not (already in it)."""
    paths = SweepPaths(plan.sweep_dir)
    known = [c for c in plan.cells if in_sweep_already(paths, c.cell_id)]
    clause = f" ({len(known)} already in {paths.root}: not submitted again)" if known else ""
    return len(plan.cells) - len(known), clause


def preview(plan: Plan, ask_scheduler: bool) -> Exit:
    """``gpudays plan`` (arithmetic, no scheduler asked) and ``sweep --dry-run`` (and the scheduler's check).

    A plan is OK when it was shown, even if no cell would run or a sweep of it would be refused (each said on
    stderr): plan asks no scheduler and submits nothing, so what a sweep would refuse is a warning. The dry run
    checks as a sweep does and refuses the same.
    """
    show_plan(plan, predictions=True)
    configs = {c.cell_id: c.typed for c in plan.cells}
    new, clause = _new_cells(plan)
    if ask_scheduler:
        if not plan.cells:
            raise CommandError("no cell of this sweep can run (reasons above); nothing was submitted")
        check(configs)
        if script := launch.first_job_script(configs, SweepPaths(plan.sweep_dir).submitit_folder()):
            console.out(script)
        console.out(f"dry run: {new} cell(s) would be submitted{clause}; nothing was")
        return Exit.OK
    try:
        launch.check_gpu_types(configs)
    except launch.SubmissionRefused as e:
        console.note(f"warning: `gpudays sweep` of this plan would be refused: {e}")
    for line in launch.untyped_gpu_notes(configs):
        console.note(f"warning: {line}")
    console.out(f"plan: {new} cell(s) would be submitted{clause}; nothing was, and no scheduler was asked")
    if not plan.cells:
        console.note("no cell of this plan would run (reasons above); `--run-unfit` runs unfit cells anyway")
    return Exit.OK
