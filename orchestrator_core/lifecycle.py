"""Run and step lifecycles as explicit state machines.

A transition outside the table is refused with :class:`Conflict`, never just logged. What a
step's move implies for its row beside its status (a start's or an end's time, its lease
released) is said here too (``step_move``), and what a run's status write carries
(``RUN_MOVE``): their one writer in the server (``orchestratord/steps/transition.py``)
applies it, whichever statement the move is made in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator_core.errors import Conflict


class StepStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _STEP_TERMINAL


class RunStatus(StrEnum):
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.CANCELLED, RunStatus.SUCCEEDED, RunStatus.FAILED)


_STEP_TERMINAL = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED})

STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.QUEUED: frozenset({StepStatus.RUNNING, StepStatus.CANCELLED, StepStatus.FAILED}),
    # running -> queued: the process running it was lost before it streamed anything
    StepStatus.RUNNING: frozenset(
        {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED, StepStatus.QUEUED}
    ),
    StepStatus.SUCCEEDED: frozenset(),
    StepStatus.FAILED: frozenset(),
    StepStatus.CANCELLED: frozenset(),
}

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset(
        {RunStatus.CANCELLING, RunStatus.CANCELLED, RunStatus.SUCCEEDED, RunStatus.FAILED}
    ),
    RunStatus.CANCELLING: frozenset({RunStatus.CANCELLED}),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
}


class RunEnded(Conflict):
    """The run has ended (or is ending): it takes no more steps or facts."""

    code = "RUN_ENDED"


def check_step_transition(current: StepStatus, target: StepStatus) -> None:
    if target not in STEP_TRANSITIONS[current]:
        raise Conflict(
            f"step cannot go from {current.value} to {target.value}",
            details={"from": current.value, "to": target.value},
        )


def check_run_transition(current: RunStatus, target: RunStatus) -> None:
    if target not in RUN_TRANSITIONS[current]:
        raise Conflict(
            f"run cannot go from {current.value} to {target.value}",
            details={"from": current.value, "to": target.value},
        )


def check_run_accepts_steps(status: RunStatus, what: str = "steps") -> None:
    if status is not RunStatus.RUNNING:
        raise RunEnded(
            f"run is {status.value} and accepts no new {what}", details={"status": status.value}
        )


@dataclass(frozen=True, slots=True)
class StepMove:
    """What a step's move from ``source`` implies for its row, beside its new status."""

    source: StepStatus
    stamps_started: bool  # ``started_at`` is the move's time
    stamps_ended: bool  # ``ended_at`` is the move's time
    releases_lease: bool  # a lease holds only a running step


def step_move(current: StepStatus, target: StepStatus) -> StepMove:
    """The move from ``current`` to ``target``, or ``Conflict`` where the table has none."""
    check_step_transition(current, target)
    return StepMove(
        source=current,
        stamps_started=target is StepStatus.RUNNING,
        stamps_ended=target.terminal,
        releases_lease=current is StepStatus.RUNNING,
    )


def step_end(target: StepStatus) -> StepMove:
    """A running step's end as ``target``: the same move (``STEP_END``) whatever the terminal
    status, so one statement may end several steps, each as its own."""
    if not target.terminal:
        raise Conflict(
            f"a running step ends succeeded, failed or cancelled, not {target.value}",
            details={"from": StepStatus.RUNNING.value, "to": target.value},
        )
    return step_move(StepStatus.RUNNING, target)


STEP_END = step_end(StepStatus.SUCCEEDED)


@dataclass(frozen=True, slots=True)
class RunMove:
    """What a run's status write carries beside its status."""

    stamps_updated: bool  # ``updated_at`` is the move's time


RUN_MOVE = RunMove(stamps_updated=True)


def run_move(current: RunStatus, target: RunStatus) -> RunMove:
    """The move from ``current`` to ``target``, or ``Conflict`` where the table has none."""
    check_run_transition(current, target)
    return RUN_MOVE
