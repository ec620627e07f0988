"""The statement traces of ``tests/helpers.py`` count the measured task's statements alone:
a dispatcher's look at its queue, run between two awaits of the measured work, is not one
of them (it once made a count of one commit's statements fail, 1 run in 2,468)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from orchestratord.db.models import Step
from orchestratord.db.prepared import Prepared
from orchestratord.runtime import Orchestrator
from tests.helpers import trace_asyncpg, trace_executions

# the dispatcher's look at its queues, the statement once counted among a commit's
_POOLS = Prepared(sa.select(Step.pool_id).distinct())
_STEPS = Prepared(sa.select(sa.func.count()).select_from(Step))


async def _interleaved(orch: Orchestrator, mine: sa.Executable | Prepared) -> None:
    """The measured task runs ``mine`` twice; between the two, and while its transaction is
    open, a task named "other" runs the dispatcher's look and ends."""
    other_ran = asyncio.Event()

    async def other() -> None:
        async with orch.db.read() as session:
            if isinstance(mine, Prepared):
                await _POOLS.rows(session, {})
            else:
                await session.execute(sa.text("SELECT DISTINCT steps.pool_id FROM steps"))
        other_ran.set()

    async with orch.db.read() as session:
        for i in range(2):
            if isinstance(mine, Prepared):
                await mine.rows(session, {})
            else:
                await session.execute(mine)
            if i == 0:
                task = asyncio.create_task(other(), name="other")
                await other_ran.wait()
                await task


async def test_the_asyncpg_trace_leaves_out_a_statement_another_task_runs_meanwhile(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    if orch.db.is_sqlite:
        pytest.skip("SQLite's hot statements run on its driver in-process, not on asyncpg")
    other = trace_asyncpg(monkeypatch, task="other")
    mine = trace_asyncpg(monkeypatch)
    await _interleaved(orch, _STEPS)
    assert [head for head, _ in mine] == ["SELECT count(*) AS"] * 2, mine
    assert [head for head, _ in other] == ["SELECT DISTINCT steps.pool_id"], other


async def test_the_execution_trace_leaves_out_a_statement_another_task_runs_meanwhile(
    orch: Orchestrator,
) -> None:
    with (
        trace_executions(orch.db.engine, task="other") as other,
        trace_executions(orch.db.engine) as mine,
    ):
        await _interleaved(orch, sa.text("SELECT count(*) FROM steps"))
    assert mine == ["SELECT count(*) FROM steps"] * 2, mine
    assert other == ["SELECT DISTINCT steps.pool_id FROM steps"], other
