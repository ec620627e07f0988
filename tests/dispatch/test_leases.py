"""Leases in one test process: a crashed process's steps are reaped, queued again when they
streamed nothing, ended WORKER_LOST with their committed text when they had; a process that
stalled past its lease lets go of what was taken over; a drain lets go at shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.db.models import Step
from orchestratord.dispatcher import Dispatcher
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from orchestratord.steps.running import ClaimedStep
from tests.conftest import make_settings
from tests.helpers import (
    follower_waits,
    make_run,
    read_stream,
    submit,
    tokens_published,
    wait_status,
)

LEASE = {"lease_s": 0.6}


def lease_settings(db_url: str, **dispatch: Any) -> Settings:
    return make_settings(
        db_url, sim={"tokens_per_s": 20.0}, dispatch={**LEASE, **dispatch}, instance="test-a"
    )


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[Orchestrator, httpx.AsyncClient]]:
    orch = Orchestrator(settings)
    await orch.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield orch, client
    finally:
        await orch.stop()


async def crash(orch: Orchestrator) -> None:
    """As kill -9 leaves it: nothing more written, no step ended, no lease renewed (what
    the writer had queued is committed: those are the events a client may have seen)."""
    task, orch.dispatcher._task = orch.dispatcher._task, None
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await orch.keeper.stop()
    for ex in list(orch.dispatcher.executions.values()):
        assert ex.task is not None
        ex.task.cancel()
    await asyncio.gather(
        *[ex.task for ex in orch.dispatcher.executions.values() if ex.task], return_exceptions=True
    )
    await orch.writer.stop()
    if orch.wakeups is not None:
        await orch.wakeups.stop()
    await orch.db.dispose()
    if orch.lock is not None:
        orch.lock.release()  # the process's death lets go of its SQLite file


async def gate(client: httpx.AsyncClient, run_id: str, expr: str, wait_ms: int) -> str:
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "gate_eval",
            "client_token": "g",
            "input": {"expr": expr, "wait_ms": wait_ms},
        },
    )
    assert r.status_code == 202, r.text
    return str(r.json()["step_id"])


def cursors(events: list[Any]) -> list[str | None]:
    return [e.id for e in events]


async def test_a_step_that_streamed_nothing_is_queued_again_and_runs(db_url: str) -> None:
    settings = lease_settings(db_url)
    async with serving(settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, 'facts.exists(f, f.type == "go")', 60_000)
        await wait_status(client, step_id, "running")
        await crash(first)
    async with serving(settings) as (second, client):
        await client.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["status"] == "succeeded" and step["output"]["result"] is True
        events = await read_stream(client, f"/v1/steps/{step_id}/stream")
        assert cursors(events) == [str(i) for i in range(len(events))]  # no gap, no repeat
        kinds = [e.event for e in events]
        assert kinds[0] == "started" and kinds.count("started") == 1
        texts = [e.data["text"] for e in events if e.event == "narration" and e.data]
        assert any("queued again for execution 2 of 3" in t for t in texts), texts
        assert any(t.startswith("started again") for t in texts), texts
        assert kinds[-1] == "end"
        assert second.keeper.requeued == 1


async def test_a_step_that_streamed_tokens_ends_worker_lost_keeping_them(db_url: str) -> None:
    settings = lease_settings(db_url)
    async with serving(settings) as (first, client):
        run_id = await make_run(client, budgets={"max_tokens_out": 5000})
        step_id = (await submit(client, run_id, max_tokens=1000)).json()["step_id"]
        await tokens_published(first, step_id, 3)
        await crash(first)
    async with serving(settings) as (_, client):
        step = await wait_status(client, step_id, "failed")
        assert step["error"]["code"] == "WORKER_LOST" and step["error"]["retriable"] is True
        assert "had streamed tokens" in step["error"]["message"]
        events = await read_stream(client, f"/v1/steps/{step_id}/stream")
        assert cursors(events) == [str(i) for i in range(len(events))]
        tokens = [e.data for e in events if e.event == "token" and e.data]
        assert len(tokens) >= 3
        # the committed text is its output, and it is charged: prompt and tokens out
        assert step["output"]["text"] == "".join(t["t"] for t in tokens)
        assert step["output"]["token_ids"] == [t["token_id"] for t in tokens]
        assert step["usage"]["tokens_out"] == len(tokens)
        assert step["usage"]["tokens_in"] > 0
        assert events[-1].event == "error" and events[-1].data is not None
        assert events[-1].data["details"]["tokens_out"] == len(tokens)
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        assert run["reserved"]["tokens_out"] == 0  # its reservation went back
        assert run["reserved"]["tokens_in"] == 0
        assert run["usage"]["tokens_out"] == len(tokens)


async def test_a_step_runs_at_most_max_attempts_times(db_url: str) -> None:
    settings = lease_settings(db_url, max_attempts=1)
    async with serving(settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, "false", 60_000)
        await wait_status(client, step_id, "running")
        await crash(first)
    async with serving(settings) as (_, client):
        step = await wait_status(client, step_id, "failed")
        assert step["error"]["code"] == "WORKER_LOST"
        assert "it had run 1 times" in step["error"]["message"]


async def test_a_tool_call_is_never_run_twice(db_url: str) -> None:
    from test_harness.fake_tools import FakeToolServer
    from test_harness.servers import serve_app
    from tests.steps.kinds.test_tool_call import call, http_tool, run_with

    settings = lease_settings(db_url)
    server = FakeToolServer()
    async with serve_app(server.app) as url:
        async with serving(settings) as (first, client):
            run_id = await run_with(client, http_tool("t", f"{url}/slow?ms=60000"))
            r = await call(client, run_id, "t", {})
            assert r.status_code == 202, r.text
            step_id = r.json()["step_id"]
            await wait_status(client, step_id, "running")
            await crash(first)
        async with serving(settings) as (_, client):
            step = await wait_status(client, step_id, "failed")
            assert step["error"]["code"] == "WORKER_LOST"
            assert "does not run twice" in step["error"]["message"]


@pytest.fixture
def pg_only(db_url: str) -> str:
    if db_url.startswith("sqlite"):
        pytest.skip("several processes on one database: PostgreSQL")
    return db_url


def _started_elsewhere(
    here: Orchestrator, step_id: str, monkeypatch: pytest.MonkeyPatch
) -> asyncio.Event:
    """Set when a dispatcher other than ``here``'s starts executing ``step_id``."""
    started = asyncio.Event()
    real = Dispatcher._start

    def start(self: Dispatcher, claimed: list[ClaimedStep]) -> None:
        real(self, claimed)
        if self is not here.dispatcher and step_id in self.executions:
            started.set()

    monkeypatch.setattr(Dispatcher, "_start", start)
    return started


async def test_an_expired_lease_is_taken_over_and_its_stalled_holder_lets_go(
    pg_only: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that stops renewing (stalled, not dead) loses the step to another process;
    when it wakes, it abandons the step without writing into its log."""
    first_settings = lease_settings(pg_only)
    second_settings = lease_settings(pg_only).model_copy(update={"instance": "test-b"})
    async with serving(first_settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, 'facts.exists(f, f.type == "go")', 60_000)
        await wait_status(client, step_id, "running")
        await first.keeper.stop()  # stalled: no renewal, no claim from here on
        first.dispatcher.pause()
        started = _started_elsewhere(first, step_id, monkeypatch)
        async with serving(second_settings) as (second, client_b):
            await asyncio.wait_for(started.wait(), 10)
            assert step_id in second.dispatcher.executions  # reaped, queued, claimed by B
            await first.keeper.renew()  # the stalled holder wakes up
            assert step_id not in first.dispatcher.executions or (
                first.dispatcher.executions[step_id].abandoned
            )
            await client_b.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
            step = await wait_status(client_b, step_id, "succeeded", "failed")
            assert step["status"] == "succeeded"
            events = await read_stream(client_b, f"/v1/steps/{step_id}/stream")
            assert cursors(events) == [str(i) for i in range(len(events))]
            assert [e.event for e in events].count("end") == 1


async def test_drain_lets_go_of_running_steps_and_ends_streams(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = lease_settings(db_url)
    async with serving(settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, 'facts.exists(f, f.type == "go")', 60_000)
        await wait_status(client, step_id, "running")

        async def follow() -> list[Any]:
            return await read_stream(client, f"/v1/steps/{step_id}/stream")

        waits = follower_waits(first, monkeypatch)
        follower = asyncio.create_task(follow())
        await asyncio.wait_for(waits.wait(), 10)  # it read what there is, and waits for more
        await asyncio.wait_for(first.drain(0.2), 10)
        events = await asyncio.wait_for(follower, 10)  # the stream ended, not the step
        assert events[0].event == "started" and events[-1].event not in ("end", "error")
        step = (await client.get(f"/v1/steps/{step_id}")).json()
        if db_url.startswith("sqlite"):
            assert step["status"] == "queued"  # taken over by this process's next start
        else:
            assert step["status"] == "running"  # its lease expired: a peer reaps it
    async with serving(settings) as (_, client):
        await client.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["status"] == "succeeded"
        resumed = await read_stream(
            client, f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": events[-1].id}
        )
        assert resumed[0].id == str(int(events[-1].id) + 1)
        assert resumed[-1].event == "end"


async def test_a_restart_reaps_what_its_earlier_incarnation_held_at_once(pg_only: str) -> None:
    """Same instance name, new process: its earlier incarnation's steps are reaped at start,
    long before their lease (60 s here) would expire."""
    settings = lease_settings(pg_only, lease_s=60.0)
    async with serving(settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, 'facts.exists(f, f.type == "go")', 60_000)
        await wait_status(client, step_id, "running")
        await crash(first)
    # a renewal happens every 20 s: an incarnation silent for 40 s is gone; the test moves
    # the lease back instead of waiting
    import sqlalchemy as sa

    from orchestratord.db.engine import Database
    from orchestratord.db.models import Step

    db = Database(pg_only)
    async with db.write() as session:
        await session.execute(
            sa.update(Step)
            .where(Step.step_id == step_id)
            .values(lease_expires_at=sa.func.now() + sa.text("interval '15 seconds'"))
        )
    await db.dispose()
    async with serving(settings) as (second, client):
        assert second.keeper.reaped == 1 and second.keeper.requeued == 1  # at start
        await client.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["status"] == "succeeded"


async def test_a_sibling_of_the_same_name_that_renews_is_left_alone(pg_only: str) -> None:
    settings = lease_settings(pg_only, lease_s=60.0)
    async with serving(settings) as (first, client):
        run_id = await make_run(client)
        step_id = await gate(client, run_id, 'facts.exists(f, f.type == "go")', 60_000)
        await wait_status(client, step_id, "running")
        async with serving(settings) as (second, _):
            assert second.keeper.reaped == 0  # its lease is fresh: a live sibling
        await client.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["status"] == "succeeded"
        assert first.keeper.reaped == 0


async def test_a_step_leased_here_but_not_run_here_is_left_to_expire(db_url: str) -> None:
    """A running step leased to this process that no execution here holds (its submission
    committed as its request was cancelled) is not renewed: its lease runs out, the reaper
    queues it again, and it runs."""
    async with serving(lease_settings(db_url)) as (orch, client):
        run_id = await make_run(client)
        orch.dispatcher.pause()
        step_id = (await submit(client, run_id, token="orphan", max_tokens=2)).json()["step_id"]
        async with orch.db.write() as session:  # as its submission would have left it
            step = await session.get(Step, step_id)
            assert step is not None and step.status == "queued"
            step.status = "running"
            orch.leases.grant(step)
        assert step_id not in orch.dispatcher.executions
        orch.dispatcher.paused = False
        done = await wait_status(client, step_id, "succeeded", "failed")
        assert done["status"] == "succeeded"
        assert orch.keeper.requeued == 1
