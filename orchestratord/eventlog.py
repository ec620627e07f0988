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
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import EventBase
from orchestrator_core.event_order import TERMINAL_TYPES, EventOrder, EventType
from orchestratord.db.engine import Database
from orchestratord.db.models import Event, Run

log = logging.getLogger(__name__)

# A finalizer runs in the commit of its terminal event; events it returns (a run's
# ``run_end``) are appended in the same transaction.
Finalizer = Callable[[AsyncSession], Awaitable["list[LogEvent] | None"]]


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
# Prepared once: Core statements skip the ORM's per-row bulk machinery on the hot path.
_INSERT_SQL = {
    "qmark": "INSERT INTO events (run_id, run_seq, step_id, seq, type, data) "
    "VALUES (?, ?, ?, ?, ?, ?)",
    "numeric_dollar": "INSERT INTO events (run_id, run_seq, step_id, seq, type, data) "
    "VALUES ($1, $2, $3, $4, $5, $6)",
}
_TAKE_RUN_SEQ = (
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(event_seq=_RUNS.c.event_seq + sa.bindparam("b_count", type_=sa.BigInteger))
    .returning(_RUNS.c.event_seq)
)


async def insert_events(session: AsyncSession, events: Sequence[LogEvent]) -> None:
    """Append ``events`` in this transaction, assigning their run cursors."""
    conn = await session.connection()
    per_run: dict[str, list[LogEvent]] = defaultdict(list)
    for ev in events:
        per_run[ev.run_id].append(ev)
    runs = sorted(per_run)  # a fixed lock order: no deadlock between writers
    if len(runs) == 1:
        tops = {
            runs[0]: (
                await conn.execute(
                    _TAKE_RUN_SEQ, {"b_run_id": runs[0], "b_count": len(per_run[runs[0]])}
                )
            ).scalar_one()
        }
    else:  # one statement for every run in the batch
        if conn.dialect.name == "postgresql":
            await conn.execute(
                sa.select(_RUNS.c.run_id)
                .where(_RUNS.c.run_id.in_(runs))
                .order_by(_RUNS.c.run_id)
                .with_for_update(key_share=True)
            )
        counts = sa.case({r: len(per_run[r]) for r in runs}, value=_RUNS.c.run_id)
        rows = await conn.execute(
            _RUNS.update()
            .where(_RUNS.c.run_id.in_(runs))
            .values(event_seq=_RUNS.c.event_seq + counts)
            .returning(_RUNS.c.run_id, _RUNS.c.event_seq)
        )
        tops = {run_id: top for run_id, top in rows}
    for run_id in runs:
        batch = per_run[run_id]
        first = tops[run_id] - len(batch)
        for offset, ev in enumerate(batch):
            ev.run_seq = first + offset
    # The driver's own executemany with plain tuples: per row, no parameter processing.
    await conn.exec_driver_sql(
        _INSERT_SQL[conn.dialect.paramstyle],
        [(ev.run_id, ev.run_seq, ev.step_id, ev.seq, ev.type, ev.data.decode()) for ev in events],
    )


def _rows_to_events(rows: Sequence[Any]) -> list[LogEvent]:
    return [LogEvent(r[0], r[2], r[3], r[4], r[5].encode(), run_seq=r[1]) for r in rows]


_COLUMNS = (Event.run_id, Event.run_seq, Event.step_id, Event.seq, Event.type, Event.data)


async def _read(db: Database, where: Any, order: Any, limit: int) -> list[LogEvent]:
    async with db.read() as session:
        rows = (
            await session.execute(sa.select(*_COLUMNS).where(*where).order_by(order).limit(limit))
        ).all()
    return _rows_to_events(rows)


async def read_step_events(db: Database, step_id: str, from_seq: int, limit: int) -> list[LogEvent]:
    return await _read(db, (Event.step_id == step_id, Event.seq >= from_seq), Event.seq, limit)


async def read_run_events(
    db: Database, run_id: str, from_run_seq: int, limit: int
) -> list[LogEvent]:
    return await _read(
        db, (Event.run_id == run_id, Event.run_seq >= from_run_seq), Event.run_seq, limit
    )


async def step_ended_before(db: Database, step_id: str, cursor: int) -> bool:
    """Whether the step's terminal event has a seq below ``cursor``."""
    async with db.read() as session:
        found = (
            await session.execute(
                sa.select(Event.seq)
                .where(
                    Event.step_id == step_id,
                    Event.seq < cursor,
                    Event.type.in_([t.value for t in TERMINAL_TYPES]),
                )
                .limit(1)
            )
        ).first()
    return found is not None


RUN_END = "run_end"


async def run_ended_before(db: Database, run_id: str, cursor: int) -> bool:
    """Whether the run's ``run_end`` has a run cursor below ``cursor``."""
    async with db.read() as session:
        found = (
            await session.execute(
                sa.select(Event.run_seq)
                .where(Event.run_id == run_id, Event.run_seq < cursor, Event.type == RUN_END)
                .limit(1)
            )
        ).first()
    return found is not None


@dataclass
class _Batch:
    events: list[LogEvent] = field(default_factory=list)
    finalizers: list[tuple[str | None, Finalizer]] = field(default_factory=list)
    waiters: list[tuple[str | None, asyncio.Future[None]]] = field(default_factory=list)


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
    ) -> None:
        self.db = db
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
        for attempt in range(self._retries + 1):
            try:
                extra: list[LogEvent] = []
                async with self.db.write() as session:
                    if batch.events:
                        await insert_events(session, batch.events)
                    for _, finalizer in batch.finalizers:
                        extra.extend(await finalizer(session) or ())
                    if extra:
                        await insert_events(session, extra)
                break
            except Exception as exc:
                if attempt == self._retries:
                    log.exception("event log commit failed; %d events lost", len(batch.events))
                    self._poison(batch, exc)
                    return
                await asyncio.sleep(0.05 * 2**attempt)
        self.commits += 1
        self._publish(batch.events + extra if extra else batch.events)
        for _, fut in batch.waiters:
            if not fut.done():
                fut.set_result(None)

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

    def forget(self, step_id: str) -> None:
        """The step was ended from what its log holds; nothing more will be appended."""
        self.failed_steps.discard(step_id)


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

    def make(self, event: EventBase) -> LogEvent:
        seq = self.order.accept(EventType(event.event_type))
        return log_event(self.run_id, self.step_id, seq, event)

    def emit(self, event: EventBase) -> None:
        """Queue one event; it commits with the writer's next round."""
        self._writer.append_one_nowait(self.make(event))

    def token_nowait(self, i: int, text: str, token_id: int | None) -> None:
        """The hot path: a token event encoded from a template, not a dict.

        The bytes equal ``make(TOKEN, {"i", "t", "token_id"})``'s (see the test).
        """
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
        await self._writer.append([self.make(event)], finalizer=finalizer, wait=True)
