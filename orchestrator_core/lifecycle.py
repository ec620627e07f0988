"""Run and step lifecycles as explicit state machines.

A transition outside the table is refused with :class:`Conflict`, never just logged.
"""

from __future__ import annotations

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
