"""A submission's statements: each costs a round trip and its share of the request's CPU,
so the rules share what they read. An engine step that starts with its submission runs four:
the run with the step its token made (if any), whether a step waits ahead in its pool, the
reservation, the insert; it takes no admission lock (it never waits in the queue) and no
savepoint. On PostgreSQL that is two round trips in all: the run read on its own, then the
pool's queue, the reservation and the insert as one statement that commits by itself (no
BEGIN, no COMMIT); and one only for a run the process has read before (``runs/kept.py``):
the statement checks what a read would have (the run's status, its budget, the token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from orchestrator_core.budgets import Ledger
from orchestratord.db import engine as db_engine
from orchestratord.db import prepared
from orchestratord.db.models import Run, Step
from orchestratord.runtime import Orchestrator
from orchestratord.steps.submission import context
from tests.helpers import make_run, measured_task, submit, wait_status


class Statements:
    """The statements of the next transaction that commits, run by the task that started
    counting (the request's: the ASGI transport runs the app in the caller's task), not by
    the dispatcher's or the event writer's meanwhile."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.open = False
        self.savepoints = 0
        self.mine: Callable[[], bool] = lambda: False

    def start(self) -> None:
        self.seen, self.open, self.savepoints = [], True, 0
        self.mine = measured_task()

    @property
    def counting(self) -> bool:
        return self.open and self.mine()

    def statement(self, _c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        self.traced(statement)

    def traced(self, statement: str) -> None:
        if not self.counting:
            return
        text = " ".join(statement.split())
        if text.split(" ", 1)[0] in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH"):
            self.seen.append(text[:70])
        elif text.startswith("SAVEPOINT"):
            self.savepoints += 1
        elif text == "COMMIT":
            self.commit(None)

    def commit(self, _conn: Any) -> None:
        if self.counting:
            self.open = False


@pytest.fixture
def statements(orch: Orchestrator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    counter = Statements()
    engine = orch.db.engine.sync_engine
    if orch.db.is_sqlite:
        # SQLite's writes run on the process's one writer connection, the hot statements on
        # its driver directly (db/prepared.py): the driver's trace sees every statement
        writer = orch.db._writer_connection()
        writer.set_trace_callback(counter.traced)
        try:
            yield counter
        finally:
            writer.set_trace_callback(None)
        return
    # PostgreSQL: the hot statements run on asyncpg directly (db/prepared.py), the others
    # through SQLAlchemy's execution; their BEGIN and COMMIT are round trips of their own
    real, real_commit = prepared.run_on_asyncpg, prepared.commit_on_asyncpg

    async def traced(adapted: Any, conn: Any, sql: str, params: Any, **kw: Any) -> Any:
        if counter.counting and kw.get("begin", True) and adapted._transaction is None:
            counter.seen.append("BEGIN")
        counter.traced(sql)
        return await real(adapted, conn, sql, params, **kw)

    async def committed(adapted: Any, conn: Any) -> None:
        if counter.counting and adapted._transaction is not None:
            counter.seen.append("COMMIT")
        await real_commit(adapted, conn)

    monkeypatch.setattr(prepared, "run_on_asyncpg", traced)
    monkeypatch.setattr(db_engine, "commit_on_asyncpg", committed)
    event.listen(engine, "before_cursor_execute", counter.statement)
    event.listen(engine, "commit", counter.commit)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter.statement)
        event.remove(engine, "commit", counter.commit)


async def test_an_engine_step_is_submitted_in_four_statements(
    orch: Orchestrator, client: httpx.AsyncClient, statements: Statements
) -> None:
    run_id = await make_run(client)
    await wait_status(
        client, (await submit(client, run_id, token="w")).json()["step_id"], "succeeded"
    )
    orch.submit_context.runs.drop(run_id)  # as a process that has not read it
    statements.start()
    r = await submit(client, run_id, token="a", max_tokens=2)
    assert r.status_code == 202 and r.json()["status"] == "running", r.text
    seen = statements.seen
    assert statements.savepoints == 0
    assert seen[0].startswith("SELECT runs.run_id"), seen
    if orch.db.is_sqlite:
        assert len(seen) == 4, seen
        assert seen[-1].startswith("INSERT INTO steps")
    else:  # two round trips: the last one checks the pool's queue and commits the step
        assert len(seen) == 2, seen
        assert seen[1].startswith(ONE_STATEMENT), seen
    await wait_status(client, r.json()["step_id"], "succeeded")
    async with orch.db.read() as session:  # what was reserved, and where the step stands
        run = await session.get(Run, run_id)
        step = await session.get(Step, r.json()["step_id"])
    assert run is not None and step is not None
    assert (step.position, run.step_count) == (1, 2)
    assert step.tokens_out_reserved == 2 and run.tokens_out_reserved == 0  # settled
    assert (step.status, step.attempts, step.replica_id) == ("succeeded", 1, "r0")


ONE_STATEMENT = "WITH ahead AS (SELECT EXISTS"


async def test_a_run_read_before_is_not_read_again(
    orch: Orchestrator, client: httpx.AsyncClient, statements: Statements
) -> None:
    """PostgreSQL: the run as the process kept it; the one statement stores the step."""
    if orch.db.is_sqlite:
        pytest.skip("SQLite reads the run in-process: no round trip to save")
    run_id = await make_run(client, budgets={"max_tokens_out": 100})
    first = await submit(client, run_id, token="w", max_tokens=2)
    await wait_status(client, first.json()["step_id"], "succeeded")
    statements.start()
    r = await submit(client, run_id, token="a", max_tokens=2)
    assert r.status_code == 202 and r.json()["status"] == "running", r.text
    assert statements.seen == [statements.seen[0]] and statements.seen[0].startswith(
        ONE_STATEMENT
    ), statements.seen
    assert r.headers["X-Budget-Tokens-Remaining"] == "96"  # 2 used, 2 held: the fresh ledger
    await wait_status(client, r.json()["step_id"], "succeeded")
    async with orch.db.read() as session:
        run = await session.get(Run, run_id)
        step = await session.get(Step, r.json()["step_id"])
    assert run is not None and step is not None
    assert (step.position, run.step_count, run.tokens_out_used) == (1, 2, 4)


async def test_a_repeated_token_answers_with_its_first_step(
    orch: Orchestrator, client: httpx.AsyncClient, statements: Statements
) -> None:
    run_id = await make_run(client)
    first = await submit(client, run_id, token="same", max_tokens=2)
    await wait_status(client, first.json()["step_id"], "succeeded")
    statements.start()
    again = await submit(client, run_id, token="same", max_tokens=2)
    assert again.status_code == 200 and again.json()["step_id"] == first.json()["step_id"]
    # the run with the token's step id, then that step: nothing reserved or inserted (on
    # PostgreSQL the kept run's statement first, which finds the token and writes nothing)
    kept = [] if orch.db.is_sqlite else ["WITH"]
    assert [s.split(" ", 1)[0] for s in statements.seen] == [*kept, "SELECT", "SELECT"], (
        statements.seen
    )
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 1 and run["reserved"]["tokens_out"] == 0
    different = await submit(client, run_id, token="same", max_tokens=3)
    assert different.status_code == 409, different.text
    assert different.json()["details"]["step_id"] == first.json()["step_id"]


async def test_a_submission_on_sqlite_opens_no_session(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its statements are prepared ones: its transaction is the driver's alone."""
    if not orch.db.on_driver:
        pytest.skip("PostgreSQL submits in a session")
    run_id = await make_run(client)
    seen: list[Any] = []
    real = orch.db.write_tx
    submitting = asyncio.current_task()  # the in-process client runs the request in it

    @asynccontextmanager
    async def spying(*, urgent: bool = False) -> AsyncIterator[Any]:
        async with real(urgent=urgent) as on:
            # the submission's own: not the event writer's (urgent), nor a dispatcher's look
            # at its queues, which may run at the same time
            if not urgent and asyncio.current_task() is submitting:
                seen.append(on)
            yield on

    monkeypatch.setattr(orch.db, "write_tx", spying)
    r = await submit(client, run_id, token="n", max_tokens=2)
    assert r.status_code == 202, r.text
    assert len(seen) == 1 and seen[0].joined is None
    await wait_status(client, r.json()["step_id"], "succeeded")


async def test_a_submission_planned_on_a_stale_ledger_reads_it_again(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reservation re-checks the run's limits in the database: a submission that planned
    on a ledger spent since (read before another step's reservation) writes nothing, reads
    the ledger again and is refused; the slot it took goes back."""
    run_id = await make_run(client, budgets={"max_tokens_out": 2})
    spent = await submit(client, run_id, token="spent", max_tokens=2)
    await wait_status(client, spent.json()["step_id"], "succeeded")
    free = orch.pools.pools["local"].free_slots
    monkeypatch.setattr(context, "ledger_of", lambda _run: Ledger(0, 0, 0.0, 0, 0, 0.0))
    late = await submit(client, run_id, token="late", max_tokens=2)
    assert late.status_code == 409 and late.json()["code"] == "BUDGET_EXCEEDED", late.text
    assert orch.pools.pools["local"].free_slots == free
    steps = (await client.get(f"/v1/runs/{run_id}/steps")).json()
    assert [s["step_id"] for s in steps] == [spent.json()["step_id"]]
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 1 and run["reserved"]["tokens_out"] == 0
