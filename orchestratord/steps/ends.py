"""A running step's end: its row, its run's settlement and what the run does next, committed
with its terminal event (the finalizer its runner gives the event log).

Ends that commit together are made together: on PostgreSQL one statement ends steps of
distinct runs (``end_together``), and where each is in a run still taking steps, the event
log's statement appending their terminal events makes them too (``_alongside``): a round
of the writer with steps ending is one round trip, with no transaction around it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from orchestrator_core import clock
from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.lifecycle import STEP_END, RunStatus, StepStatus, step_end
from orchestratord.db.json_codec import dumps
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import Prepared, dialect_of
from orchestratord.eventlog import (
    APPEND_RUNS,
    LOCKED,
    Alongside,
    Finalizer,
    LogEvent,
    PlainArray,
    Writes,
)
from orchestratord.runs.ledger import RunState, Used, settle, settled, used_params
from orchestratord.steps.ending import Ending, StepEnd
from orchestratord.steps.transition import settle_run_after_step, step_values
from orchestratord.tx import Tx


def ending_finalizer(step_id: str, run_id: str, ending: Ending) -> Finalizer:
    """What commits with a step's terminal event: its status, output, usage, facts, and the
    settlement of its reservation. Prepared statements alone, unless it adds rows; then the
    ends of one commit of the event log are made together (``end_together``)."""

    async def finalize(tx: Tx) -> list[LogEvent]:
        return await _end_one(tx, step_id, ending)

    if ending.rows:
        return Finalizer(finalize, needs_session=True)
    return Finalizer(
        finalize, together=end_together, item=_Ends(step_id, run_id, ending), alongside=_alongside
    )


class _Ends(NamedTuple):
    step_id: str
    run_id: str
    ending: Ending


async def _end_one(tx: Tx, step_id: str, ending: Ending) -> list[LogEvent]:
    if dialect_of(tx).name == "postgresql":  # one round trip
        held, run = await _end_and_settle(tx, step_id, ending)
    else:
        held = await _end_running(tx, step_id, ending)
        run = await settle(
            tx,
            step=held,
            tokens_in=ending.tokens_in,
            tokens_out=ending.tokens_out,
            cost_usd=ending.cost_usd,
        )
    if ending.rows:
        tx.session.add_all(ending.rows)  # (``needs_session``: its session's transaction)
    return await settle_run_after_step(tx, run_id=held.run_id, state=run)


async def end_together(tx: Tx, items: list[Any]) -> list[LogEvent]:
    """Steps that end in one commit of the event log (none adding rows). On PostgreSQL one
    statement ends each set of them in distinct runs and settles their runs: a run settles
    once per statement, for one step, as the end of one step settles it (the same sums in
    the same order). Elsewhere, and for one step, each ends as alone."""
    ends = cast(list[_Ends], items)
    if len(ends) == 1 or dialect_of(tx).name != "postgresql":
        out: list[LogEvent] = []
        for end in ends:
            out.extend(await _end_one(tx, end.step_id, end.ending))
        return out
    events: list[LogEvent] = []
    for part in _in_distinct_runs(ends):
        events.extend(await _end_many(tx, part))
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


def _columns(ends: list[_Ends]) -> dict[str, list[Any]]:
    """The ends as the arrays of ``unnest`` (``_MANY_KEYS``), each checked by the lifecycle
    (``step_end``)."""
    columns: dict[str, list[Any]] = {key: [] for key in _MANY_KEYS}
    steps = columns["m_step_id"]
    fields = [(columns[f"m_{name}"], name) for name in _FIELDS]
    for end in ends:
        ending = end.ending
        step_end(ending.status)
        steps.append(end.step_id)
        for column, name in fields:
            column.append(_stored(name, getattr(ending, name)))
    return columns


def _stored(name: str, value: Any) -> Any:
    """A ``StepEnd`` field's value as an array of ``unnest`` holds it (JSON as its text)."""
    if name in _JSON_FIELDS:
        return _json(value)
    return value.value if isinstance(value, StepStatus) else value


async def _end_many(tx: Tx, ends: list[_Ends]) -> list[LogEvent]:
    params: dict[str, Any] = _columns(ends)
    params["b_now"] = clock.now()
    rows = {row[0]: row for row in await _END_AND_SETTLE_MANY.rows(tx, params)}
    events: list[LogEvent] = []
    for end in ends:
        row = rows.get(end.step_id)
        if row is None:
            await _not_running(tx, end.step_id)
        state = RunState(*row[1:3])
        events.extend(await settle_run_after_step(tx, run_id=end.run_id, state=state))
    return events


_STEPS = cast(sa.Table, Step.__table__)
_RUNS = cast(sa.Table, Run.__table__)
# what an end writes, beside the status move's own values: ``StepEnd``'s fields, each a column
_FIELDS = tuple(f.name for f in dataclasses.fields(StepEnd))
_JSON_FIELDS = frozenset(name for name in _FIELDS if isinstance(_STEPS.c[name].type, sa.JSON))


def _end_values(value: Callable[[sa.Column[Any]], Any], now: Any) -> dict[str, Any]:
    """The values of a running step's row as it ends: each ``StepEnd`` field's column from
    ``value`` (given the column), its status through the lifecycle's writer
    (``step_values``: what every end of a running step implies, at ``now``)."""
    values = {name: value(_STEPS.c[name]) for name in _FIELDS}
    values.update(step_values(STEP_END, values.pop("status"), now))
    return values


def _ending(*where: Any) -> sa.Update:
    """The running steps of ``where``, as an UPDATE to give values (``_end_values``)."""
    return _STEPS.update().where(*where, _STEPS.c.status == STEP_END.source.value)


# A running step ends: the transition as ``transition`` makes it, in one statement that also
# returns what its settlement needs (no load of the row). ``status = 'running'`` guards it.
# Its parameters: ``b_step_id``, ``b_now``, and ``b_<field>`` for each field of ``StepEnd``.
_ENDS_RUNNING = (
    _ending(_STEPS.c.step_id == sa.bindparam("b_step_id"))
    .values(
        _end_values(
            lambda column: sa.bindparam(f"b_{column.key}", type_=column.type),
            sa.bindparam("b_now", type_=_STEPS.c.ended_at.type),
        )
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


# PostgreSQL: the ends of several running steps, each of its own run (``end_together``,
# ``_alongside``): each row of ``unnest`` is one step's id and ``StepEnd`` (``_columns``); a
# row per step that ended: its id and run, what it held and what it used
_MANY_KEYS = ("m_step_id", *(f"m_{name}" for name in _FIELDS))


def _array_of(name: str) -> PlainArray:
    """The type of the array of ``unnest`` holding a ``StepEnd`` field (JSON as text)."""
    return PlainArray(sa.Text if name in _JSON_FIELDS else type(_STEPS.c[name].type))


_MANY_PARAMS = [
    sa.bindparam("m_step_id", type_=PlainArray(sa.String)),
    *(sa.bindparam(f"m_{name}", type_=_array_of(name)) for name in _FIELDS),
]


def _ended_many(columns: Sequence[Any], now: Any, *also: Any) -> sa.Update:
    """The steps of ``unnest(columns)`` that are running, ended at ``now`` (where ``also``)."""
    each = sa.func.unnest(*columns).table_valued("step_id", *_FIELDS).render_derived(name="each")
    return (
        _ending(_STEPS.c.step_id == each.c.step_id, *also)
        .values(
            _end_values(
                lambda column: (
                    sa.cast(each.c[column.key], column.type)
                    if column.key in _JSON_FIELDS
                    else each.c[column.key]
                ),
                now,
            )
        )
        .returning(
            _STEPS.c.step_id,
            _STEPS.c.run_id,
            _STEPS.c.tokens_in_reserved,
            _STEPS.c.tokens_out_reserved,
            _STEPS.c.cost_reserved_usd,
            each.c.tokens_in.label("used_in"),
            each.c.tokens_out.label("used_out"),
            sa.func.coalesce(each.c.cost_usd, 0.0).label("used_cost"),
            sa.case((each.c.cost_usd.is_(None), 1), else_=0).label("unpriced"),
        )
    )


def _settled_by(ended: Any, now: Any, zero: Callable[[Any], Any] = lambda c: c) -> dict[str, Any]:
    """``ledger.settled`` for the step of ``ended`` (its held and used columns), each of
    them through ``zero``."""
    c = ended.c
    used = Used(zero(c.used_in), zero(c.used_out), zero(c.used_cost), zero(c.unpriced), now)
    return settled(
        zero(c.tokens_in_reserved), zero(c.tokens_out_reserved), zero(c.cost_reserved_usd), used
    )


_NOW = sa.bindparam("b_now", type_=_STEPS.c.ended_at.type)
_ENDED_MANY = _ended_many(_MANY_PARAMS, _NOW).cte("ended")
_END_AND_SETTLE_MANY = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == _ENDED_MANY.c.run_id)
    .values(_settled_by(_ENDED_MANY, _NOW))
    .returning(_ENDED_MANY.c.step_id, _RUNS.c.status, _RUNS.c.ended_at)
)


class _Held(NamedTuple):
    run_id: str
    tokens_in_reserved: int
    tokens_out_reserved: int
    cost_reserved_usd: float


def _end_params(step_id: str, ending: Ending) -> dict[str, Any]:
    """``_ENDS_RUNNING``'s parameters, the end checked by the lifecycle (``step_end``)."""
    step_end(ending.status)
    params = {f"b_{name}": getattr(ending, name) for name in _FIELDS}
    params["b_status"] = ending.status.value
    params["b_step_id"] = step_id
    params["b_now"] = clock.now()
    return params


async def _end_running(tx: Tx, step_id: str, ending: Ending) -> _Held:
    row = await _END_RUNNING.first(tx, _end_params(step_id, ending))
    if row is None:
        await _not_running(tx, step_id)
    return _Held(*row)


async def _end_and_settle(tx: Tx, step_id: str, ending: Ending) -> tuple[_Held, RunState]:
    params = _end_params(step_id, ending)
    params.update(used_params(ending.tokens_in, ending.tokens_out, ending.cost_usd))
    row = await _END_AND_SETTLE.first(tx, params)
    if row is None:
        await _not_running(tx, step_id)
    return _Held(*row[2:]), RunState(*row[:2])


async def _not_running(tx: Tx, step_id: str) -> NoReturn:
    """Raise why a step did not end: it is no longer running (ended elsewhere), or there is
    no such step."""
    found = await _STEP_STATUS.first(tx, {"b_step_id": step_id})
    if found is None:
        raise NotFound("step", step_id)
    raise Conflict(f"step {step_id} is {found[0]}, not running: it cannot end here")


_STEP_STATUS = Prepared(
    sa.select(_STEPS.c.status).where(_STEPS.c.step_id == sa.bindparam("b_step_id"))
)


# PostgreSQL, in the event log's statement appending the terminal events (``Alongside``):
# the steps locked (after their runs, as everywhere) and each found running in the run its
# runner named, each run still running and among those whose events the statement appends
# (``APPEND_RUNS``), or nothing is written (``ok``); then each step ends as ``end_together``
# ends it, and its run settles as ``ledger.settled`` settles it, in the update that takes its
# run's cursors (a row is updated once per statement); the runs without an end keep their
# account. The parameters: ``_MANY_KEYS``' columns, ``m_run_id`` (each step's run), ``b_now``.
_ENDING_RUNS = sa.bindparam("m_run_id", type_=postgresql.ARRAY(sa.String))
_NAMED = (
    sa.func.unnest(_MANY_PARAMS[0], _ENDING_RUNS)
    .table_valued(sa.column("step_id", sa.String), sa.column("run_id", sa.String))
    .render_derived(name="w")
)
_LIVE = (
    sa.select(_STEPS.c.step_id)
    .join_from(
        _STEPS,
        _NAMED,
        sa.and_(_STEPS.c.step_id == _NAMED.c.step_id, _STEPS.c.run_id == _NAMED.c.run_id),
    )
    .where(
        _STEPS.c.status == StepStatus.RUNNING.value,
        # (reads ``locked``: the runs are locked first)
        sa.select(sa.func.count()).select_from(LOCKED).scalar_subquery() >= 0,
    )
    .order_by(_STEPS.c.step_id)
    .with_for_update(key_share=True, of=_STEPS)
    .cte("live")
    .prefix_with("MATERIALIZED")
)
_OK = (
    sa.select(
        sa.and_(
            sa.func.count() == sa.func.cardinality(_MANY_PARAMS[0]),
            _ENDING_RUNS.contained_by(APPEND_RUNS),
            ~sa.exists().where(
                LOCKED.c.run_id == sa.any_(_ENDING_RUNS),
                LOCKED.c.status != RunStatus.RUNNING.value,
            ),
        ).label("ok")
    )
    .select_from(_LIVE)
    .cte("ok")
    .prefix_with("MATERIALIZED")
)
_ALL_OK = sa.select(_OK.c.ok).scalar_subquery()
_ALONGSIDE_ENDED = _ended_many(_MANY_PARAMS, _NOW, _ALL_OK).cte("ended")
# each run of the batch, with what its ending step held and used (NULLs where none ends)
_EACH_RUN = (
    sa.select(LOCKED.c.run_id, *(c for c in _ALONGSIDE_ENDED.c if c.key != "run_id"))
    .select_from(LOCKED.outerjoin(_ALONGSIDE_ENDED, _ALONGSIDE_ENDED.c.run_id == LOCKED.c.run_id))
    .cte("d")
)
_ALONGSIDE = Alongside(
    values=_settled_by(
        _EACH_RUN,
        sa.case((_EACH_RUN.c.step_id.is_(None), _RUNS.c.updated_at), else_=_NOW),
        lambda c: sa.func.coalesce(c, 0),
    ),
    where=(_EACH_RUN.c.run_id == _RUNS.c.run_id, _ALL_OK),
)


def _alongside(items: list[Any]) -> Writes | None:
    """The ends made by the statement appending their events: each in its own run (a run
    settles once per statement), else ``None``."""
    ends = cast(list[_Ends], items)
    runs = [end.run_id for end in ends]
    if len(set(runs)) < len(runs):
        return None
    params: dict[str, Any] = _columns(ends)
    params["m_run_id"] = runs
    params["b_now"] = clock.now()
    return Writes(_ALONGSIDE, params)
