"""The append-only event log and its group-committing writer.

Every event is encoded to JSON once, by its producer; the same bytes are stored and streamed.
``insert_events`` is the only function that appends to the ``events`` table (importing a
whole recorded run, ``repo/transfer``, copies its rows as they were): it takes run-level
cursors (``run_seq``) by bumping ``runs.event_seq`` under the row lock, so on PostgreSQL as on
SQLite the run cursors follow commit order.

Durability: an event reaches subscribers only after the transaction that holds it has
committed, so a client never sees an event that a crash could take back. Producers do not
wait for each commit: the writer drains everything queued while the previous commit ran
into one transaction (group commit), and a producer waits only when more than
``max_pending`` events are queued, or for its terminal event.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import TypeEngine, UserDefinedType

from contracts.events import EventBase, NarrationEvent
from orchestrator_core.errors import Conflict, DatabaseUnavailable, NotFound
from orchestrator_core.event_order import TERMINAL_TYPES, EventOrder, EventType
from orchestratord.db.engine import Database
from orchestratord.db.models import Event, Run
from orchestratord.db.outage import described, unavailable
from orchestratord.db.prepared import (
    Prepared,
    dialect_of,
    driver_sql,
    nothing_written,
    origin_of,
)
from orchestratord.tx import Tx

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Finalizer:
    """Runs in the commit of its terminal event; events it returns (a run's ``run_end``) are
    appended in the same transaction. One made of prepared statements alone runs on
    SQLite's driver transaction as well (``needs_session`` False); one that adds ORM rows
    gets a session."""

    run: Callable[[Tx], Awaitable[list[LogEvent] | None]]
    needs_session: bool = False
    # Finalizers of one commit sharing ``together`` run as one call of it, given their
    # ``item``s in the order they were queued (one statement for many, where it can be)
    together: Callable[[Tx, list[Any]], Awaitable[list[LogEvent]]] | None = None
    item: Any = None
    # PostgreSQL: what the group's ``items`` write in the statement appending their events,
    # which then needs no transaction (``Alongside``); None where they cannot go there
    alongside: Callable[[list[Any]], Writes | None] | None = None


@dataclass(slots=True)
class LogEvent:
    run_id: str
    step_id: str | None
    seq: int | None
    type: str
    data: bytes
    run_seq: int = -1

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES


def make_event(
    run_id: str, step_id: str | None, seq: int | None, etype: str, payload: dict[str, object]
) -> LogEvent:
    body = {"step_id": step_id, "seq": seq, "type": etype, **payload}
    return LogEvent(run_id, step_id, seq, etype, orjson.dumps(body))


def log_event(run_id: str, step_id: str | None, seq: int | None, event: EventBase) -> LogEvent:
    """Encode a typed event: the fields its producer set, after ``step_id, seq, type``."""
    payload = event.model_dump(mode="json", exclude_unset=True, exclude=_BASE_FIELDS)
    return make_event(run_id, step_id, seq, event.event_type, payload)


_BASE_FIELDS = {"step_id", "seq", "type"}


_EVENTS = cast(sa.Table, Event.__table__)
_RUNS = cast(sa.Table, Run.__table__)

# At most this many token events share a row, so a reader looking for cursor ``c`` finds the
# row holding it among those starting at ``c - MAX_SPAN + 1`` or later: the unique indexes
# on ``(step_id, seq)`` and ``(run_id, run_seq)`` serve every read, and no third index is
# maintained on the hot path.
MAX_SPAN = 256

# Prepared once: Core statements skip the ORM's per-row bulk machinery on the hot path.
_EVENT_ROW = ("run_id", "run_seq", "step_id", "seq", "type", "data", "span")  # ``_rows``' order
# SQLite: the rows go to the driver's own executemany (plain tuples, no parameter
# processing per row), in the text SQLAlchemy compiles for this INSERT once
_INSERT = _EVENTS.insert().values({name: sa.bindparam(name) for name in _EVENT_ROW})
_INSERT_COMPILED = _INSERT.compile(dialect=sqlite.dialect())
assert tuple(_INSERT_COMPILED.positiontup or ()) == _EVENT_ROW
_INSERT_SQL = _INSERT_COMPILED.string
_TAKE_RUN_SEQ = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(event_seq=_RUNS.c.event_seq + sa.bindparam("b_count", type_=sa.BigInteger))
    .returning(_RUNS.c.event_seq)
)
_TOKEN = EventType.TOKEN.value


@functools.lru_cache(maxsize=64)
def _take_run_seqs(n: int) -> Prepared:
    """SQLite: take cursors for ``n`` runs at once (parameters ``r0``... the run ids,
    ``n0``... their event counts); a row per run: its id and its new top.

    Built and compiled once per run count: building it for every commit (a CASE of n
    branches, its cache key) would cost more than the statement itself."""
    ids = [sa.bindparam(f"r{i}", type_=sa.String) for i in range(n)]
    whens = {run_id: sa.bindparam(f"n{i}", type_=sa.BigInteger) for i, run_id in enumerate(ids)}
    return Prepared(
        _RUNS.update()
        .where(_RUNS.c.run_id.in_(ids))
        .values(event_seq=_RUNS.c.event_seq + sa.case(whens, value=_RUNS.c.run_id))
        .returning(_RUNS.c.run_id, _RUNS.c.event_seq)
    )


_PG: Any = postgresql.dialect()  # type: ignore[no-untyped-call]


class PlainArray(UserDefinedType[Any]):
    """A PostgreSQL array parameter handed to the driver as it is (a list or tuple of plain
    values: text, integers): ``ARRAY``'s own parameter processing copies each array
    element by element, a pass per column of a batch of events that this spares."""

    cache_ok = True
    render_bind_cast = True

    def __init__(self, item: type[TypeEngine[Any]]) -> None:
        self.item = item
        self._spec = postgresql.ARRAY(item).compile(dialect=_PG)

    def get_col_spec(self, **kw: Any) -> str:
        return self._spec

    def bind_processor(self, dialect: Dialect) -> None:
        return None


# PostgreSQL: a batch in one statement, whatever its runs (``_append``): their rows locked in
# run_id order (no deadlock between two processes' writers, whose updates would otherwise
# lock them in the order their scans find them), their cursors taken, the events inserted
# at the cursors taken (each row's ``run_seq`` sent as its offset in its run's part of the
# batch), and the wake-up sent (once per run; PostgreSQL folds identical notifications of a
# transaction into one). One round trip where there were four, and with nothing else in its
# transaction, no BEGIN or COMMIT either (``alone``).
APPEND_RUNS = sa.bindparam("a_runs", type_=PlainArray(sa.String))  # the batch's runs, sorted
# their rows, locked (what goes ``Alongside`` reads their statuses here)
LOCKED = (
    sa.select(_RUNS.c.run_id, _RUNS.c.status)
    .where(_RUNS.c.run_id == sa.any_(APPEND_RUNS))
    .order_by(_RUNS.c.run_id)
    .with_for_update(key_share=True)  # FOR NO KEY UPDATE
    .cte("locked")
    .prefix_with("MATERIALIZED")
)
# each run of the batch and its number of events
_COUNTS = (
    sa.func.unnest(APPEND_RUNS, sa.bindparam("a_counts", type_=PlainArray(sa.BigInteger)))
    .table_valued(sa.column("run_id", sa.String), sa.column("n", sa.BigInteger))
    .render_derived(name="c")
)
# the rows of the batch (``_rows``, its run_seq an offset): one array per column
_ROW_TYPES: dict[str, type[TypeEngine[Any]]] = {
    "run_id": sa.String,
    "k": sa.BigInteger,
    "step_id": sa.String,
    "seq": sa.BigInteger,
    "type": sa.String,
    "data": sa.Text,
    "span": sa.Integer,
}
_ROW_KEYS = tuple(f"e_{name}" for name in _ROW_TYPES)
_EACH = (
    sa.func.unnest(
        *(
            sa.bindparam(k, type_=PlainArray(t))
            for k, t in zip(_ROW_KEYS, _ROW_TYPES.values(), strict=True)
        )
    )
    .table_valued(*(sa.column(name, t) for name, t in _ROW_TYPES.items()))
    .render_derived(name="e")
)
_WAKE = sa.func.pg_notify(
    sa.bindparam("wake_channel", type_=sa.String), sa.bindparam("wake_payload", type_=sa.String)
)


@dataclass(frozen=True, eq=False)
class Alongside:
    """Writes the statement appending a batch's events makes with them (PostgreSQL), as
    Core expressions built once: ``values`` (of the runs' columns, beside their cursors)
    change the runs' rows as their cursors are taken, and ``where`` (conditions on them) may
    refuse them all: then the statement writes nothing. Both may read ``LOCKED`` (the
    batch's runs, their rows locked, with their statuses), ``APPEND_RUNS`` and CTEs of
    their own, which come with them; each run being updated is the ``runs`` row itself."""

    values: Mapping[str, Any]
    where: tuple[Any, ...]


class Writes(NamedTuple):
    """What goes ``alongside`` a batch's events, and the values of its parameters."""

    alongside: Alongside
    params: Mapping[str, Any]


@functools.lru_cache(maxsize=16)
def _append(wake: bool, alongside: Alongside | None) -> Prepared:
    """The statement appending a batch on PostgreSQL (parameters: ``APPEND_RUNS``,
    ``a_counts``, ``_ROW_KEYS``, with ``wake`` the channel and payload, and those of what
    goes ``alongside``); a row per run: its id and its new top. Built and compiled once per
    shape."""
    values: dict[str, Any] = {"event_seq": _RUNS.c.event_seq + _COUNTS.c.n}
    where: tuple[Any, ...] = ()
    if alongside is not None:
        values.update(alongside.values)
        where = alongside.where
    taken = (
        _RUNS.update()
        .where(
            _RUNS.c.run_id == _COUNTS.c.run_id,
            _RUNS.c.run_id.in_(sa.select(LOCKED.c.run_id)),
            *where,
        )
        .values(values)
        .returning(
            _RUNS.c.run_id,
            (_RUNS.c.event_seq - _COUNTS.c.n).label("base"),
            _RUNS.c.event_seq.label("top"),
        )
        .cte("taken")
    )
    inserted = (
        _EVENTS.insert()
        .from_select(
            list(_EVENT_ROW),
            sa.select(
                _EACH.c.run_id,
                taken.c.base + _EACH.c.k,
                *(_EACH.c[name] for name in _EVENT_ROW[2:]),
            ).select_from(_EACH.join(taken, taken.c.run_id == _EACH.c.run_id)),
        )
        .cte("inserted")
    )
    columns = [taken.c.run_id, taken.c.top, *([_WAKE] if wake else [])]
    return Prepared(sa.select(*columns).add_cte(LOCKED, inserted))


# PostgreSQL: every transaction that appends events also NOTIFYs this channel with the keys it
# touched (``s:<step_id>``, ``r:<run_id>``, or ``*``), prefixed by the writing process's
# origin. Delivered at commit, never carrying events: other processes' followers wake and
# read the log (``streams/wakeups.py``).
WAKE_CHANNEL = "orchestratord_log"
_WAKE_PAYLOAD_MAX = 7900  # the server's limit is 8000 bytes


def wake_payload(origin: str, events: Sequence[LogEvent]) -> str:
    keys = {f"r:{ev.run_id}" for ev in events}
    keys.update(f"s:{ev.step_id}" for ev in events if ev.step_id is not None)
    payload = f"{origin} {' '.join(sorted(keys))}"
    return payload if len(payload) <= _WAKE_PAYLOAD_MAX else f"{origin} *"


def _by_step(batch: list[LogEvent]) -> list[LogEvent]:
    """The run's events grouped by step (each step's in order, steps by first appearance), so
    a step's tokens take consecutive run cursors and can share a row. They commit together,
    so no reader could have seen another order."""
    groups: dict[str | None, list[LogEvent]] = {}
    for ev in batch:
        groups.setdefault(ev.step_id, []).append(ev)
    if len(groups) == 1:
        return batch
    return [ev for group in groups.values() for ev in group]


def _rows(events: list[LogEvent]) -> list[tuple[Any, ...]]:
    """One row per event, except runs of consecutive token events of one step: one row each
    (up to ``MAX_SPAN``), their JSON texts joined by newlines (JSON text has none)."""
    rows: list[tuple[Any, ...]] = []
    i, n = 0, len(events)
    while i < n:
        ev = events[i]
        j = i + 1
        if ev.type == _TOKEN:
            while (
                j < n
                and j - i < MAX_SPAN
                and events[j].type == _TOKEN
                and events[j].step_id == ev.step_id
                and events[j].run_seq == ev.run_seq + (j - i)
                and events[j].seq == (ev.seq or 0) + (j - i)
            ):
                j += 1
        data = ev.data if j == i + 1 else b"\n".join(e.data for e in events[i:j])
        rows.append((ev.run_id, ev.run_seq, ev.step_id, ev.seq, ev.type, data.decode(), j - i))
        i = j
    return rows


async def insert_events(
    tx: Tx | AsyncSession, events: Sequence[LogEvent], *, alone: bool = False
) -> list[LogEvent]:
    """Append ``events`` in this transaction (a session's, or a driver's alone),
    assigning their run cursors; returns them in run-cursor order (each run's grouped by
    step), the order to publish them in. ``alone``: nothing else is written in this
    transaction after them (``Prepared.rows``)."""
    done = await _insert(tx, events, alone=alone, alongside=None)
    assert done is not None  # only what goes alongside refuses
    return done


async def insert_events_alongside(
    tx: Tx, events: Sequence[LogEvent], writes: Writes
) -> list[LogEvent] | None:
    """PostgreSQL: ``insert_events`` and ``writes``, in one statement that commits by
    itself; ``None`` where those refused it (nothing was written)."""
    return await _insert(tx, events, alone=True, alongside=writes)


async def _insert(
    tx: Tx | AsyncSession, events: Sequence[LogEvent], *, alone: bool, alongside: Writes | None
) -> list[LogEvent] | None:
    per_run: dict[str, list[LogEvent]] = defaultdict(list)
    for ev in events:
        per_run[ev.run_id].append(ev)
    runs = sorted(per_run)  # a fixed lock order: no deadlock between writers
    ordered: list[LogEvent] = []
    for run_id in runs:
        batch = _by_step(per_run[run_id])
        for offset, ev in enumerate(batch):
            ev.run_seq = offset  # in its run's part of the batch, until cursors are taken
        ordered.extend(batch)
    on_postgresql = dialect_of(tx).name == "postgresql"
    if on_postgresql:  # the rows go with their offsets: the statement adds the cursors taken
        bases = await _append_on_postgresql(
            tx, runs, per_run, ordered, alone=alone, alongside=alongside
        )
        if bases is None:
            return None
    else:
        assert alongside is None
        bases = await _take_cursors(tx, runs, per_run)
    for ev in ordered:
        ev.run_seq = bases[ev.run_id] + (ev.run_seq or 0)
    if not on_postgresql:
        # the driver's own executemany with plain tuples: per row, no parameter processing
        await driver_sql(tx, _INSERT_SQL, _rows(ordered), many=True)
    return ordered


async def _take_cursors(
    tx: Tx | AsyncSession, runs: list[str], per_run: dict[str, list[LogEvent]]
) -> dict[str, int]:
    """Each run's first cursor for its part of the batch (SQLite)."""
    if len(runs) == 1:
        take = {"b_run_id": runs[0], "b_count": len(per_run[runs[0]])}
        tops = {runs[0]: (await _TAKE_RUN_SEQ.rows(tx, take))[0][0]}
    else:  # one statement for every run in the batch, compiled once per run count
        params: dict[str, Any] = {}
        for i, run_id in enumerate(runs):
            params[f"r{i}"] = run_id
            params[f"n{i}"] = len(per_run[run_id])
        rows = await _take_run_seqs(len(runs)).rows(tx, params)
        tops = {row[0]: row[1] for row in rows}
    return {r: tops[r] - len(per_run[r]) for r in runs}


async def _append_on_postgresql(
    tx: Tx | AsyncSession,
    runs: list[str],
    per_run: dict[str, list[LogEvent]],
    ordered: list[LogEvent],
    *,
    alone: bool,
    alongside: Writes | None,
) -> dict[str, int] | None:
    """``_append``: each run's first cursor for its part of the batch; ``None`` where what
    went ``alongside`` refused the statement."""
    params: dict[str, Any] = dict(zip(_ROW_KEYS, zip(*_rows(ordered), strict=True), strict=True))
    params["a_runs"] = runs
    params["a_counts"] = [len(per_run[r]) for r in runs]
    origin = origin_of(tx)
    if origin is not None:
        params["wake_channel"] = WAKE_CHANNEL
        params["wake_payload"] = wake_payload(origin, ordered)
    if alongside is not None:
        params.update(alongside.params)
    statement = _append(origin is not None, None if alongside is None else alongside.alongside)
    rows = await statement.rows(tx, params, alone=alone)
    if not rows and alongside is not None:
        return None
    return {row[0]: row[1] - len(per_run[row[0]]) for row in rows}


EVENT_COLUMNS = (
    Event.run_id,
    Event.run_seq,
    Event.step_id,
    Event.seq,
    Event.type,
    Event.data,
    Event.span,
)


def expand(rows: Sequence[Any]) -> list[LogEvent]:
    """Events from stored rows (columns as ``EVENT_COLUMNS``), a coalesced row into its events."""
    out: list[LogEvent] = []
    for run_id, run_seq, step_id, seq, etype, data, span in rows:
        if span == 1:
            out.append(LogEvent(run_id, step_id, seq, etype, data.encode(), run_seq))
            continue
        for k, part in enumerate(data.encode().split(b"\n")):
            out.append(LogEvent(run_id, step_id, seq + k, etype, part, run_seq + k))
    return out


def _window(key: Any, cursor: Any) -> Any:
    # the rows holding cursors ``cursor .. upto - 1``: a row starts at most ``MAX_SPAN - 1``
    # before the first (``low``), so the unique index on (key, cursor) serves it as one range
    return (
        key == sa.bindparam("key"),
        cursor >= sa.bindparam("low"),
        cursor < sa.bindparam("upto"),
        cursor + Event.span > sa.bindparam("cursor"),
    )


_STEP_READ = Prepared(
    sa.select(*EVENT_COLUMNS)
    .where(*_window(Event.step_id, Event.seq))
    .order_by(Event.seq)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
_RUN_READ = Prepared(
    sa.select(*EVENT_COLUMNS)
    .where(*_window(Event.run_id, Event.run_seq))
    .order_by(Event.run_seq)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)


async def _read(db: Database, stmt: Prepared, key: str, cursor: int, limit: int) -> list[Any]:
    # ``limit`` events lie in at most ``limit`` rows, and one more that starts before them;
    # on the driver: a stream catching up reads a page at a time, and through the session
    # the statement's own cost was a fifth of a catch-up's CPU
    params = {
        "key": key,
        "low": cursor - MAX_SPAN + 1,
        "cursor": cursor,
        "upto": cursor + limit,
        "limit": limit + 1,
    }
    async with db.read() as session:
        return await stmt.rows(session, params)


def _page(rows: Sequence[Any], start: int, limit: int, *, by_run: bool) -> list[LogEvent]:
    """The events with cursors ``start .. start + limit - 1`` of ``rows``: a page of the log.
    A coalesced row is split, and only the events of the page are made (a row of 256
    tokens may start before the page, or reach past it)."""
    end = start + limit
    out: list[LogEvent] = []
    for run_id, run_seq, step_id, seq, etype, data, span in rows:
        first = run_seq if by_run else seq
        if span == 1:
            if start <= first < end:
                out.append(LogEvent(run_id, step_id, seq, etype, data.encode(), run_seq))
            continue
        lo, hi = max(0, start - first), min(span, end - first)
        if lo >= hi:
            continue
        parts = data.encode().split(b"\n")[lo:hi]
        out += [
            LogEvent(run_id, step_id, seq + k, etype, part, run_seq + k)
            for k, part in enumerate(parts, lo)
        ]
    return out


async def read_step_events(db: Database, step_id: str, from_seq: int, limit: int) -> list[LogEvent]:
    """At most ``limit`` of the step's events, from ``from_seq`` on, in one query."""
    rows = await _read(db, _STEP_READ, step_id, from_seq, limit)
    return _page(rows, from_seq, limit, by_run=False)


async def read_run_events(
    db: Database, run_id: str, from_run_seq: int, limit: int
) -> list[LogEvent]:
    """At most ``limit`` of the run's events, from ``from_run_seq`` on, in one query."""
    rows = await _read(db, _RUN_READ, run_id, from_run_seq, limit)
    return _page(rows, from_run_seq, limit, by_run=True)


async def read_all_step_events(session: AsyncSession, step_id: str) -> list[LogEvent]:
    """Every event of a step, in order."""
    rows = await session.execute(
        sa.select(*EVENT_COLUMNS).where(Event.step_id == step_id).order_by(Event.seq)
    )
    return expand(rows.all())


_STEP_ENDED = (
    sa.select(Event.seq)
    .where(
        Event.step_id == sa.bindparam("key"),
        Event.seq < sa.bindparam("cursor"),
        Event.type.in_([t.value for t in TERMINAL_TYPES]),
    )
    .limit(1)
)
RUN_END = "run_end"
_RUN_ENDED = (
    sa.select(Event.run_seq)
    .where(
        Event.run_id == sa.bindparam("key"),
        Event.run_seq < sa.bindparam("cursor"),
        Event.type == RUN_END,
    )
    .limit(1)
)


async def _found(db: Database, stmt: Any, key: str, cursor: int) -> bool:
    if cursor <= 0:
        return False  # nothing lies before the first cursor
    async with db.read() as session:
        return (await session.execute(stmt, {"key": key, "cursor": cursor})).first() is not None


async def step_ended_before(db: Database, step_id: str, cursor: int) -> bool:
    """Whether the step's terminal event has a seq below ``cursor``."""
    return await _found(db, _STEP_ENDED, step_id, cursor)


async def run_ended_before(db: Database, run_id: str, cursor: int) -> bool:
    """Whether the run's ``run_end`` has a run cursor below ``cursor``."""
    return await _found(db, _RUN_ENDED, run_id, cursor)


@dataclass
class _Batch:
    events: list[LogEvent] = field(default_factory=list)
    finalizers: list[tuple[str | None, Finalizer]] = field(default_factory=list)
    waiters: list[tuple[str | None, asyncio.Future[None]]] = field(default_factory=list)

    def by_step(self) -> list[_Batch]:
        """One batch per step (and one for events of no step), each in its order."""
        parts: dict[str | None, _Batch] = {}
        for ev in self.events:
            parts.setdefault(ev.step_id, _Batch()).events.append(ev)
        for sid, finalizer in self.finalizers:
            parts.setdefault(sid, _Batch()).finalizers.append((sid, finalizer))
        for sid, fut in self.waiters:
            parts.setdefault(sid, _Batch()).waiters.append((sid, fut))
        return list(parts.values())


def _alongside(tx: Tx, batch: _Batch) -> Writes | None:
    """What the batch's finalizers write in the statement appending its events, where they
    all can (PostgreSQL: one group sharing ``together``, each with its terminal event)."""
    finalizers = [f for _, f in batch.finalizers]
    if not finalizers or not batch.events or dialect_of(tx).name != "postgresql":
        return None
    first = finalizers[0]
    if first.alongside is None or any(f.together is not first.together for f in finalizers):
        return None
    return first.alongside([f.item for f in finalizers])


async def _finalize(tx: Tx, finalizers: list[Finalizer]) -> list[LogEvent]:
    """Each finalizer in its turn, those sharing ``together`` in one call (the first one's
    turn); the events they return."""
    together: dict[Any, list[Any]] = {}
    for f in finalizers:
        if f.together is not None:
            together.setdefault(f.together, []).append(f.item)
    events: list[LogEvent] = []
    for f in finalizers:
        if f.together is None:
            events.extend(await f.run(tx) or ())
        elif (items := together.pop(f.together, None)) is not None:
            done = await (f.run(tx) if len(items) == 1 else f.together(tx, items))
            events.extend(done or ())
    return events


async def _as_committed(db: Database, batch: _Batch) -> list[LogEvent] | None:
    """After an attempt that failed where it may have committed (the connection was lost
    before the commit's acknowledgement): the batch's events with the run cursors they were
    stored at, then what its finalizers appended (a ``run_end``), in the order ``_insert``
    returns them; None where the log does not hold the batch (write it again).

    A batch commits whole, and each run's part of it took consecutive cursors in
    ``_insert``'s order: the part's first event, stored at its seq with the same bytes, tells
    whether it committed and where. (Every event the writer is handed is a step's,
    ``StepLog``; one that is not cannot tell, and its batch is written again.)"""
    if not batch.events:
        return None  # nothing tells: what goes with nothing is made again
    per_run: dict[str, list[LogEvent]] = defaultdict(list)
    for ev in batch.events:
        per_run[ev.run_id].append(ev)
    ended = {ev.run_id for ev in batch.events if ev.terminal}
    out: list[LogEvent] = []
    for n, run_id in enumerate(sorted(per_run)):
        part = _by_step(per_run[run_id])
        base = await _stored_at(db, part[0])
        if base is None:
            if n == 0:
                return None
            raise EventLogError(f"the log holds part of a batch, not run {run_id}'s")
        out.extend(
            LogEvent(ev.run_id, ev.step_id, ev.seq, ev.type, ev.data, base + i)
            for i, ev in enumerate(part)
        )
        if run_id in ended and batch.finalizers:  # what its finalizers appended after it
            top = base + len(part)
            after = await read_run_events(db, run_id, top, 1)
            out.extend(ev for ev in after if ev.run_seq == top and ev.type == RUN_END)
    return out


async def _stored_at(db: Database, ev: LogEvent) -> int | None:
    """The run cursor the log holds this step event at, if it holds it (the same bytes)."""
    if ev.step_id is None or ev.seq is None:
        return None
    found = await read_step_events(db, ev.step_id, ev.seq, 1)
    if not found or found[0].seq != ev.seq or found[0].data != ev.data:
        return None
    return found[0].run_seq


class EventLogError(RuntimeError):
    """Events of this step could not be written; its log must not go on past the gap."""


class EventWriter:
    """One writer task per process: drains queued events into one transaction per round.

    Within a round every event is inserted before any finalizer runs, so a finalizer sees
    the events queued with it.
    """

    def __init__(
        self,
        db: Database,
        publish: Callable[[list[LogEvent]], None],
        *,
        max_pending: int = 20000,
        retries: int = 3,
        outage_s: float = 60.0,
        observe: Callable[[int, float], None] | None = None,
    ) -> None:
        self.db = db
        self.outage_s = outage_s  # how long a commit waits for an unavailable database
        self._observe = observe  # (events, seconds) of each commit
        self._publish = publish
        self._max_pending = max_pending
        self._retries = retries
        self._batch = _Batch()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.commits = 0
        self.failed_steps: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-writer")

    async def stop(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    def publish(self, events: list[LogEvent]) -> None:
        """Hand events committed elsewhere to the live followers."""
        self._publish(events)

    @property
    def pending(self) -> int:
        return len(self._batch.events)

    @property
    def over_limit(self) -> bool:
        return len(self._batch.events) > self._max_pending

    def append_nowait(self, events: list[LogEvent]) -> None:
        """Queue events; they commit with the next round."""
        self._batch.events.extend(events)
        self._drained.clear()
        self._wake.set()

    def append_one_nowait(self, event: LogEvent) -> None:
        if event.step_id in self.failed_steps:
            raise EventLogError(f"the log of step {event.step_id} lost events")
        self._batch.events.append(event)
        if not self._wake.is_set():
            self._drained.clear()
            self._wake.set()

    async def wait_drained(self) -> None:
        await self._drained.wait()

    async def append(
        self, events: list[LogEvent], *, finalizer: Finalizer | None = None, wait: bool = False
    ) -> None:
        """Queue events (and a finalizer run in the same transaction).

        With ``wait`` the call returns once they are committed, and raises if they could not
        be. Otherwise it returns at once unless too many events are pending.
        """
        step_id = events[0].step_id if events else None
        if step_id in self.failed_steps:
            raise EventLogError(f"the log of step {step_id} lost events")
        self.append_nowait(events)
        if finalizer is not None:
            self._batch.finalizers.append((step_id, finalizer))
        if wait:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._batch.waiters.append((step_id, fut))
            await fut
        elif self.over_limit:
            await self._drained.wait()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._batch.events or self._batch.finalizers or self._batch.waiters:
                batch, self._batch = self._batch, _Batch()
                await self._commit(batch)
            self._drained.set()
            if self._closing:
                return

    async def _commit(self, batch: _Batch) -> None:
        began = time.perf_counter()
        unsure = False  # an attempt failed where it may have committed
        attempt = waits = 0
        while True:
            try:
                found = await _as_committed(self.db, batch) if unsure else None
                if found is not None:
                    log.warning("event log commit of %d events found on retry", len(found))
                committed = found if found is not None else await self._transaction(batch)
                break
            except (sa.exc.IntegrityError, sa.exc.DataError, Conflict, NotFound) as exc:
                # what one step queued cannot be written, or its end cannot be made (it was
                # ended elsewhere): retrying cannot help; the steps are committed apart, so
                # the others do not share its failure
                if len(parts := batch.by_step()) > 1:
                    for part in parts:
                        await self._commit(part)
                    return
                log.exception("event log commit failed; %d events lost", len(batch.events))
                self._poison(batch, exc)
                return
            except Exception as exc:
                # a lost connection says nothing of whether the commit reached the database
                unsure = True
                if self._outlasts(exc, began, waits):  # down, restarting: wait for it
                    waits += 1
                    await asyncio.sleep(min(1.0, 0.05 * 2**waits))
                    continue
                if attempt == self._retries:
                    log.exception("event log commit failed; %d events lost", len(batch.events))
                    self._poison(batch, exc)
                    return
                await asyncio.sleep(0.05 * 2**attempt)
                attempt += 1
        self.commits += 1
        if self._observe is not None:
            self._observe(len(committed), time.perf_counter() - began)
        self._publish(committed)
        for _, fut in batch.waiters:
            if not fut.done():
                fut.set_result(None)

    def _outlasts(self, exc: Exception, began: float, waits: int) -> bool:
        """Whether a commit that failed with ``exc`` waits for the database: it is
        unavailable (``db/outage.py``) and has been for less than ``outage_s``. Its events
        are kept meanwhile (producers wait once ``max_pending`` are queued), so a step that
        streams through an outage goes on once the database is back."""
        if not isinstance(unavailable(exc), DatabaseUnavailable):
            return False
        if time.perf_counter() - began >= self.outage_s:
            return False
        if waits == 0:
            log.warning("database unavailable (%s): events wait for it", described(exc))
        return True

    async def _transaction(self, batch: _Batch) -> list[LogEvent]:
        """The batch in one transaction; the events committed."""
        if not self.db.on_driver or any(f.needs_session for _, f in batch.finalizers):
            async with self.db.write(urgent=True) as session:
                return await self._write(Tx(session), batch)
        # prepared statements alone (tokens, a step's end): no session to open, flush, close
        async with self.db.driver_write(urgent=True) as tx:
            alongside = _alongside(tx, batch)
            if alongside is not None:  # one statement, unless what goes with it refuses
                done = await insert_events_alongside(tx, batch.events, alongside)
                if done is not None:
                    return done
                nothing_written(tx)  # the general way, in this transaction
            return await self._write(tx, batch)

    @staticmethod
    async def _write(tx: Tx, batch: _Batch) -> list[LogEvent]:
        """Within a round every event is inserted before any finalizer runs, so a finalizer
        sees the events queued with it."""
        committed = (
            await insert_events(tx, batch.events, alone=not batch.finalizers)
            if batch.events
            else []
        )
        extra = await _finalize(tx, [f for _, f in batch.finalizers])
        if extra:
            committed = committed + await insert_events(tx, extra)
        return committed

    def _poison(self, batch: _Batch, exc: Exception) -> None:
        """The batch is lost: its steps take no more events (the log would have a gap), and
        what they already queued behind it is dropped."""
        failed = {ev.step_id for ev in batch.events if ev.step_id is not None}
        failed |= {sid for sid, _ in batch.finalizers if sid is not None}
        self.failed_steps |= failed
        error = EventLogError(f"event log commit failed: {exc}")
        pending = self._batch
        pending.events = [ev for ev in pending.events if ev.step_id not in failed]
        pending.finalizers = [(s, f) for s, f in pending.finalizers if s not in failed]
        lost = [w for w in pending.waiters if w[0] in failed]
        pending.waiters = [w for w in pending.waiters if w[0] not in failed]
        for _, fut in [*batch.waiters, *lost]:
            if not fut.done():
                fut.set_exception(error)

    def drop(self, step_id: str) -> None:
        """This process let go of the step: what it queued and is not committing yet is
        dropped (its producer is fenced, ``StepLog.fenced``)."""
        pending = self._batch
        pending.events = [ev for ev in pending.events if ev.step_id != step_id]
        pending.finalizers = [(s, f) for s, f in pending.finalizers if s != step_id]
        error = EventLogError(f"step {step_id} is no longer run by this process")
        for sid, fut in pending.waiters:
            if sid == step_id and not fut.done():
                fut.set_exception(error)
        pending.waiters = [w for w in pending.waiters if w[0] != step_id]

    def forget(self, step_id: str) -> None:
        """The step was ended from what its log holds; nothing more will be appended."""
        self.failed_steps.discard(step_id)


def _started_again(event: EventBase) -> str:
    where = [
        f"{name} {value}"
        for name in ("pool_id", "replica_id")
        if (value := getattr(event, name, None)) is not None
    ]
    return "started again" + (f" on {', '.join(where)}" if where else "")


_TOKEN_JSON = b'{"step_id":"%s","seq":%d,"type":"token","i":%d,"t":%s,"token_id":%s}'


class StepLog:
    """One step's producer side: checks the event grammar, numbers events, hands them over."""

    def __init__(self, writer: EventWriter, run_id: str, step_id: str) -> None:
        self._writer = writer
        self.writer = writer
        self.run_id = run_id
        self.step_id = step_id
        self.order = EventOrder()
        self._step_bytes = step_id.encode()
        self._resumed = False
        self.fenced = False  # the step is no longer this process's: nothing more is written

    def resume(self, next_seq: int) -> None:
        """The step runs again after its process was lost: its log goes on at ``next_seq``,
        and this execution's ``started`` is told as a narration (the first one stands)."""
        self.order.resume(next_seq)
        self._resumed = True

    def make(self, event: EventBase) -> LogEvent:
        if self._resumed and event.event_type == EventType.STARTED.value:
            self._resumed = False
            event = NarrationEvent(text=_started_again(event))
        seq = self.order.accept(EventType(event.event_type))
        return log_event(self.run_id, self.step_id, seq, event)

    def emit(self, event: EventBase) -> None:
        """Queue one event; it commits with the writer's next round."""
        if self.fenced:
            return
        self._writer.append_one_nowait(self.make(event))

    def token_nowait(self, i: int, text: str, token_id: int | None) -> None:
        """The hot path: a token event encoded from a template, not a dict.

        The bytes equal ``make(TOKEN, {"i", "t", "token_id"})``'s (see the test).
        """
        if self.fenced:
            return
        seq = self.order.accept(EventType.TOKEN)
        data = _TOKEN_JSON % (
            self._step_bytes,
            seq,
            i,
            orjson.dumps(text),
            b"null" if token_id is None else b"%d" % token_id,
        )
        self._writer.append_one_nowait(LogEvent(self.run_id, self.step_id, seq, "token", data))

    async def close(self, event: EventBase, finalizer: Finalizer) -> None:
        """Append the terminal event and run ``finalizer`` in the same transaction; wait."""
        if self.fenced:
            raise EventLogError(f"step {self.step_id} is no longer run by this process")
        await self._writer.append([self.make(event)], finalizer=finalizer, wait=True)
