"""Claim rounds on PostgreSQL: other processes queue steps too, so a freed slot looks at the
queue, but at most once per ``poll_s`` while the last look found it empty (a busy process
would look once per step). A look is one read with no transaction (which lanes have a step
queued); a claim, a transaction of three round trips at least, runs only in those lanes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from orchestratord import dispatcher
from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import claim_queued, queued_lanes
from tests.conftest import make_settings
from tests.helpers import DispatcherWake, dispatcher_settled, make_run, submit, wait_status
from tests.pg import empty

pytestmark = pytest.mark.postgres


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The pool of every claim round the dispatchers run."""
    seen: list[str | None] = []
    claim = claim_queued

    async def counted(session: Any, *, pool_id: str | None, **kw: Any) -> Any:
        seen.append(pool_id)
        return await claim(session, pool_id=pool_id, **kw)

    monkeypatch.setattr(dispatcher, "claim_queued", counted)
    return seen


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[set[str | None]]:
    """What each look at the queue found (the lanes with a step queued)."""
    seen: list[set[str | None]] = []

    async def counted(target: Any) -> set[str | None]:
        seen.append(found := await queued_lanes(target))
        return found

    monkeypatch.setattr(dispatcher, "queued_lanes", counted)
    return seen


@pytest.fixture
async def service(pg_url: str) -> AsyncIterator[tuple[Orchestrator, httpx.AsyncClient]]:
    await empty(pg_url)
    orch = Orchestrator(make_settings(pg_url, dispatch={"poll_s": 60.0}, health_interval_s=3600.0))
    orch.dispatcher._wake = DispatcherWake()  # before its loop waits on it
    await orch.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield orch, c
    finally:
        await orch.stop()
        await empty(pg_url)


async def test_steps_that_end_leave_no_claim_round_within_poll_s(
    service: tuple[Orchestrator, httpx.AsyncClient],
    rounds: list[str | None],
    looks: list[set[str | None]],
) -> None:
    orch, c = service
    run_id = await make_run(c)
    step_id = (await submit(c, run_id, token="warm", max_tokens=2)).json()["step_id"]
    await wait_status(c, step_id, "succeeded")
    await dispatcher_settled(orch)
    rounds.clear()
    looks.clear()
    for i in range(5):
        r = await submit(c, run_id, token=f"t{i}", max_tokens=2)
        assert r.json()["status"] == "running"  # started with its submission
        await wait_status(c, r.json()["step_id"], "succeeded")
    await dispatcher_settled(orch)
    # the warm-up's round looked less than poll_s (60 s) ago and found the queue empty
    assert (looks, [p for p in rounds if p is not None]) == ([], [])
    # once poll_s has passed, a freed slot looks again (another process may have queued):
    # it finds nothing queued, and claims nothing
    orch.dispatcher._looked["local"] -= 120.0
    r = await submit(c, run_id, token="late", max_tokens=2)
    await wait_status(c, r.json()["step_id"], "succeeded")
    await dispatcher_settled(orch)
    assert (looks, [p for p in rounds if p is not None]) == ([set()], [])
    assert orch.dispatcher._looked["local"] > asyncio.get_running_loop().time() - 60.0


@asynccontextmanager
async def _step_queued_by_another_process(
    pg_url: str, poll_s: float
) -> AsyncIterator[tuple[Orchestrator, httpx.AsyncClient, str, dict[str, Any]]]:
    """Processes A and B on one database; B drains (queues what it is given) and has queued a
    step of a run: A, its client, the run and the step as B answered."""
    await empty(pg_url)
    settings = {"dispatch": {"poll_s": poll_s}, "health_interval_s": 3600.0}
    a = Orchestrator(make_settings(pg_url, **settings))
    b = Orchestrator(make_settings(pg_url, **settings))
    await a.start()
    await b.start()
    try:
        ta = httpx.ASGITransport(app=create_app(orchestrator=a))
        tb = httpx.ASGITransport(app=create_app(orchestrator=b))
        async with (
            httpx.AsyncClient(transport=ta, base_url="http://a") as ca,
            httpx.AsyncClient(transport=tb, base_url="http://b") as cb,
        ):
            run_id = await make_run(ca)
            b.dispatcher.pause()
            queued = (await submit(cb, run_id, token="from-b", max_tokens=2)).json()
            assert queued["status"] == "queued"
            yield a, ca, run_id, queued
    finally:
        await b.stop()
        await a.stop()
        await empty(pg_url)


async def test_a_busy_process_claims_a_step_another_process_queued(pg_url: str) -> None:
    """A keeps running steps of its own, so its dispatcher is kept awake; B's step is still
    claimed by A within a few polls."""
    async with _step_queued_by_another_process(pg_url, 0.2) as (_, ca, run_id, queued):
        busy = True

        async def keep_busy() -> None:
            i = 0
            while busy:
                r = await submit(ca, run_id, token=f"a{i}", max_tokens=2)
                await wait_status(ca, r.json()["step_id"], "succeeded")
                i += 1

        task = asyncio.create_task(keep_busy())
        try:
            step = await wait_status(ca, queued["step_id"], "succeeded")
        finally:
            busy = False
            await task
        assert step["status"] == "succeeded"


async def test_a_round_claims_only_in_lanes_where_a_step_is_queued(
    pg_url: str, rounds: list[str | None], looks: list[set[str | None]]
) -> None:
    """A round of every lane (as after a wake of them all) looks first: a step another
    process queued in the pool is claimed there; the control plane's lane, with nothing
    queued, runs no claim transaction."""
    async with _step_queued_by_another_process(pg_url, 60.0) as (a, ca, _, queued):
        rounds.clear()
        looks.clear()
        a.dispatcher.wake_all()
        step = await wait_status(ca, queued["step_id"], "succeeded")
        assert step["status"] == "succeeded"
        assert looks[0] == {"local"}, looks
        assert rounds[0] == "local" and None not in rounds, rounds
