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
from tests.helpers import make_run, submit, wait_status


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
    pair: tuple[Orchestrator, Orchestrator],
) -> None:
    a, b = pair
    assert b.wakeups is not None and b.wakeups.live
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
        await asyncio.sleep(0.2)  # b's follower is caught up and asleep
        step_id = (await submit(client, run_id, max_tokens=40)).json()["step_id"]
        await wait_status(client, step_id, "succeeded")
        await asyncio.wait_for(task, 20)  # without wake-ups: an hour
    text = b"".join(frames).decode()
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(42))  # started, 40 tokens, end: no gap, no duplicate
    assert b.wakeups.received >= 1

    # a step stream on b, resumed mid-way, also completes from the log
    chunks = [c async for c in follow_step(b, step_id, 20, cancel_on_disconnect=False)]
    ids = [int(line[4:]) for line in b"".join(chunks).decode().splitlines() if line[:4] == "id: "]
    assert ids == list(range(20, 42))


@pytest.mark.postgres
async def test_wakeups_come_back_after_the_connection_drops(
    pair: tuple[Orchestrator, Orchestrator],
) -> None:
    a, b = pair
    assert b.wakeups is not None
    conn = b.wakeups._conn
    await conn.close()  # as if the server dropped it
    for _ in range(100):
        if b.wakeups.live and b.wakeups._conn is not conn:
            break
        await asyncio.sleep(0.05)
    assert b.wakeups.live and b.wakeups._conn is not conn
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(orchestrator=a)), base_url="http://a"
    ) as client:
        run_id = await make_run(client)
        channel = b.hub.subscribe_run(run_id)
        try:
            pokes = channel.foreign
            r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "f", "data": 1})
            assert r.status_code == 201
            for _ in range(200):
                if channel.foreign > pokes:
                    break
                await asyncio.sleep(0.05)
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

    from orchestratord.db import prepared
    from orchestratord.eventlog import WAKE_CHANNEL, insert_events
    from orchestratord.streams.wakeups import asyncpg_dsn

    a, _ = pair
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(orchestrator=a)), base_url="http://a"
    ) as client:
        runs = sorted([await make_run(client), await make_run(client)])
    got: list[str] = []
    listener = await asyncpg.connect(asyncpg_dsn(a.settings.database_url))
    await listener.add_listener(WAKE_CHANNEL, lambda *args: got.append(str(args[3])))
    sql: list[str] = []
    real = prepared.run_on_asyncpg
    this = asyncio.current_task()

    async def traced(
        adapted: object, conn: object, text: str, params: object, **kw: object
    ) -> object:
        if asyncio.current_task() is this:  # not the dispatchers' looks at their queues
            sql.append(text.split()[0])
        return await real(adapted, conn, text, params, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(prepared, "run_on_asyncpg", traced)
    try:
        for batch_runs in (runs[:1], runs):
            got.clear()
            sql.clear()
            events = [LogEvent(r, None, None, "fact", b"{}") for r in batch_runs]
            async with a.db.write() as session:
                await insert_events(session, events)
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # a second one would have come by now
            assert got == [wake_payload(a.db.origin, events)]
            # the runs' rows locked in order, their cursors taken, the events inserted and the
            # wake-up sent: one statement
            assert sql == ["WITH"], sql
    finally:
        await listener.close()
