"""Run and step state machines (orchestrator_core.lifecycle)."""

from __future__ import annotations

import itertools

import pytest

from orchestrator_core.errors import Conflict
from orchestrator_core.lifecycle import (
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    RunStatus,
    StepStatus,
    check_run_accepts_steps,
    check_run_transition,
    check_step_transition,
)

S = StepStatus
R = RunStatus

# Written out independently of the module's tables, so a change to them is caught here.
STEP_ALLOWED = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.FAILED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.QUEUED),  # its process was lost before it streamed anything
}
RUN_ALLOWED = {
    (R.RUNNING, R.CANCELLING),
    (R.RUNNING, R.CANCELLED),
    (R.RUNNING, R.SUCCEEDED),
    (R.RUNNING, R.FAILED),
    (R.CANCELLING, R.CANCELLED),
}

STEP_PAIRS = list(itertools.product(StepStatus, StepStatus))
RUN_PAIRS = list(itertools.product(RunStatus, RunStatus))


def _ids(
    pairs: list[tuple[StepStatus, StepStatus]] | list[tuple[RunStatus, RunStatus]],
) -> list[str]:
    return [f"{a.value}->{b.value}" for a, b in pairs]


def test_status_values() -> None:
    assert [s.value for s in StepStatus] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert [s.value for s in RunStatus] == [
        "running",
        "cancelling",
        "cancelled",
        "succeeded",
        "failed",
    ]
    assert StepStatus("running") is StepStatus.RUNNING
    assert RunStatus("cancelling") is RunStatus.CANCELLING


@pytest.mark.parametrize(("current", "target"), STEP_PAIRS, ids=_ids(STEP_PAIRS))
def test_step_transition(current: StepStatus, target: StepStatus) -> None:
    if (current, target) in STEP_ALLOWED:
        check_step_transition(current, target)
        return
    with pytest.raises(Conflict) as info:
        check_step_transition(current, target)
    exc = info.value
    assert exc.code == "CONFLICT"
    assert exc.retriable is False
    assert exc.details == {"from": current.value, "to": target.value}
    assert current.value in exc.message
    assert target.value in exc.message


@pytest.mark.parametrize(("current", "target"), RUN_PAIRS, ids=_ids(RUN_PAIRS))
def test_run_transition(current: RunStatus, target: RunStatus) -> None:
    if (current, target) in RUN_ALLOWED:
        check_run_transition(current, target)
        return
    with pytest.raises(Conflict) as info:
        check_run_transition(current, target)
    exc = info.value
    assert exc.code == "CONFLICT"
    assert exc.details == {"from": current.value, "to": target.value}


def test_transition_tables_cover_every_status() -> None:
    assert set(STEP_TRANSITIONS) == set(StepStatus)
    assert set(RUN_TRANSITIONS) == set(RunStatus)
    table_step = {(a, b) for a, targets in STEP_TRANSITIONS.items() for b in targets}
    table_run = {(a, b) for a, targets in RUN_TRANSITIONS.items() for b in targets}
    assert table_step == STEP_ALLOWED
    assert table_run == RUN_ALLOWED


@pytest.mark.parametrize("status", list(StepStatus), ids=lambda s: s.value)
def test_step_self_transition_refused(status: StepStatus) -> None:
    with pytest.raises(Conflict):
        check_step_transition(status, status)


@pytest.mark.parametrize("status", list(RunStatus), ids=lambda s: s.value)
def test_run_self_transition_refused(status: RunStatus) -> None:
    with pytest.raises(Conflict):
        check_run_transition(status, status)


@pytest.mark.parametrize(
    ("status", "terminal"),
    [
        (S.QUEUED, False),
        (S.RUNNING, False),
        (S.SUCCEEDED, True),
        (S.FAILED, True),
        (S.CANCELLED, True),
    ],
)
def test_step_terminal_flag(status: StepStatus, terminal: bool) -> None:
    assert status.terminal is terminal


@pytest.mark.parametrize(
    ("status", "terminal"),
    [
        (R.RUNNING, False),
        (R.CANCELLING, False),
        (R.CANCELLED, True),
        (R.SUCCEEDED, True),
        (R.FAILED, True),
    ],
)
def test_run_terminal_flag(status: RunStatus, terminal: bool) -> None:
    assert status.terminal is terminal


@pytest.mark.parametrize("status", list(StepStatus), ids=lambda s: s.value)
def test_step_terminal_iff_no_way_out(status: StepStatus) -> None:
    assert status.terminal == (not STEP_TRANSITIONS[status])
    if status.terminal:
        for target in StepStatus:
            with pytest.raises(Conflict):
                check_step_transition(status, target)


@pytest.mark.parametrize("status", list(RunStatus), ids=lambda s: s.value)
def test_run_terminal_iff_no_way_out(status: RunStatus) -> None:
    assert status.terminal == (not RUN_TRANSITIONS[status])


def test_every_step_status_reachable_from_queued() -> None:
    reached = {S.QUEUED}
    frontier = [S.QUEUED]
    while frontier:
        current = frontier.pop()
        for target in StepStatus:
            try:
                check_step_transition(current, target)
            except Conflict:
                continue
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(StepStatus)


def test_run_accepts_steps_only_while_running() -> None:
    check_run_accepts_steps(R.RUNNING)


@pytest.mark.parametrize(
    "status", [R.CANCELLING, R.CANCELLED, R.SUCCEEDED, R.FAILED], ids=lambda s: s.value
)
def test_run_refuses_steps_unless_running(status: RunStatus) -> None:
    with pytest.raises(Conflict) as info:
        check_run_accepts_steps(status)
    assert info.value.code == "RUN_ENDED"
    assert info.value.details == {"status": status.value}
    assert status.value in info.value.message
