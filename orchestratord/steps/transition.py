"""The one writer of a step's status and of a run's, and the ways a step ends outside its
runner.

``step_values`` is the only code that writes ``Step.status``: the lifecycle table decides
whether the move is legal (an illegal one raises ``Conflict``) and what it implies
(``started_at`` / ``ended_at`` stamped, the lease released), and ``step_values`` gives the
row's values for it. ``transition`` applies them to a loaded row; a running step's end (its
runner's finalizer) makes the same move in one ``UPDATE``, whose values come from here too
(``steps/ends.py``). ``run_values`` and ``transition_run`` are the same for a run's status.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import EndEvent, ErrorEvent, RunEndEvent, StartedEvent
from orchestrator_core import clock
from orchestrator_core.event_order import EventOrder, EventType
from orchestrator_core.lifecycle import (
    RUN_MOVE,
    RunMove,
    RunStatus,
    StepMove,
    StepStatus,
    run_move,
    step_move,
)
from orchestrator_core.pricing import Price
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import Prepared
from orchestratord.eventlog import LogEvent, log_event, read_all_step_events
from orchestratord.runs.ledger import RunState, settle
from orchestratord.steps.ending import StepEnd
from orchestratord.steps.queries import get_step
from orchestratord.tx import Tx


def step_values(move: StepMove, status: Any, now: Any) -> dict[str, Any]:
    """The values of a step's row as it makes ``move``: its ``status`` (a value, or an
    expression of a statement ending several steps, each as its own) and what the lifecycle
    says the move implies, stamped ``now``."""
    values: dict[str, Any] = {"status": status}
    if move.stamps_started:
        values["started_at"] = now
    if move.stamps_ended:
        values["ended_at"] = now
    if move.releases_lease:
        values["lease_owner"] = None
        values["lease_expires_at"] = None
    return values


def transition(step: Step, to: StepStatus) -> None:
    """Move ``step`` to ``to`` (in the caller's transaction), or raise ``Conflict``."""
    _write(step, step_values(step_move(StepStatus(step.status), to), to.value, clock.now()))


def end_step(step: Step, end: StepEnd) -> None:
    """End ``step`` (a loaded row, in the caller's transaction) as ``end`` says: its status
    through ``transition``, then each other column of ``StepEnd``."""
    transition(step, end.status)
    for field in dataclasses.fields(end):
        if field.name != "status":
            setattr(step, field.name, getattr(end, field.name))


def _outcome(step: Step, outcome: str) -> str | None:
    """A replay step's outcome once it ends outside its runner: ``outcome``, unless it has
    one already; none for a step that replays nothing."""
    if step.replay_of is not None and step.replay_outcome is None:
        return outcome
    return step.replay_outcome


def run_values(move: RunMove, status: Any, now: Any) -> dict[str, Any]:
    """The values of a run's row as its status is written in ``move``: its ``status`` (a
    value, or a parameter of a statement) and what the move carries, stamped ``now``."""
    values: dict[str, Any] = {"status": status}
    if move.stamps_updated:
        values["updated_at"] = now
    return values


def transition_run(run: Run, to: RunStatus) -> None:
    """Move ``run`` to ``to`` (in the caller's transaction), or raise ``Conflict``."""
    _write(run, run_values(run_move(RunStatus(run.status), to), to.value, clock.now()))


def _write(step_or_run: Step | Run, values: dict[str, Any]) -> None:
    """Set a loaded row's columns to a status move's ``values`` (``step_values`` or
    ``run_values``): the one place a step's status, and a run's, is written."""
    step_or_run.status = values.pop("status")
    for column, value in values.items():
        setattr(step_or_run, column, value)


_STEPS = cast(sa.Table, Step.__table__)
_RUNS = cast(sa.Table, Run.__table__)


async def end_unstarted(
    tx: Tx, *, step: Step, status: StepStatus, error: dict[str, Any] | None = None
) -> None:
    """End a step that never started: ``started`` then ``end{cancelled}`` or ``error``.

    Its reservation goes back to the run.
    """
    outcome = "cancelled" if status is StepStatus.CANCELLED else "failed"
    output: dict[str, Any] = {
        "text": "",
        "token_ids": [],
        "stop_reason": "cancelled" if error is None else None,
    }
    end_step(step, StepEnd(status, output, error=error, replay_outcome=_outcome(step, outcome)))
    order = EventOrder()
    started = log_event(
        step.run_id,
        step.step_id,
        order.accept(EventType.STARTED),
        StartedEvent(pool_id=step.pool_id, replica_id=None, engine=None),
    )
    last = log_event(
        step.run_id,
        step.step_id,
        order.accept(EventType.END if error is None else EventType.ERROR),
        EndEvent(stop_reason="cancelled", tokens_in=0, tokens_out=0, provenance=None)
        if error is None
        else ErrorEvent(**{**error, "correlation_id": None}),
    )
    await tx.append_events([started, last])
    run = await settle(tx.session, step=step, tokens_in=0, tokens_out=0, cost_usd=0.0)
    await tx.append_events(await settle_run_after_step(tx.session, run_id=step.run_id, state=run))


async def cancel_step(tx: Tx, *, step_id: str) -> tuple[str, bool]:
    """Returns (status to report, whether a running execution must be told)."""
    step = await get_step(tx.session, step_id=step_id, lock=True)
    status = StepStatus(step.status)
    if status.terminal:
        return step.status, False
    if status is StepStatus.QUEUED:
        await end_unstarted(tx, step=step, status=StepStatus.CANCELLED)
        return step.status, False
    step.cancel_requested = True
    return "cancelling", True


async def live_steps(tx: Tx | AsyncSession, run_id: str) -> int:
    return int((await _LIVE_STEPS.rows(tx, {"b_run_id": run_id}))[0][0])


_LIVE_STEPS = Prepared(
    sa.select(sa.func.count())
    .select_from(_STEPS)
    .where(
        _STEPS.c.run_id == sa.bindparam("b_run_id"),
        sa.or_(
            _STEPS.c.status == StepStatus.QUEUED.value,
            _STEPS.c.status == StepStatus.RUNNING.value,
        ),
    )
)


async def settle_run_after_step(
    tx: Tx | AsyncSession, *, run_id: str, state: RunState
) -> list[LogEvent]:
    """After a step's end: a cancelling run becomes cancelled, and a run that was completed
    or cancelled ends (``run_end``, returned to be appended) once no step of it is live.
    ``state``: the run's as the step's settlement left it (its row locked until commit)."""
    status = RunStatus(state.status)
    if status is RunStatus.RUNNING or state.ended_at is not None:
        return []
    if await live_steps(tx, run_id) > 0:
        return []
    session = tx if isinstance(tx, AsyncSession) else tx.joined
    if session is not None:  # the run may be loaded in it: changed there
        run = await session.get(Run, run_id)
        assert run is not None
        if status is RunStatus.CANCELLING:
            transition_run(run, RunStatus.CANCELLED)
        return [end_run(run)]
    if status is RunStatus.CANCELLING:
        run_move(status, RunStatus.CANCELLED)
        status = RunStatus.CANCELLED
    params = {"b_run_id": run_id, "b_status": status.value, "b_now": clock.now()}
    await _END_RUN.rows(tx, params)
    return [_run_end(run_id, status.value)]


# a run whose work is over ends (``end_run``), its status written as it ends (cancelling
# becomes cancelled; a completed run's stays)
_RUN_NOW = sa.bindparam("b_now", type_=_RUNS.c.updated_at.type)
_END_RUN = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(run_values(RUN_MOVE, sa.bindparam("b_status"), _RUN_NOW))
    .values(ended_at=_RUN_NOW)
)


def end_run(run: Run) -> LogEvent:
    """Mark a run whose work is over as ended; its ``run_end`` event, to append."""
    run.ended_at = run.updated_at = clock.now()
    return _run_end(run.run_id, run.status)


def _run_end(run_id: str, status: str) -> LogEvent:
    return log_event(run_id, None, None, RunEndEvent(run_id=run_id, status=status))


async def end_interrupted(
    tx: Tx,
    *,
    step: Step,
    message: str,
    code: str = "INTERNAL",
    price: Price | None = None,
    logged: list[LogEvent] | None = None,
) -> None:
    """End a running step whose execution is gone: an ``error`` event after what its log
    holds (``started`` first if it has nothing).

    What it committed stays its output (the text and ids of its committed tokens), and it is
    charged what it used: its prompt once the engine had it (its ``started``), its committed
    tokens, at ``price`` when known (an unpriced model's cost is recorded as unknown)."""
    session = tx.session
    if logged is None:  # the step's events, unless the caller has read them
        logged = await read_all_step_events(session, step.step_id)
    tokens = [orjson.loads(ev.data) for ev in logged if ev.type == EventType.TOKEN.value]
    events = []
    if not logged:
        events.append(
            log_event(
                step.run_id,
                step.step_id,
                0,
                StartedEvent(pool_id=step.pool_id, replica_id=step.replica_id, engine=None),
            )
        )
    seq = (logged[-1].seq or 0) + 1 if logged else 1
    tokens_in = step.tokens_in_reserved if logged else 0
    tokens_out = len(tokens)
    cost = price.charge(tokens_in, tokens_out, 0.0) if price is not None else 0.0
    body = {
        "code": code,
        "message": message,
        "retriable": True,
        "retry_after_ms": None,
        "details": {"tokens_out": tokens_out},
        "correlation_id": None,
    }
    events.append(log_event(step.run_id, step.step_id, seq, ErrorEvent(**body)))
    await tx.append_events(events)
    output = step.output
    if step.pool_id is not None:  # an engine step: what it generated before it was lost
        output = {
            "text": "".join(t["t"] for t in tokens),
            "token_ids": [t["token_id"] for t in tokens],
            "stop_reason": None,
        }
    end = StepEnd(
        StepStatus.FAILED,
        output,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost_usd=cost,
        provenance=step.provenance,
        error=body,
        replay_outcome=_outcome(step, "failed"),
    )
    end_step(step, end)
    run = await settle(
        session, step=step, tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost
    )
    await tx.append_events(await settle_run_after_step(session, run_id=step.run_id, state=run))
