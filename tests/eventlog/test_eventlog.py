"""The event log under concurrency: gap-free per step and per run, in commit order."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Event
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run, stored_events, submit, wait_status


async def test_concurrent_steps_and_facts_keep_both_logs_gap_free(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    run_id = await make_run(client)

    async def fact(i: int) -> None:
        r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "f", "data": i})
        assert r.status_code == 201

    subs = await asyncio.gather(
        *(submit(client, run_id, token=f"s{i}", max_tokens=50) for i in range(12)),
        *(fact(i) for i in range(10)),
    )
    step_ids = [r.json()["step_id"] for r in subs if isinstance(r, httpx.Response)]
    for sid in step_ids:
        await wait_status(client, sid, "succeeded")
    rows = await stored_events(orch.db, run_id=run_id)
    assert [r.run_seq for r in rows] == list(range(len(rows)))
    assert len(rows) == 12 * 53 + 10  # started, where it was placed, 50 tokens, end
    for sid in step_ids:
        seqs = [r.seq for r in rows if r.step_id == sid]
        assert seqs == list(range(53))  # in run order too: a step's events never reorder


async def test_writer_groups_commits(client: httpx.AsyncClient, orch: Orchestrator) -> None:
    run_id = await make_run(client)
    before = orch.writer.commits
    ids = [
        (await submit(client, run_id, token=f"g{i}", max_tokens=200)).json()["step_id"]
        for i in range(8)
    ]
    for sid in ids:
        await wait_status(client, sid, "succeeded")
    events = 8 * 203
    assert orch.writer.commits - before < events / 4  # many events per transaction


async def test_events_and_ends_commit_without_a_session(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's batches made of prepared statements alone (events, a step's end and
    settlement) commit on the driver's own transaction (SQLite's, asyncpg's): it opens no
    session for them."""
    from orchestratord.eventlog import make_event

    run_id = await make_run(client)
    sessions = 0
    real_write = orch.db.write

    def counting_write(*, urgent: bool = False):  # type: ignore[no-untyped-def]
        nonlocal sessions
        sessions += urgent  # the writer's
        return real_write(urgent=urgent)

    monkeypatch.setattr(orch.db, "write", counting_write)
    events = [make_event(run_id, None, None, "narration", {"text": f"n{i}"}) for i in range(5)]
    await orch.writer.append(events, wait=True)
    assert sessions == 0
    stored = await stored_events(orch.db, run_id=run_id)
    assert [ev.run_seq for ev in stored] == list(range(5))
    sessions = 0
    step_id = (await submit(client, run_id, max_tokens=3)).json()["step_id"]
    step = await wait_status(client, step_id, "succeeded")
    assert step["usage"]["tokens_out"] == 3
    if orch.db.is_sqlite:
        assert sessions == 0
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == 3 and run["reserved"]["tokens_out"] == 0


def test_token_template_equals_the_generic_encoding() -> None:
    from orchestratord.eventlog import EventWriter, StepLog

    captured = []

    class Sink(EventWriter):
        def __init__(self) -> None:
            pass

        def append_one_nowait(self, event):  # type: ignore[no-untyped-def]
            captured.append(event)

        def append_nowait(self, events):  # type: ignore[no-untyped-def]
            captured.extend(events)

    from contracts.events import StartedEvent, TokenEvent

    fast, slow = StepLog(Sink(), "run_1", "step_x"), StepLog(Sink(), "run_1", "step_x")
    for log in (fast, slow):
        log.emit(StartedEvent(pool_id=None, replica_id=None, engine=None))
    for i, (text, tid) in enumerate([("a", 1), ('q"uo\\te\n', None), ("é💡", 7)]):
        fast.token_nowait(i, text, tid)
        slow.emit(TokenEvent(i=i, t=text, token_id=tid))
    fast_tokens = [e for e in captured[::1] if e.type == "token"][0::2]
    slow_tokens = [e for e in captured if e.type == "token"][1::2]
    assert [e.data for e in fast_tokens] == [e.data for e in slow_tokens]
    assert [e.seq for e in fast_tokens] == [1, 2, 3]


async def test_many_runs_in_one_commit_keep_their_own_cursors(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    runs = [await make_run(client) for _ in range(6)]
    before = orch.writer.commits
    subs = await asyncio.gather(*(submit(client, r, token="x", max_tokens=40) for r in runs))
    for r in subs:
        await wait_status(client, r.json()["step_id"], "succeeded")
    for run_id in runs:
        seqs = [ev.run_seq for ev in await stored_events(orch.db, run_id=run_id)]
        assert seqs == list(range(43))  # started, where it was placed, 40 tokens, end
    assert orch.writer.commits - before < 6 * 43  # runs shared commits


async def test_a_log_that_cannot_be_written_ends_the_step(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the writer gives up on a batch, the step ends failed instead of staying running."""
    from orchestratord import eventlog

    real = eventlog._insert

    async def failing(session, events, **kw):  # type: ignore[no-untyped-def]
        if any(ev.type == "token" for ev in events):
            raise RuntimeError("disk full")
        return await real(session, events, **kw)

    monkeypatch.setattr(eventlog, "_insert", failing)
    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=20)).json()["step_id"]
    step = await wait_status(client, step_id, "failed", "succeeded")
    assert step["status"] == "failed"
    assert step["error"]["code"] == "INTERNAL" and step["error"]["retriable"] is True
    rows = await stored_events(orch.db, step_id=step_id)
    assert [r.seq for r in rows] == list(range(len(rows)))
    assert rows[-1].type == "error"
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["reserved"]["tokens_out"] == 0


async def test_a_step_whose_events_cannot_be_written_fails_alone(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that the database refuses because of one step's events (a constraint) is
    committed step by step: the other steps sharing the batch lose nothing."""
    from orchestratord import eventlog

    real = eventlog._insert
    doomed_run = await make_run(client)
    others = [await make_run(client) for _ in range(4)]

    async def refusing(session, events, **kw):  # type: ignore[no-untyped-def]
        if any(ev.run_id == doomed_run and ev.type == "token" for ev in events):
            raise sa.exc.IntegrityError("INSERT INTO events", {}, Exception("duplicate key"))
        return await real(session, events, **kw)

    monkeypatch.setattr(eventlog, "_insert", refusing)
    subs = await asyncio.gather(
        *(submit(client, r, token="x", max_tokens=200) for r in [doomed_run, *others])
    )
    doomed, *rest = [r.json()["step_id"] for r in subs]
    assert (await wait_status(client, doomed, "failed", "succeeded"))["status"] == "failed"
    for step_id in rest:
        assert (await wait_status(client, step_id, "failed", "succeeded"))["status"] == "succeeded"
        rows = await stored_events(orch.db, step_id=step_id)
        assert [r.seq for r in rows] == list(range(203))


async def test_token_events_share_rows_and_resume_at_any_token(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    """The writer stores a step's tokens of one commit in one row; readers still serve,
    and resume at, every single event."""
    from orchestratord.eventlog import read_run_events, read_step_events

    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=120)).json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    events = await stored_events(orch.db, step_id=step_id)
    assert [ev.seq for ev in events] == list(range(123))
    async with orch.db.read() as s:
        rows = (await s.execute(sa.select(Event.span).where(Event.step_id == step_id))).all()
    assert len(rows) < len(events) / 4 and max(r.span for r in rows) > 1
    for cursor in range(124):
        got = await read_step_events(orch.db, step_id, cursor, 500)
        assert [ev.seq for ev in got] == list(range(cursor, 123))
        assert [ev.data for ev in got] == [ev.data for ev in events[cursor:]]
    for cursor in range(0, 124, 7):
        got = await read_run_events(orch.db, run_id, cursor, 500)
        assert [ev.run_seq for ev in got] == list(range(cursor, 123))
    # the stream resumes inside a row, with the same bytes as a live reader saw
    for after in (5, 60, 120):
        r = await client.get(f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": str(after)})
        ids = [int(line[4:]) for line in r.text.splitlines() if line.startswith("id: ")]
        assert ids == list(range(after + 1, 123))


async def test_rows_hold_at_most_max_span_and_keep_interleaved_steps_apart(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    from orchestratord.eventlog import MAX_SPAN, LogEvent, insert_events

    run_id = await make_run(client)
    events = []
    for i in range(MAX_SPAN + 10):  # two steps' tokens interleaved, as parallel steps emit
        for step in ("step_a", "step_b"):
            data = b'{"step_id":"%s","seq":%d,"type":"token","i":%d}' % (step.encode(), i, i)
            events.append(LogEvent(run_id, step, i, "token", data))
    async with orch.db.write() as s:
        ordered = await insert_events(s, events)
    # each step's events took consecutive run cursors, in their own order
    for step in ("step_a", "step_b"):
        mine = [ev for ev in ordered if ev.step_id == step]
        assert [ev.seq for ev in mine] == list(range(MAX_SPAN + 10))
        assert [ev.run_seq for ev in mine] == list(
            range(mine[0].run_seq, mine[0].run_seq + MAX_SPAN + 10)
        )
        async with orch.db.read() as s:
            spans = (
                await s.execute(
                    sa.select(Event.span).where(Event.step_id == step).order_by(Event.seq)
                )
            ).scalars()
            assert list(spans) == [MAX_SPAN, 10]
        stored = await stored_events(orch.db, step_id=step)
        assert [ev.data for ev in stored] == [ev.data for ev in mine]


async def test_finalizers_sharing_together_run_as_one_call_in_the_first_ones_turn() -> None:
    from orchestratord.eventlog import Finalizer, LogEvent, _finalize

    calls: list[object] = []

    def alone(name: str) -> Finalizer:
        async def run(target: object) -> list[LogEvent]:
            calls.append(name)
            return [LogEvent("r", None, None, "narration", name.encode())]

        return Finalizer(run)

    def grouped(together: object, item: str) -> Finalizer:
        return Finalizer(alone(item).run, together=together, item=item)  # type: ignore[arg-type]

    async def ends(target: object, items: list[str]) -> list[LogEvent]:
        calls.append(("ends", items))
        return [LogEvent("r", None, None, "narration", b"ends")]

    async def facts(target: object, items: list[str]) -> list[LogEvent]:
        calls.append(("facts", items))
        return []

    finalizers = [
        alone("a"),
        grouped(ends, "e1"),
        grouped(facts, "f1"),
        alone("b"),
        grouped(ends, "e2"),
        grouped(ends, "e3"),
    ]
    events = await _finalize(None, finalizers)  # type: ignore[arg-type]
    assert calls == ["a", ("ends", ["e1", "e2", "e3"]), "f1", "b"]  # a group of one runs alone
    assert [ev.data for ev in events] == [b"a", b"ends", b"f1", b"b"]


def test_the_append_statements_are_built_once_per_shape() -> None:
    """Each shape of the statements appending a batch is a Core expression built and
    compiled once (per run count on SQLite, per wake-up and what goes alongside on
    PostgreSQL), and its array parameters reach the driver as they are."""
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

    from orchestratord import eventlog
    from orchestratord.steps import ends

    assert eventlog._take_run_seqs(3) is eventlog._take_run_seqs(3)
    sql = eventlog._take_run_seqs(3).compiled(sqlite.dialect()).sql
    assert sql.startswith("UPDATE runs SET event_seq=") and sql.count("WHEN ?") == 3

    pg = asyncpg_dialect()  # type: ignore[no-untyped-call]
    for wake in (False, True):
        for alongside in (None, ends._ALONGSIDE):
            statement = eventlog._append(wake, alongside)
            assert statement is eventlog._append(wake, alongside)
            compiled = statement.compiled(pg)
            assert compiled.sql.startswith("WITH locked AS MATERIALIZED")
            assert "FOR NO KEY UPDATE" in compiled.sql
            assert ("pg_notify(" in compiled.sql) is wake
            keys = {key for key, _, _, _ in compiled.params}
            assert {"a_runs", "a_counts", *eventlog._ROW_KEYS} <= keys
    array = eventlog.PlainArray(sa.String)
    assert array.dialect_impl(pg).bind_processor(pg) is None
    assert str(sa.select(sa.bindparam("x", type_=array)).compile(dialect=pg)).startswith(
        "SELECT $1::VARCHAR[]"
    )
