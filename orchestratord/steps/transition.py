"""The one writer of a step's status, and the ways a step ends outside its runner.

``transition`` is the only code that assigns ``Step.status`` on a loaded row: it checks the
lifecycle table (an illegal move raises ``Conflict``) and stamps ``started_at`` /
``ended_at``. A running step's end (its runner's finalizer) is the same move made in one
``UPDATE``, here too.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import EndEvent, ErrorEvent, RunEndEvent, StartedEvent
from orchestrator_core import clock
from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.event_order import EventOrder, EventType
from orchestrator_core.lifecycle import (
    RunStatus,
    StepStatus,
    check_run_transition,
    check_step_transition,
)
from orchestrator_core.pricing import Price
from orchestratord.db.json_codec import dumps
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import Prepared, Target, dialect_of
from orchestratord.eventlog import Finalizer, LogEvent, log_event, read_all_step_events
from orchestratord.runs.ledger import RunState, Used, settle, settled, used_params
from orchestratord.steps.ending import Ending
from orchestratord.steps.queries import get_step
from orchestratord.tx import Tx


def transition(step: Step, to: StepStatus) -> None:
    """Move ``step`` to ``to`` (in the caller's transaction), or raise ``Conflict``."""
    current = StepStatus(step.status)
    check_step_transition(current, to)
    step.status = to.value
    now = clock.now()
    if to is StepStatus.RUNNING:
        step.started_at = now
    elif to.terminal:
        step.ended_at = now
    if current is StepStatus.RUNNING:  # a lease holds only a running step
        step.lease_owner = None
        step.lease_expires_at = None


def ending_finalizer(step_id: str, run_id: str, ending: Ending) -> Finalizer:
    """What commits with a step's terminal event: its status, output, usage, facts, and the
    settlement of its reservation. Prepared statements alone, unless it adds rows; then the
    ends of one commit of the event log are made together (``end_together``)."""

    async def finalize(target: Target) -> list[LogEvent]:
        return await _end_one(target, step_id, ending)

    if ending.rows:
        return Finalizer(finalize, needs_session=True)
    return Finalizer(finalize, together=end_together, item=_Ends(step_id, run_id, ending))


class _Ends(NamedTuple):
    step_id: str
    run_id: str
    ending: Ending


async def _end_one(target: Target, step_id: str, ending: Ending) -> list[LogEvent]:
    if dialect_of(target).name == "postgresql":  # one round trip
        held, run = await _end_and_settle(target, step_id, ending)
    else:
        held = await _end_running(target, step_id, ending)
        run = await settle(
            target,
            step=held,
            tokens_in=ending.tokens_in,
            tokens_out=ending.tokens_out,
            cost_usd=ending.cost_usd,
        )
    if ending.rows:
        assert isinstance(target, AsyncSession)  # needs_session
        target.add_all(ending.rows)
    return await settle_run_after_step(target, run_id=held.run_id, state=run)


async def end_together(target: Target, items: list[Any]) -> list[LogEvent]:
    """Steps that end in one commit of the event log (none adding rows). On PostgreSQL one
    statement ends each set of them in distinct runs and settles their runs: a run settles
    once per statement, for one step, as the end of one step settles it (the same sums in
    the same order). Elsewhere, and for one step, each ends as alone."""
    ends = cast(list[_Ends], items)
    if len(ends) == 1 or dialect_of(target).name != "postgresql":
        out: list[LogEvent] = []
        for end in ends:
            out.extend(await _end_one(target, end.step_id, end.ending))
        return out
    events: list[LogEvent] = []
    for part in _in_distinct_runs(ends):
        events.extend(await _end_many(target, part))
    return events


def _json(value: Any) -> str | None:
    """A JSON column's value as the text the single-step statement stores (SQL NULL for None)."""
    return None if value is None else dumps(value)


def _in_distinct_runs(ends: list[_Ends]) -> list[list[_Ends]]:
    """``ends`` in parts, no run twice in a part, in their order within each."""
    parts: list[list[_Ends]] = []
    runs: list[set[str]] = []
    for end in ends:
        i = next((i for i, seen in enumerate(runs) if end.run_id not in seen), len(parts))
        if i == len(parts):
            parts.append([])
            runs.append(set())
        parts[i].append(end)
        runs[i].add(end.run_id)
    return parts


async def _end_many(target: Target, ends: list[_Ends]) -> list[LogEvent]:
    columns: dict[str, list[Any]] = {key: [] for key in _MANY_KEYS}
    for end in ends:
        e = end.ending
        check_step_transition(StepStatus.RUNNING, e.status)
        values = (
            end.step_id,
            e.status.value,
            _json(e.output),
            e.tokens_in,
            e.tokens_out,
            e.cost_usd,
            _json(e.provenance),
            _json(e.error),
            e.replay_outcome,
        )
        for key, value in zip(_MANY_KEYS, values, strict=True):
            columns[key].append(value)
    params: dict[str, Any] = {**columns, "b_now": clock.now()}
    rows = {row[0]: row for row in await _END_AND_SETTLE_MANY.rows(target, params)}
    events: list[LogEvent] = []
    for end in ends:
        row = rows.get(end.step_id)
        if row is None:
            await _not_running(target, end.step_id)
        state = RunState(*row[1:3])
        events.extend(await settle_run_after_step(target, run_id=end.run_id, state=state))
    return events


_STEPS = cast(sa.Table, Step.__table__)
_RUNS = cast(sa.Table, Run.__table__)
# A running step ends: the transition as ``transition`` makes it, in one statement that also
# returns what its settlement needs (no load of the row). ``status = 'running'`` guards it.
_ENDS_RUNNING = (
    _STEPS.update()
    .where(_STEPS.c.step_id == sa.bindparam("b_step_id"), _STEPS.c.status == "running")
    .values(
        status=sa.bindparam("b_status"),
        ended_at=sa.bindparam("b_now"),
        lease_owner=None,
        lease_expires_at=None,
        output=sa.bindparam("b_output"),
        tokens_in=sa.bindparam("b_tokens_in"),
        tokens_out=sa.bindparam("b_tokens_out"),
        cost_usd=sa.bindparam("b_cost_usd"),
        provenance=sa.bindparam("b_provenance"),
        error=sa.bindparam("b_error"),
        replay_outcome=sa.bindparam("b_replay_outcome"),
    )
    .returning(
        _STEPS.c.run_id,
        _STEPS.c.tokens_in_reserved,
        _STEPS.c.tokens_out_reserved,
        _STEPS.c.cost_reserved_usd,
    )
)
_END_RUNNING = Prepared(_ENDS_RUNNING)
# PostgreSQL: the end and the settlement of its run in one statement (SQLite runs no UPDATE
# in a WITH); its row: the run's status and end as it left them, then what the step held
_ENDED = _ENDS_RUNNING.cte("ended")
_END_AND_SETTLE = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == _ENDED.c.run_id)
    .values(
        settled(
            _ENDED.c.tokens_in_reserved, _ENDED.c.tokens_out_reserved, _ENDED.c.cost_reserved_usd
        )
    )
    .returning(_RUNS.c.status, _RUNS.c.ended_at, *_ENDED.c)
)


# PostgreSQL: the ends of several running steps, each of its own run (``end_together``):
# each row of ``unnest`` is one step's ``_ENDS_RUNNING`` parameters, and its run settles as
# ``_END_AND_SETTLE`` settles it; a row per step that ended: its id, its run's status and end
_MANY_KEYS = (
    "m_step_id",
    "m_status",
    "m_output",
    "m_tokens_in",
    "m_tokens_out",
    "m_cost_usd",
    "m_provenance",
    "m_error",
    "m_replay_outcome",
)
_MANY_TYPES = (
    sa.String,
    sa.String,
    sa.Text,
    sa.BigInteger,
    sa.BigInteger,
    sa.Float,
    sa.Text,
    sa.Text,
    sa.String,
)
_NOW = sa.bindparam("b_now", type_=_STEPS.c.ended_at.type)
_EACH = (
    sa.func.unnest(
        *(
            sa.bindparam(key, type_=postgresql.ARRAY(t))
            for key, t in zip(_MANY_KEYS, _MANY_TYPES, strict=True)
        )
    )
    .table_valued(*(key[2:] for key in _MANY_KEYS))
    .render_derived(name="each")
)
_ENDED_MANY = (
    _STEPS.update()
    .where(_STEPS.c.step_id == _EACH.c.step_id, _STEPS.c.status == "running")
    .values(
        status=_EACH.c.status,
        ended_at=_NOW,
        lease_owner=None,
        lease_expires_at=None,
        output=sa.cast(_EACH.c.output, sa.JSON),
        tokens_in=_EACH.c.tokens_in,
        tokens_out=_EACH.c.tokens_out,
        cost_usd=_EACH.c.cost_usd,
        provenance=sa.cast(_EACH.c.provenance, sa.JSON),
        error=sa.cast(_EACH.c.error, sa.JSON),
        replay_outcome=_EACH.c.replay_outcome,
    )
    .returning(
        _STEPS.c.step_id,
        _STEPS.c.run_id,
        _STEPS.c.tokens_in_reserved,
        _STEPS.c.tokens_out_reserved,
        _STEPS.c.cost_reserved_usd,
        _EACH.c.tokens_in.label("used_in"),
        _EACH.c.tokens_out.label("used_out"),
        sa.func.coalesce(_EACH.c.cost_usd, 0.0).label("used_cost"),
        sa.case((_EACH.c.cost_usd.is_(None), 1), else_=0).label("unpriced"),
    )
    .cte("ended")
)
_END_AND_SETTLE_MANY = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == _ENDED_MANY.c.run_id)
    .values(
        settled(
            _ENDED_MANY.c.tokens_in_reserved,
            _ENDED_MANY.c.tokens_out_reserved,
            _ENDED_MANY.c.cost_reserved_usd,
            Used(
                _ENDED_MANY.c.used_in,
                _ENDED_MANY.c.used_out,
                _ENDED_MANY.c.used_cost,
                _ENDED_MANY.c.unpriced,
                _NOW,
            ),
        )
    )
    .returning(_ENDED_MANY.c.step_id, _RUNS.c.status, _RUNS.c.ended_at)
)


class _Held(NamedTuple):
    run_id: str
    tokens_in_reserved: int
    tokens_out_reserved: int
    cost_reserved_usd: float


def _end_params(step_id: str, ending: Ending) -> dict[str, Any]:
    check_step_transition(StepStatus.RUNNING, ending.status)
    return {
        "b_step_id": step_id,
        "b_status": ending.status.value,
        "b_now": clock.now(),
        "b_output": ending.output,
        "b_tokens_in": ending.tokens_in,
        "b_tokens_out": ending.tokens_out,
        "b_cost_usd": ending.cost_usd,
        "b_provenance": ending.provenance,
        "b_error": ending.error,
        "b_replay_outcome": ending.replay_outcome,
    }


async def _end_running(target: Target, step_id: str, ending: Ending) -> _Held:
    row = await _END_RUNNING.first(target, _end_params(step_id, ending))
    if row is None:
        await _not_running(target, step_id)
    return _Held(*row)


async def _end_and_settle(target: Target, step_id: str, ending: Ending) -> tuple[_Held, RunState]:
    params = _end_params(step_id, ending)
    params.update(used_params(ending.tokens_in, ending.tokens_out, ending.cost_usd))
    row = await _END_AND_SETTLE.first(target, params)
    if row is None:
        await _not_running(target, step_id)
    return _Held(*row[2:]), RunState(*row[:2])


async def _not_running(target: Target, step_id: str) -> NoReturn:
    """Raise why a step did not end: it is no longer running (ended elsewhere), or there is
    no such step."""
    found = await _STEP_STATUS.first(target, {"b_step_id": step_id})
    if found is None:
        raise NotFound("step", step_id)
    raise Conflict(f"step {step_id} is {found[0]}, not running: it cannot end here")


_STEP_STATUS = Prepared(
    sa.select(_STEPS.c.status).where(_STEPS.c.step_id == sa.bindparam("b_step_id"))
)


async def end_unstarted(
    tx: Tx, *, step: Step, status: StepStatus, error: dict[str, Any] | None = None
) -> None:
    """End a step that never started: ``started`` then ``end{cancelled}`` or ``error``.

    Its reservation goes back to the run.
    """
    transition(step, status)
    if step.replay_of is not None and step.replay_outcome is None:
        step.replay_outcome = "cancelled" if status is StepStatus.CANCELLED else "failed"
    step.output = {
        "text": "",
        "token_ids": [],
        "stop_reason": "cancelled" if error is None else None,
    }
    step.error = error
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


async def live_steps(target: Target, run_id: str) -> int:
    return int((await _LIVE_STEPS.rows(target, {"b_run_id": run_id}))[0][0])


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


async def settle_run_after_step(target: Target, *, run_id: str, state: RunState) -> list[LogEvent]:
    """After a step's end: a cancelling run becomes cancelled, and a run that was completed
    or cancelled ends (``run_end``, returned to be appended) once no step of it is live.
    ``state``: the run's as the step's settlement left it (its row locked until commit)."""
    status = RunStatus(state.status)
    if status is RunStatus.RUNNING or state.ended_at is not None:
        return []
    if await live_steps(target, run_id) > 0:
        return []
    if status is RunStatus.CANCELLING:
        check_run_transition(status, RunStatus.CANCELLED)
        status = RunStatus.CANCELLED
    if isinstance(target, AsyncSession):  # the run may be loaded in it: changed there
        run = await target.get(Run, run_id)
        assert run is not None
        run.status = status.value
        return [end_run(run)]
    params = {"b_run_id": run_id, "b_status": status.value, "b_now": clock.now()}
    await _END_RUN.rows(target, params)
    return [_run_end(run_id, status.value)]


_END_RUN = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(
        status=sa.bindparam("b_status"),
        ended_at=sa.bindparam("b_now"),
        updated_at=sa.bindparam("b_now"),
    )
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
    transition(step, StepStatus.FAILED)
    if step.replay_of is not None and step.replay_outcome is None:
        step.replay_outcome = "failed"
    step.error = body
    if step.pool_id is not None:  # an engine step: what it generated before it was lost
        step.output = {
            "text": "".join(t["t"] for t in tokens),
            "token_ids": [t["token_id"] for t in tokens],
            "stop_reason": None,
        }
    step.tokens_in = tokens_in
    step.tokens_out = tokens_out
    step.cost_usd = cost
    run = await settle(
        session, step=step, tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost
    )
    await tx.append_events(await settle_run_after_step(session, run_id=step.run_id, state=run))
