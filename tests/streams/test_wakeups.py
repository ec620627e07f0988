"""Followers on one process see what another process commits, woken by NOTIFY, not polling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.api.app import create_app
from orchestratord.db.engine import Database
from orchestratord.eventlog import LogEvent, wake_payload
from orchestratord.runtime import Orchestrator
from orchestratord.streams.sse import follow_run, follow_step
from tests.conftest import TABLES, make_settings
from tests.helpers import follower_waits, make_run, submit, trace_asyncpg, wait_status

_FENCE = "fence"  # a payload no process sends: no process's origin, and it names no key


def test_wake_payload_names_runs_and_steps_and_falls_back_to_everything() -> None:
    events = [
        LogEvent("run_a", "step_1", 0, "started", b"{}"),
        LogEvent("run_a", "step_1", 1, "token", b"{}"),
        LogEvent("run_b", None, None, "fact", b"{}"),
    ]
    assert wake_payload("me", events) == "me r:run_a r:run_b s:step_1"
    many = [LogEvent(f"run_{i:05d}", None, None, "fact", b"{}") for i in range(1000)]
    assert wake_payload("me", many) == "me *"


@pytest.fixture
async def pair(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[Orchestrator, Orchestrator]]:
    """Two services on one PostgreSQL database; the second never polls (an hour)."""
    del tmp_path
    await _truncate(pg_url)
    a = Orchestrator(make_settings(pg_url))
    b = Orchestrator(make_settings(pg_url, stream={"poll_s": 3600.0}))
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await b.stop()
        await a.stop()
        await _truncate(pg_url)


async def _truncate(url: str) -> None:
    db = Database(url)
    async with db.engine.begin() as conn:
        await conn.execute(sa.text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    await db.dispose()


@pytest.mark.postgres
async def test_a_follower_on_one_process_streams_a_step_run_by_another(
    pair: tuple[Orchestrator, Orchestrator], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    assert b.wakeups is not None and b.wakeups.live
    asleep = follower_waits(b, monkeypatch)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(orchestrator=a)), base_url="http://a"
    ) as client:
        run_id = await make_run(client)
        # b follows the run before anything happens in it
        frames: list[bytes] = []

        async def follow() -> None:
            async for chunk in follow_run(b, run_id, 0):
                frames.append(chunk)
                if b"event: end" in chunk:
                    return

        task = asyncio.create_task(follow())
        await asyncio.wait_for(asleep.wait(), 20)  # b's follower is caught up and asleep
        step_id = (await submit(client, run_id, max_tokens=40)).json()["step_id"]
        await wait_status(client, step_id, "succeeded")
        await asyncio.wait_for(task, 20)  # without wake-ups: an hour
    text = b"".join(frames).decode()
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(43))  # started, its placement, 40 tokens, end: no gap, no repeat
    assert b.wakeups.received >= 1

    # a step stream on b, resumed mid-way, also completes from the log
    chunks = [c async for c in follow_step(b, step_id, 20, cancel_on_disconnect=False)]
    ids = [int(line[4:]) for line in b"".join(chunks).decode().splitlines() if line[:4] == "id: "]
    assert ids == list(range(20, 43))


@pytest.mark.postgres
async def test_wakeups_come_back_after_the_connection_drops(
    pair: tuple[Orchestrator, Orchestrator],
) -> None:
    a, b = pair
    assert b.wakeups is not None
    conn = b.wakeups._conn
    probe = b.hub.subscribe_run("run_probe")  # poked by the reconnection (what it missed)
    try:
        await conn.close()  # as if the server dropped it
        assert await probe.wait(0, timeout=20)  # False: never reconnected
    finally:
        b.hub.unsubscribe_run("run_probe")
    assert b.wakeups.live and b.wakeups._conn is not conn
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(orchestrator=a)), base_url="http://a"
    ) as client:
        run_id = await make_run(client)
        channel = b.hub.subscribe_run(run_id)
        try:
            pokes = channel.foreign
            # waiting before the fact is posted: its wake-up may arrive before the response
            woken = asyncio.create_task(channel.wait(0, timeout=20))
            r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "f", "data": 1})
            assert r.status_code == 201
            assert await woken  # False: no wake-up came
            assert channel.foreign > pokes
        finally:
            b.hub.unsubscribe_run(run_id)


@pytest.mark.postgres
async def test_one_notification_per_commit_sent_by_the_cursor_update(
    pair: tuple[Orchestrator, Orchestrator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake-up rides on the statement that appends the events (no round trip of its own);
    with several runs it runs once per run and PostgreSQL delivers it once."""
    import asyncpg

    from orchestratord.eventlog import WAKE_CHANNEL, insert_events
    from orchestratord.streams.wakeups import asyncpg_dsn

    a, _ = pair
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(orchestrator=a)), base_url="http://a"
    ) as client:
        runs = sorted([await make_run(client), await make_run(client)])
    got: list[str] = []
    fenced = asyncio.Event()

    def received(*args: object) -> None:
        if args[3] == _FENCE:
            fenced.set()
        else:
            got.append(str(args[3]))

    listener = await asyncpg.connect(asyncpg_dsn(a.settings.database_url))
    await listener.add_listener(WAKE_CHANNEL, received)
    sql = trace_asyncpg(monkeypatch)  # this task's: not the dispatchers' looks at their queues
    try:
        for batch_runs in (runs[:1], runs):
            got.clear()
            sql.clear()
            fenced.clear()
            events = [LogEvent(r, None, None, "fact", b"{}") for r in batch_runs]
            async with a.db.write() as session:
                await insert_events(session, events)
            # notifications arrive in the order their transactions committed: once a fence
            # sent after the commit is here, every notification of the commit is too
            await listener.execute("SELECT pg_notify($1, $2)", WAKE_CHANNEL, _FENCE)
            await asyncio.wait_for(fenced.wait(), 20)
            assert got == [wake_payload(a.db.origin, events)]
            # the runs' rows locked in order, their cursors taken, the events inserted and the
            # wake-up sent: one statement
            assert [head.split()[0] for head, _ in sql] == ["WITH"], sql
    finally:
        await listener.close()
