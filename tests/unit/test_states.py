"""The one state vocabulary: what each state means for resume, and SLURM's states mapped onto it."""

from __future__ import annotations

import pytest

from orchestrator.cli.display.console import SHOW_ORDER, STATE_STYLE
from orchestrator.store import states
from orchestrator.store.states import RecordStatus, State
from orchestrator.submission import scheduler_states
from orchestrator.submission.scheduler_states import HeldAction


@pytest.mark.parametrize(
    ("raw", "reason", "expected"),
    [
        ("PENDING", "Priority", State.PENDING),
        ("PENDING", "JobArrayTaskLimit", State.PENDING),
        ("PENDING", "BeginTime", State.PENDING),
        ("PENDING", "JobHeldUser", State.HELD),
        ("PENDING", "JobHeldAdmin", State.HELD),
        ("PENDING", "launch failed requeued held", State.HELD),
        ("REQUEUE_HOLD", None, State.HELD),
        ("REQUEUED", None, State.PENDING),
        ("RUNNING", None, State.RUNNING),
        ("COMPLETING+", None, State.RUNNING),
        ("CANCELLED by 1000", None, State.CANCELLED),
        ("OUT_OF_MEMORY", None, State.HOST_OOM),
        ("NODE_FAIL", None, State.NODE_FAIL),
        ("BOOT_FAIL", None, State.NODE_FAIL),
        ("PREEMPTED", None, State.PREEMPTED),
        ("TIMEOUT", None, State.TIMEOUT),
        ("DEADLINE", None, State.TIMEOUT),
        ("COMPLETED", None, State.FAILED),
        ("NEVER_SEEN", None, State.FAILED),
    ],
)
def test_slurm_states_map_onto_cell_states(raw: str, reason: str | None, expected: State) -> None:
    assert scheduler_states.from_slurm(raw, reason) is expected


def test_holds_say_what_resume_does() -> None:
    assert scheduler_states.held_action("JobHeldUser") is HeldAction.RELEASE
    assert scheduler_states.held_action("JobHeldAdmin") is HeldAction.ADMIN
    assert scheduler_states.held_action("launch failed requeued held") is HeldAction.RESUBMIT
    assert scheduler_states.held_action("Resources") is None and scheduler_states.held_action(None) is None


def test_oom_is_an_answer_and_host_oom_a_rerun() -> None:
    assert states.is_answer(State.OOM) and not states.needs_rerun(State.OOM)
    assert states.needs_rerun(State.HOST_OOM)
    assert State.OOM in states.MEASURED_DOES_NOT_FIT


def test_resume_selection() -> None:
    assert states.rerun_selectable(State.TIMEOUT, None)
    assert states.rerun_selectable(State.LOST, None) and states.rerun_selectable(State.CANCELLED, None)
    assert not states.rerun_selectable(State.OK, None) and not states.rerun_selectable(State.OOM, None)
    assert states.rerun_selectable(State.OOM, [State.OOM]), "an answer can be asked for by name"
    assert not states.rerun_selectable(State.TIMEOUT, [State.FAILED])
    for never in (State.PENDING, State.RUNNING, State.INVALID, State.UNKNOWN):
        assert not states.rerun_selectable(never, [never]), never


def test_record_statuses_map_onto_states() -> None:
    assert states.state_of_record(RecordStatus.COMM_ERROR) is State.FAILED
    assert states.state_of_record(RecordStatus.COMPILE_ERROR) is State.FAILED
    assert states.state_of_record(RecordStatus.TIMEOUT) is State.TIMEOUT
    assert states.state_of_record(RecordStatus.INVALID) is State.INVALID
    assert {states.state_of_record(s) for s in RecordStatus} <= set(State)


def test_a_state_and_its_name_are_one_key_and_bad_names_list_the_good_ones() -> None:
    assert State.OK == "ok" and "ok" in {State.OK} and State.OK in {"ok"} and f"{State.OK}" == "ok"
    assert states.parse_state(" timeout ") is State.TIMEOUT
    with pytest.raises(ValueError, match="unknown state 'done'; use one of new, pending, held"):
        states.parse_state("done")


def test_every_state_has_a_style_a_place_in_the_status_table_and_a_kind() -> None:
    assert set(STATE_STYLE) == set(State)
    assert sorted(SHOW_ORDER) == sorted(State), "every state once"
    assert states.ACTIVE.isdisjoint(states.ANSWERS) and states.UNFIXABLE.isdisjoint(states.ANSWERS)
    assert not states.all_done([State.PENDING]) and states.all_done([State.HELD, State.OK, State.LOST])
