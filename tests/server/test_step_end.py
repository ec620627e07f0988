"""A running step's end is one guarded statement (with its run's settlement, on
PostgreSQL): a step that is no longer running (ended elsewhere: cancelled, reaped) cannot be
ended again, and its run's account is untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import sqlalchemy as sa

from contracts.events import EndEvent
from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import Target
from orchestratord.runtime import Orchestrator
from orchestratord.steps.ending import Ending
from orchestratord.steps.transition import ending_finalizer
from tests.helpers import make_run, submit, wait_status


@asynccontextmanager
async def _transaction(orch: Orchestrator, on: str) -> AsyncIterator[Target]:
    """The finalizer's transaction: a session's, or (SQLite) the driver's alone."""
    if on == "session":
        async with orch.db.write() as session:
            yield session
        return
    if not orch.db.on_driver:
        pytest.skip("PostgreSQL ends steps in sessions")
    async with orch.db.driver_write() as tx:
        yield tx


def _ending() -> Ending:
    event = EndEvent(stop_reason="length", tokens_in=1, tokens_out=1, provenance=None)
    return Ending(StepStatus.SUCCEEDED, event, {"text": "x"}, tokens_in=1, tokens_out=1)


@pytest.mark.parametrize("on", ["session", "driver"])
async def test_an_ended_step_is_not_ended_again(
    orch: Orchestrator, client: httpx.AsyncClient, on: str
) -> None:
    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=2)).json()["step_id"]
    before = await wait_status(client, step_id, "succeeded")
    run_before = (await client.get(f"/v1/runs/{run_id}")).json()
    with pytest.raises(Conflict, match="succeeded, not running"):
        async with _transaction(orch, on) as target:
            await ending_finalizer(step_id, _ending()).run(target)
    assert (await client.get(f"/v1/steps/{step_id}")).json() == before
    assert (await client.get(f"/v1/runs/{run_id}")).json()["usage"] == run_before["usage"]


@pytest.mark.parametrize("on", ["session", "driver"])
async def test_ending_a_step_that_does_not_exist_names_it(orch: Orchestrator, on: str) -> None:
    with pytest.raises(NotFound):
        async with _transaction(orch, on) as target:
            await ending_finalizer("step_nope", _ending()).run(target)


async def test_a_step_ends_and_settles_in_one_statement_on_postgresql(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row and its run's account, one round trip (two on SQLite, in-process)."""
    if orch.db.is_sqlite:
        pytest.skip("SQLite runs no UPDATE in a WITH: two statements, no round trip")
    from orchestratord.db import prepared

    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=2)).json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    usage = (await client.get(f"/v1/runs/{run_id}")).json()["usage"]
    async with orch.db.write() as session:  # running again, holding 3 output tokens
        await session.execute(
            sa.update(Step)
            .where(Step.step_id == step_id)
            .values(status="running", tokens_out_reserved=3)
        )
        await session.execute(
            sa.update(Run).where(Run.run_id == run_id).values(tokens_out_reserved=3)
        )
    sql: list[str] = []
    real = prepared.run_on_asyncpg

    async def traced(adapted: object, conn: object, text: str, *a: object, **kw: object) -> object:
        sql.append(" ".join(text.split()[:3]))
        return await real(adapted, conn, text, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(prepared, "run_on_asyncpg", traced)
    async with orch.db.driver_write() as target:
        assert await ending_finalizer(step_id, _ending()).run(target) == []
    assert sql == ["WITH ended AS"], sql
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == usage["tokens_out"] + 1
    assert run["reserved"]["tokens_out"] == 0
    assert (await client.get(f"/v1/steps/{step_id}")).json()["status"] == "succeeded"
