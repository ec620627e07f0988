"""A submission's statements: each costs a round trip and its share of the request's CPU,
so the rules share what they read. An engine step that starts with its submission runs four:
the run with the step its token made (if any), whether a step waits ahead in its pool, the
reservation, the insert; it takes no admission lock (it never waits in the queue) and, on
PostgreSQL, no savepoint (its insert gives way to a concurrent submission of its token)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from orchestratord.db import prepared
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run, submit, wait_status


class Statements:
    """The statements of the next transaction that commits."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.open = False
        self.savepoints = 0

    def start(self) -> None:
        self.seen, self.open, self.savepoints = [], True, 0

    def statement(self, _c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        self.traced(statement)

    def traced(self, statement: str) -> None:
        text = " ".join(statement.split())
        if self.open and text.split(" ", 1)[0] in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            self.seen.append(text[:70])
        elif self.open and text.startswith("SAVEPOINT"):
            self.savepoints += 1
        elif text == "COMMIT":
            self.commit(None)

    def commit(self, _conn: Any) -> None:
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
    # through SQLAlchemy's execution
    real = prepared.run_on_asyncpg

    async def traced(adapted: Any, conn: Any, sql: str, params: Any, **kw: Any) -> Any:
        counter.traced(sql)
        return await real(adapted, conn, sql, params, **kw)

    monkeypatch.setattr(prepared, "run_on_asyncpg", traced)
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
    statements.start()
    r = await submit(client, run_id, token="a", max_tokens=2)
    assert r.status_code == 202 and r.json()["status"] == "running", r.text
    assert len(statements.seen) == 4, statements.seen
    assert statements.savepoints == 0
    assert statements.seen[0].startswith("SELECT runs.run_id")
    assert statements.seen[-1].startswith("INSERT INTO steps")
    await wait_status(client, r.json()["step_id"], "succeeded")


async def test_a_repeated_token_answers_with_its_first_step(
    orch: Orchestrator, client: httpx.AsyncClient, statements: Statements
) -> None:
    run_id = await make_run(client)
    first = await submit(client, run_id, token="same", max_tokens=2)
    await wait_status(client, first.json()["step_id"], "succeeded")
    statements.start()
    again = await submit(client, run_id, token="same", max_tokens=2)
    assert again.status_code == 200 and again.json()["step_id"] == first.json()["step_id"]
    # the run with the token's step id, then that step: nothing reserved or inserted
    assert [s.split(" ", 1)[0] for s in statements.seen] == ["SELECT", "SELECT"], statements.seen
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

    @asynccontextmanager
    async def spying(*, urgent: bool = False) -> AsyncIterator[Any]:
        async with real(urgent=urgent) as on:
            if not urgent:  # the event writer's are urgent
                seen.append(on)
            yield on

    monkeypatch.setattr(orch.db, "write_tx", spying)
    r = await submit(client, run_id, token="n", max_tokens=2)
    assert r.status_code == 202, r.text
    assert len(seen) == 1 and seen[0].joined is None
    await wait_status(client, r.json()["step_id"], "succeeded")
