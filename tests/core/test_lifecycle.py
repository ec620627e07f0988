"""Run and step state machines (orchestrator_core.lifecycle)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from orchestrator_core.errors import Conflict
from orchestrator_core.lifecycle import (
    RUN_MOVE,
    RUN_TRANSITIONS,
    STEP_END,
    STEP_TRANSITIONS,
    RunStatus,
    StepStatus,
    check_run_accepts_steps,
    check_run_transition,
    check_step_transition,
    run_move,
    step_end,
    step_move,
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


@pytest.mark.parametrize(("current", "target"), STEP_PAIRS, ids=_ids(STEP_PAIRS))
def test_a_step_move_says_what_it_implies(current: StepStatus, target: StepStatus) -> None:
    if (current, target) not in STEP_ALLOWED:
        with pytest.raises(Conflict):
            step_move(current, target)
        return
    move = step_move(current, target)
    assert move.source is current
    assert move.stamps_started is (target is S.RUNNING)
    assert move.stamps_ended is (target in {S.SUCCEEDED, S.FAILED, S.CANCELLED})
    assert move.releases_lease is (current is S.RUNNING)


@pytest.mark.parametrize("target", list(StepStatus), ids=lambda s: s.value)
def test_every_end_of_a_running_step_is_the_same_move(target: StepStatus) -> None:
    """One statement ends several steps, each with its own terminal status."""
    if target in {S.SUCCEEDED, S.FAILED, S.CANCELLED}:
        assert step_end(target) == STEP_END
        assert STEP_END.source is S.RUNNING
        assert STEP_END.stamps_ended and STEP_END.releases_lease
        assert not STEP_END.stamps_started
        return
    with pytest.raises(Conflict) as info:
        step_end(target)
    assert info.value.details == {"from": "running", "to": target.value}


@pytest.mark.parametrize(("current", "target"), RUN_PAIRS, ids=_ids(RUN_PAIRS))
def test_a_run_move_is_checked(current: RunStatus, target: RunStatus) -> None:
    if (current, target) in RUN_ALLOWED:
        assert run_move(current, target) == RUN_MOVE
        assert RUN_MOVE.stamps_updated
        return
    with pytest.raises(Conflict):
        run_move(current, target)


# Who writes a status: one module, ``orchestratord/steps/transition.py``, for steps and runs.
ROOT = Path(__file__).resolve().parents[2]
WRITER = "orchestratord/steps/transition.py"


def _names(node: ast.AST) -> str:
    return ast.unparse(node).lower()


def _status_writes(path: Path, noun: str) -> list[int]:
    """Lines that write the status of a ``noun`` (``step`` or ``run``): ``<x>.status = ...``
    (or ``setattr(<x>, "status", ...)``) on a name that says ``noun``, or an UPDATE's
    ``.values(status=...)`` / ``.values({"status": ...})`` on a statement that names it
    (``Step``, ``_STEPS``, ``sa.update(Run)``...)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "status"
                    and noun in _names(target.value)
                ):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "values" and noun in _names(node.func.value):
                keys: list[object] = [k.arg for k in node.keywords]
                keys += [
                    k.value
                    for arg in node.args
                    if isinstance(arg, ast.Dict)
                    for k in arg.keys
                    if isinstance(k, ast.Constant)
                ]
                if "status" in keys:
                    lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "status"
            and noun in _names(node.args[0])
        ):
            lines.append(node.lineno)
    return lines


def _writers(noun: str) -> dict[str, list[int]]:
    return {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "orchestratord").rglob("*.py"))
        if (found := _status_writes(path, noun))
    }


@pytest.mark.parametrize("noun", ["step", "run"])
def test_only_the_writer_writes_a_status(noun: str) -> None:
    """A step's status and a run's are written by ``transition.py`` alone (its writers apply
    the lifecycle's move); a statement elsewhere takes its values from there."""
    writers = _writers(noun)
    assert list(writers) == [WRITER], writers
    assert len(writers[WRITER]) == 1, writers  # ``transition`` / ``transition_run``


@pytest.mark.parametrize(
    ("code", "noun"),
    [
        ("step.status = 'failed'", "step"),
        ("run.status = 'failed'", "run"),
        ("x = _STEPS.update().values(status='failed')", "step"),
        ("x = sa.update(Run).values({'status': 'failed'})", "run"),
        ("setattr(the_run, 'status', 'failed')", "run"),
    ],
)
def test_the_walk_finds_a_status_written_by_hand(code: str, noun: str, tmp_path: Path) -> None:
    path = tmp_path / "writer.py"
    path.write_text(code + "\n")
    assert _status_writes(path, noun) == [1]
