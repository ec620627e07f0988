"""Hot statements run on the driver itself (``db/prepared.py``: SQLite's inline connection,
asyncpg under the session): they must mean what the session would have made of them."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.db.engine import Database
from orchestratord.db.models import Flow, Run, Ts
from orchestratord.db.prepared import (
    Prepared,
    _PgTx,
    can_run_alone,
    detached,
    driver_sql,
    sqlite_driver,
)
from orchestratord.tx import Tx
from tests.conftest import make_settings
from tests.helpers import until

_RUNS = cast(sa.Table, Run.__table__)
_RUN_BY_ID = Prepared(sa.select(*_RUNS.columns).where(_RUNS.c.run_id == sa.bindparam("id")))
_RUNNING_BY_ID = Prepared(  # a literal of the statement besides the caller's parameter
    sa.select(_RUNS.c.run_id).where(
        _RUNS.c.run_id == sa.bindparam("id"), _RUNS.c.status == "running"
    )
)
_TOUCH = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("id"))
    .values(updated_at=sa.bindparam("now"), budgets=sa.bindparam("budgets"))
    .returning(_RUNS.c.updated_at, _RUNS.c.budgets, _RUNS.c.cancel_on_disconnect)
)
_SET_STATUS = Prepared(
    _RUNS.update().where(_RUNS.c.run_id == sa.bindparam("id")).values(status=sa.bindparam("s"))
)


def _run(run_id: str, **overrides: Any) -> Run:
    now = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    fields: dict[str, Any] = dict(
        run_id=run_id,
        flow_id="flow_p",
        mode="record",
        seed=7,
        status="running",
        budgets={"max_tokens_out": 5, "nested": {"a": [1, 2]}},
        policy={},
        pool_policy={"pool": "p"},
        fs_policy={},
        cancel_on_disconnect=True,
        price_table="2026-01-01",
        policy_hash="sha256:p",
        created_at=now,
        updated_at=now,
    )
    fields.update(overrides)
    return Run(**fields)


async def _statuses(db: Database) -> dict[str, str]:
    async with db.read() as session:
        return {r.run_id: r.status for r in (await session.execute(sa.select(Run))).scalars()}


async def _both_or_neither(db: Database, failed: bool, *run_ids: str) -> None:
    """The runs were all set cancelling in one transaction: all kept, or none if it failed."""
    expected = "running" if failed else "cancelling"
    assert await _statuses(db) == dict.fromkeys(run_ids, expected)


async def _seed(db: Database, *runs: Run) -> None:
    async with db.write() as session:
        session.add(
            Flow(
                flow_id="flow_p",
                hash="sha256:flow_p",
                ast={"p": 1},
                tools=[],
                config={},
                labels={},
                created_at=datetime.now(UTC),
            )
        )
        await session.flush()
        session.add_all(runs)


async def test_rows_read_as_the_session_reads_them(db: Database) -> None:
    await _seed(db, _run("run_a"))
    async with db.read() as session:
        prepared = await _RUN_BY_ID.first(session, {"id": "run_a"})
        through_session = (
            await session.execute(sa.select(*_RUNS.columns).where(_RUNS.c.run_id == "run_a"))
        ).one()
    assert prepared == tuple(through_session)
    run = detached(Run, dict(zip(_RUNS.columns.keys(), prepared, strict=True)))
    assert sa.inspect(run).detached
    assert run.budgets == {"max_tokens_out": 5, "nested": {"a": [1, 2]}}
    assert run.created_at == datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert run.cancel_on_disconnect is True


async def test_parameters_are_converted_and_results_returned(db: Database) -> None:
    await _seed(db, _run("run_b"))
    later = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    async with db.write() as session:
        rows = await _TOUCH.rows(session, {"id": "run_b", "now": later, "budgets": {"x": True}})
    assert rows == [(later, {"x": True}, True)]
    async with db.read() as session:
        run = await session.get(Run, "run_b")
    assert run is not None and run.updated_at == later and run.budgets == {"x": True}


async def test_literals_of_the_statement_are_bound(db: Database) -> None:
    await _seed(db, _run("run_c"), _run("run_d", status="completed"))
    async with db.read() as session:
        assert await _RUNNING_BY_ID.rows(session, {"id": "run_c"}) == [("run_c",)]
        assert await _RUNNING_BY_ID.rows(session, {"id": "run_d"}) == []


async def test_a_statement_without_rows_returns_none_and_its_write_commits(db: Database) -> None:
    await _seed(db, _run("run_e"))
    async with db.write() as session:
        assert await _SET_STATUS.rows(session, {"id": "run_e", "s": "cancelling"}) == []
    async with db.read() as session:
        assert (await session.get(Run, "run_e")).status == "cancelling"  # type: ignore[union-attr]


async def test_what_the_session_holds_is_flushed_first(db: Database) -> None:
    """The session would autoflush before a statement: so does the driver's path."""
    await _seed(db)
    async with db.write() as session:
        session.add(_run("run_f"))
        assert await _RUN_BY_ID.first(session, {"id": "run_f"}) is not None


async def test_a_rolled_back_transaction_takes_its_statements_with_it(db: Database) -> None:
    await _seed(db, _run("run_g"))
    with pytest.raises(RuntimeError):
        async with db.write() as session:
            await _SET_STATUS.rows(session, {"id": "run_g", "s": "cancelling"})
            raise RuntimeError("abort")
    async with db.read() as session:
        assert (await session.get(Run, "run_g")).status == "running"  # type: ignore[union-attr]


async def test_they_run_on_the_driver_past_sqlalchemys_execution(db: Database) -> None:
    """The statement never reaches SQLAlchemy's execution (its events do not see it): on a
    SQLite file it runs on the inline driver, on PostgreSQL on the session's asyncpg
    connection, through the adapter's statement cache."""
    await _seed(db, _run("run_h"))
    seen: list[str] = []

    def before(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        seen.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", before)
    try:
        async with db.read() as session:
            row = await _RUN_BY_ID.first(session, {"id": "run_h"})
            driver = await sqlite_driver(session)
            fairy: Any = (await session.connection()).sync_connection.connection  # type: ignore[union-attr]
            adapter: Any = fairy.dbapi_connection
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", before)
    assert row is not None and row[0] == "run_h"
    assert [s for s in seen if "FROM runs" in s] == []
    if db.is_sqlite:
        assert driver is not None
    else:
        cached = list(adapter._prepared_statement_cache.keys())
        assert any("FROM runs" in sql for sql in cached), cached


async def test_postgresql_statements_join_the_sessions_transaction(db: Database) -> None:
    """On asyncpg the first statement begins the session's transaction, as SQLAlchemy's own
    would: ORM work after it is in the same transaction, and both commit or roll back."""
    if db.is_sqlite:
        pytest.skip("asyncpg's path")
    await _seed(db, _run("run_o"), _run("run_p"))
    for fail in (True, False):
        with contextlib.suppress(RuntimeError):
            async with db.write() as session:
                await _SET_STATUS.rows(session, {"id": "run_o", "s": "cancelling"})
                run = await session.get(Run, "run_p")
                assert run is not None
                run.status = "cancelling"
                await session.flush()
                # both seen inside the transaction, by the session and by the driver
                assert await _RUNNING_BY_ID.rows(session, {"id": "run_o"}) == []
                assert await _RUNNING_BY_ID.rows(session, {"id": "run_p"}) == []
                if fail:
                    raise RuntimeError("abort")
        await _both_or_neither(db, fail, "run_o", "run_p")


async def test_postgresql_refusals_are_sqlalchemys_errors(db: Database) -> None:
    if db.is_sqlite:
        pytest.skip("asyncpg's path")
    await _seed(db, _run("run_q"), _run("run_r"))
    with pytest.raises(sa.exc.IntegrityError) as info:
        async with db.write() as session:
            await _RENAME.rows(session, {"id": "run_r", "to": "run_q"})
    assert "duplicate key" in str(info.value)
    async with db.read() as session:  # the connection went back to the pool usable
        assert await _RUN_BY_ID.first(session, {"id": "run_r"}) is not None


async def test_postgresql_connection_lost_is_invalidated(db: Database) -> None:
    """A backend killed under a transaction: the statement raises SQLAlchemy's error marked
    as an invalidated connection, and the pool does not hand that connection out again."""
    if db.is_sqlite:
        pytest.skip("asyncpg's path")
    await _seed(db, _run("run_s"))
    with pytest.raises(sa.exc.DBAPIError) as info:
        async with db.write() as session:
            await _RUN_BY_ID.first(session, {"id": "run_s"})
            pid = (await session.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
            async with db.engine.connect() as other:
                await other.execute(sa.text(f"SELECT pg_terminate_backend({int(pid)})"))
            await _SET_STATUS.rows(session, {"id": "run_s", "s": "cancelling"})
    assert info.value.connection_invalidated
    for _ in range(3):  # however many connections the pool holds, each one works
        async with db.write() as session:
            await _SET_STATUS.rows(session, {"id": "run_s", "s": "completed"})
    async with db.read() as session:
        row = await _RUN_BY_ID.first(session, {"id": "run_s"})
        assert row is not None and "completed" in row


async def test_the_driver_is_not_kept_past_its_transaction(db: Database) -> None:
    if not db.is_sqlite:
        pytest.skip("the driver's path is SQLite's")
    async with db.read() as session:
        first = await sqlite_driver(session)
        await session.rollback()  # the transaction ends; the next may use another connection
        assert "prepared.driver" not in session.info
        assert await sqlite_driver(session) is not None
        assert first is not None


async def test_a_driver_transaction_commits_or_rolls_back_whole(db: Database) -> None:
    """``driver_write``: SQLite's transaction of prepared statements alone; a refusal by the
    database is raised as the session raises it, and takes the whole transaction back."""
    if not db.on_driver:
        pytest.skip("PostgreSQL writes through sessions")
    await _seed(db, _run("run_i"), _run("run_j"))
    async with db.driver_write() as tx:
        await _SET_STATUS.rows(tx, {"id": "run_i", "s": "cancelling"})
    with pytest.raises(sa.exc.IntegrityError):
        async with db.driver_write() as tx:
            await _SET_STATUS.rows(tx, {"id": "run_j", "s": "cancelling"})
            await _RENAME.rows(tx, {"id": "run_j", "to": "run_i"})  # the key is taken
    async with db.read() as session:
        assert (await session.get(Run, "run_i")).status == "cancelling"  # type: ignore[union-attr]
        assert (await session.get(Run, "run_j")).status == "running"  # type: ignore[union-attr]
    async with db.driver_write() as tx:  # the lock and the connection were given back
        await _SET_STATUS.rows(tx, {"id": "run_j", "s": "completed"})


_RENAME = Prepared(
    _RUNS.update().where(_RUNS.c.run_id == sa.bindparam("id")).values(run_id=sa.bindparam("to"))
)


async def test_a_session_joins_the_driver_transaction_and_both_commit_or_roll_back(
    db: Database,
) -> None:
    """``write_tx`` (a route's transaction): begun on SQLite's driver; a session made in it
    joins the same transaction, so what both wrote commits, or rolls back, together."""
    await _seed(db, _run("run_k"), _run("run_l"))
    for fail in (True, False):
        with contextlib.suppress(RuntimeError):
            async with db.write_tx() as on:
                tx = Tx(on)
                await _SET_STATUS.rows(tx, {"id": "run_k", "s": "cancelling"})
                run = await tx.session.get(Run, "run_l")
                assert run is not None
                run.status = "cancelling"
                # the session holds a change: a statement after it sees it (it is flushed)
                assert tx.target is tx.session is tx.joined
                assert await _RUNNING_BY_ID.rows(tx, {"id": "run_l"}) == []
                if fail:
                    raise RuntimeError("abort")
        await _both_or_neither(db, fail, "run_k", "run_l")


async def test_a_transaction_of_prepared_statements_makes_no_session(db: Database) -> None:
    await _seed(db, _run("run_m"))
    async with db.write_tx() as on:
        tx = Tx(on)
        await _SET_STATUS.rows(tx, {"id": "run_m", "s": "cancelling"})
        made = isinstance(on, AsyncSession) or on.joined is not None
        assert (tx.joined is not None) is made
    assert made is (not db.on_driver)  # on the driver: SQLite in a file, PostgreSQL
    async with db.read() as session:
        assert (await session.get(Run, "run_m")).status == "cancelling"  # type: ignore[union-attr]


async def test_the_writer_connection_comes_back_after_it_was_invalidated(db: Database) -> None:
    """SQLAlchemy closes a connection it invalidates and asks for a new one: the process's
    one writer connection is then opened again, for its sessions and its driver alike."""
    if not db.on_driver:
        pytest.skip("the writer connection is SQLite's")
    await _seed(db, _run("run_n"))
    with pytest.raises(sa.exc.PendingRollbackError):  # that transaction is lost with it
        async with db.write() as session:
            await (await session.connection()).invalidate()
    async with db.driver_write() as tx:
        await _SET_STATUS.rows(tx, {"id": "run_n", "s": "cancelling"})
    async with db.write() as session:
        run = await session.get(Run, "run_n")
        assert run is not None and run.status == "cancelling"
        run.status = "completed"
    async with db.read() as session:
        assert (await session.get(Run, "run_n")).status == "completed"  # type: ignore[union-attr]


_PG_ONLY = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


async def _backend_pid(tx: Tx) -> int:
    return int((await driver_sql(tx, "SELECT pg_backend_pid()", ()))[0][0])


async def _busy_backends(db: Database) -> list[tuple[str, str]]:
    """Other connections of this database in a transaction or running a statement."""
    async with db.engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT state, query FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state <> 'idle'"
            )
        )
        return [(r[0], r[1]) for r in rows]


@_PG_ONLY
async def test_postgresql_write_transactions_run_on_a_connection_kept_between_them(
    db: Database,
) -> None:
    """No session and no pool checkout per transaction: the connection of a committed one
    serves the next; one that failed goes back to the pool rolled back."""
    await _seed(db, _run("run_t"), _run("run_u"))
    async with db.driver_write() as tx:
        assert isinstance(tx.target, _PgTx)
        first = await _backend_pid(tx)
        await _SET_STATUS.rows(tx, {"id": "run_t", "s": "cancelling"})
    async with db.driver_write() as tx:
        assert await _backend_pid(tx) == first
    with pytest.raises(sa.exc.IntegrityError):
        async with db.driver_write() as tx:
            await _SET_STATUS.rows(tx, {"id": "run_u", "s": "cancelling"})
            await _RENAME.rows(tx, {"id": "run_u", "to": "run_t"})
    assert await _busy_backends(db) == []  # nothing left open in a transaction
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    async with db.driver_write() as tx:
        await _SET_STATUS.rows(tx, {"id": "run_u", "s": "completed"})
    assert await _statuses(db) == {"run_t": "cancelling", "run_u": "completed"}


@_PG_ONLY
async def test_a_cancelled_postgresql_transaction_takes_its_statements_back(db: Database) -> None:
    await _seed(db, _run("run_v"))
    began = asyncio.Event()

    async def slow() -> None:
        async with db.driver_write() as tx:
            await _SET_STATUS.rows(tx, {"id": "run_v", "s": "cancelling"})
            began.set()
            await driver_sql(tx, "SELECT pg_sleep(30)", ())

    task = asyncio.create_task(slow())
    await began.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _statuses(db) == {"run_v": "running"}
    async with db.driver_write() as tx:  # writes go on, on another connection or this one
        await _SET_STATUS.rows(tx, {"id": "run_v", "s": "completed"})
    assert await _statuses(db) == {"run_v": "completed"}
    for _ in range(50):  # the server was told to stop the statement
        if not await _busy_backends(db):
            break
        await asyncio.sleep(0.1)
    assert await _busy_backends(db) == []


async def _most_at_once(db: Database, extra: int = 3) -> int:
    """How many write transactions ran at once when ``extra`` more than the connections kept
    came together (those kept run; the others wait their turn and open no connection)."""
    await _seed(db, _run("run_w"))
    kept = db._held.size
    inside: list[int] = []
    most = 0
    go = asyncio.Event()
    order: list[int] = []

    async def one(i: int) -> None:
        nonlocal most
        async with db.driver_write() as tx:
            await _RUN_BY_ID.rows(tx, {"id": "run_w"})
            inside.append(i)
            order.append(i)
            most = max(most, len(inside))
            await go.wait()
            inside.remove(i)

    tasks = [asyncio.create_task(one(i)) for i in range(kept + extra)]
    await until(lambda: len(inside) == kept)
    await asyncio.sleep(0.05)  # the others stay out
    assert sorted(inside) == list(range(kept))
    assert db.engine.pool.checkedout() == kept  # type: ignore[attr-defined]
    go.set()
    await asyncio.gather(*tasks)
    assert sorted(order) == list(range(kept + extra))
    assert db.engine.pool.checkedout() == kept  # type: ignore[attr-defined]
    await db.dispose()
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    return most


@_PG_ONLY
async def test_postgresql_write_transactions_take_turns_on_a_bounded_number_of_connections(
    db: Database,
) -> None:
    """As many write transactions run at once as connections are kept; the others wait their
    turn and open no connection of their own."""
    assert await _most_at_once(db) == db._held.size


@_PG_ONLY
async def test_a_service_runs_ten_write_transactions_at_once_by_default(db_url: str) -> None:
    """The service's defaults (``db_pool_size`` 20, ``db_max_overflow`` 10: at most 30
    connections per process, as before) keep 10 connections for write transactions: a burst
    of submissions overlaps 10 round trips, not 5 (measured in BENCHMARKS.md), and a pool of
    10 is left to sessions."""
    settings = make_settings(db_url)
    db = Database(db_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow)
    assert settings.db_pool_size + settings.db_max_overflow == 30
    assert await _most_at_once(db) == 10


@_PG_ONLY
async def test_a_write_transaction_inside_another_takes_no_turn(db: Database) -> None:
    """One that runs while its task holds another (its connection held meanwhile) does not
    wait for a turn it could only get once it is done."""
    await _seed(db, _run("run_n1"), _run("run_n2"))
    kept = db._held.size
    release = asyncio.Event()

    async def holder() -> None:
        async with db.driver_write() as tx:
            await _RUN_BY_ID.rows(tx, {"id": "run_n1"})
            await release.wait()

    holders = [asyncio.create_task(holder()) for _ in range(kept - 1)]
    await until(lambda: db.engine.pool.checkedout() == kept - 1)  # type: ignore[attr-defined]
    async with db.driver_write() as outer:  # the last turn
        await _SET_STATUS.rows(outer, {"id": "run_n1", "s": "cancelling"})
        async with asyncio.timeout(10), db.driver_write() as inner:
            await _SET_STATUS.rows(inner, {"id": "run_n2", "s": "cancelling"})
    release.set()
    await asyncio.gather(*holders)
    assert await _statuses(db) == {"run_n1": "cancelling", "run_n2": "cancelling"}


@_PG_ONLY
async def test_a_task_started_inside_a_write_transaction_takes_its_own_turn(
    db: Database,
) -> None:
    """Only the task holding a transaction is exempt: one it starts meanwhile (inheriting
    its context) runs its transactions on their own connections, in turn with the rest."""
    await _seed(db, _run("run_t1"), _run("run_t2"))
    kept = db._held.size
    release = asyncio.Event()
    entered = asyncio.Event()

    async def holder() -> None:
        async with db.driver_write() as tx:
            await _RUN_BY_ID.rows(tx, {"id": "run_t1"})
            await release.wait()

    async def child() -> None:
        async with db.driver_write() as tx:
            entered.set()
            await _SET_STATUS.rows(tx, {"id": "run_t2", "s": "cancelling"})

    holders = [asyncio.create_task(holder()) for _ in range(kept - 1)]
    await until(lambda: db.engine.pool.checkedout() == kept - 1)  # type: ignore[attr-defined]
    async with db.driver_write() as outer:  # the last turn
        await _SET_STATUS.rows(outer, {"id": "run_t1", "s": "cancelling"})
        started = asyncio.create_task(child())
        await asyncio.sleep(0.1)
        assert not entered.is_set()  # no turn is free: it waits
    await asyncio.wait_for(entered.wait(), 10)  # the outer one's turn, given back
    await started
    release.set()
    await asyncio.gather(*holders)
    assert await _statuses(db) == {"run_t1": "cancelling", "run_t2": "cancelling"}


@_PG_ONLY
async def test_a_kept_connection_whose_backend_died_is_dropped_at_its_first_error(
    db: Database,
) -> None:
    """As a pooled connection without a ping: the transaction that finds it dead fails with
    the connection marked invalidated (the service answers it as retriable); the next one
    runs on a live connection."""
    await _seed(db, _run("run_x"))
    async with db.driver_write() as tx:
        pid = await _backend_pid(tx)
    async with db.engine.connect() as other:
        await other.execute(sa.text(f"SELECT pg_terminate_backend({pid})"))
    with pytest.raises(sa.exc.DBAPIError) as info:
        async with db.driver_write() as tx:
            await _SET_STATUS.rows(tx, {"id": "run_x", "s": "cancelling"})
    assert info.value.connection_invalidated
    async with db.driver_write() as tx:
        assert await _backend_pid(tx) != pid
        await _SET_STATUS.rows(tx, {"id": "run_x", "s": "completed"})
    assert await _statuses(db) == {"run_x": "completed"}


@_PG_ONLY
async def test_held_connections_broken_together_fail_one_transaction(db: Database) -> None:
    """A server restart breaks every connection held: the transaction that finds the first
    one broken fails (retriably), the others held are let go, and the next one runs."""
    await _seed(db, _run("run_b"))
    size = db._held.size
    assert size > 1
    go = asyncio.Event()
    pids: list[int] = []

    async def one() -> None:
        async with db.driver_write() as tx:
            pids.append(await _backend_pid(tx))
            await go.wait()
            await _SET_STATUS.rows(tx, {"id": "run_b", "s": "running"})

    tasks = [asyncio.create_task(one()) for _ in range(size)]
    await until(lambda: len(pids) == size)
    go.set()
    await asyncio.gather(*tasks)
    assert len(db._held) == size
    async with db.engine.connect() as other:
        for pid in pids:
            await other.execute(sa.text(f"SELECT pg_terminate_backend({pid})"))
    with pytest.raises(sa.exc.DBAPIError) as info:
        async with db.driver_write() as tx:
            await _SET_STATUS.rows(tx, {"id": "run_b", "s": "cancelling"})
    assert info.value.connection_invalidated
    assert len(db._held) == 0
    async with db.driver_write() as tx:
        assert await _backend_pid(tx) not in pids
        await _SET_STATUS.rows(tx, {"id": "run_b", "s": "completed"})
    assert await _statuses(db) == {"run_b": "completed"}


_RUN_FOR_UPDATE = Prepared(
    sa.select(_RUNS.c.run_id).where(_RUNS.c.run_id == sa.bindparam("id")).with_for_update()
)
_TOUCHED = _RUNS.update().where(_RUNS.c.run_id == sa.bindparam("id")).values(step_count=5)
_SELECT_OVER_UPDATE = Prepared(  # a SELECT whose WITH writes
    sa.select(sa.literal(1)).add_cte(_TOUCHED.returning(_RUNS.c.run_id).cte("touched"))
)


def test_only_plain_selects_count_as_reads() -> None:
    assert _RUN_BY_ID.reads and _RUNNING_BY_ID.reads
    assert not _RUN_FOR_UPDATE.reads  # it locks
    assert not _SELECT_OVER_UPDATE.reads  # it writes
    assert not _SET_STATUS.reads and not _TOUCH.reads


@_PG_ONLY
async def test_postgresql_reads_ahead_of_the_first_write_begin_no_transaction(
    db: Database,
) -> None:
    """A plain SELECT before anything was written runs on its own (no BEGIN round trip: under
    READ COMMITTED it would read its own snapshot anyway); a write, a locking read or a SELECT
    that writes begins the transaction, and every statement after it runs inside."""
    await _seed(db, _run("run_r1"), _run("run_r2"))
    for beginning in (_SET_STATUS, _RUN_FOR_UPDATE, _SELECT_OVER_UPDATE):
        async with db.driver_write() as tx:
            pg = tx.target
            assert isinstance(pg, _PgTx)
            assert (await _RUN_BY_ID.first(tx, {"id": "run_r1"})) is not None
            assert not pg.begun and await _busy_backends(db) == []
            await beginning.rows(tx, {"id": "run_r2", "s": "cancelling"})
            assert pg.begun
            assert await _busy_backends(db) != []  # idle in its transaction
            if beginning is _SET_STATUS:
                assert await _statuses(db) == {"run_r1": "running", "run_r2": "running"}
                assert await _RUNNING_BY_ID.rows(tx, {"id": "run_r2"}) == []  # its own write
    assert await _statuses(db) == {"run_r1": "running", "run_r2": "cancelling"}
    async with db.read() as session:
        assert (await session.get(Run, "run_r2")).step_count == 5  # type: ignore[union-attr]


@_PG_ONLY
async def test_a_postgresql_statement_run_alone_commits_by_itself_and_ends_its_transaction(
    db: Database,
) -> None:
    await _seed(db, _run("run_a1"))
    async with db.write_tx() as on:
        assert not isinstance(on, AsyncSession)
        tx = on.driver
        assert isinstance(tx, _PgTx)
        await _RUN_BY_ID.rows(tx, {"id": "run_a1"})
        assert can_run_alone(tx)
        pid = tx.asyncpg.driver_connection.get_server_pid()  # (no statement: driver_sql begins)
        await _SET_STATUS.rows(tx, {"id": "run_a1", "s": "cancelling"}, alone=True)
        assert await _statuses(db) == {"run_a1": "cancelling"}  # committed before the block ends
        assert not can_run_alone(tx) and not tx.begun
        with pytest.raises(RuntimeError, match="ended"):
            await _SET_STATUS.rows(tx, {"id": "run_a1", "s": "completed"})
        with pytest.raises(RuntimeError, match="ended"):
            await driver_sql(tx, "SELECT 1", ())
        with pytest.raises(RuntimeError, match="ended"):
            _ = on.session  # a session would begin what the transaction no longer holds
    assert await _statuses(db) == {"run_a1": "cancelling"}
    async with db.driver_write() as again:  # its connection was kept for the next one
        assert await _backend_pid(again) == pid


@_PG_ONLY
async def test_a_postgresql_statement_run_alone_that_fails_writes_nothing_and_ends_nothing(
    db: Database,
) -> None:
    await _seed(db, _run("run_a2"), _run("run_a3"))
    async with db.driver_write() as tx:
        assert isinstance(tx.target, _PgTx)
        with pytest.raises(sa.exc.IntegrityError):
            await _RENAME.rows(tx, {"id": "run_a3", "to": "run_a2"}, alone=True)
        assert can_run_alone(tx)  # nothing began: the transaction goes on
        await _SET_STATUS.rows(tx, {"id": "run_a3", "s": "cancelling"})
    assert await _statuses(db) == {"run_a2": "running", "run_a3": "cancelling"}


async def test_a_statement_asked_to_run_alone_after_a_write_runs_in_the_transaction(
    db: Database,
) -> None:
    """Where something was written first (or on SQLite, where a round trip costs nothing),
    ``alone`` changes nothing: the statement commits, or rolls back, with the transaction."""
    await _seed(db, _run("run_a4"), _run("run_a5"))
    for fail in (True, False):
        with contextlib.suppress(RuntimeError):
            async with db.driver_write() as tx:
                await _SET_STATUS.rows(tx, {"id": "run_a4", "s": "cancelling"})
                assert not can_run_alone(tx)
                await _SET_STATUS.rows(tx, {"id": "run_a5", "s": "cancelling"}, alone=True)
                if fail:
                    raise RuntimeError("abort")
        await _both_or_neither(db, fail, "run_a4", "run_a5")


@_PG_ONLY
async def test_the_event_writers_transactions_have_a_connection_of_their_own(
    db: Database,
) -> None:
    """``urgent`` (the event writer's) transactions run on a pool of their own: API
    transactions holding every pooled connection cannot hold back committed tokens."""
    from orchestratord.eventlog import LogEvent, insert_events

    await _seed(db, _run("run_e"))
    pool: Any = db.engine.pool
    taken = [await db.engine.connect() for _ in range(pool.size() + pool._max_overflow)]
    try:
        async with asyncio.timeout(5):
            async with db.driver_write(urgent=True) as tx:
                await insert_events(tx, [LogEvent("run_e", None, None, "fact", b"{}")])
            async with db.write(urgent=True) as session:  # a session of its own, likewise
                run = await session.get(Run, "run_e")
                assert run is not None and run.event_seq == 1
    finally:
        for conn in taken:
            await conn.close()


_TYPED = Prepared(
    sa.select(
        sa.bindparam("at", type_=Ts),
        sa.bindparam("doc", type_=sa.JSON),
        sa.bindparam("flag", type_=sa.Boolean),
        sa.bindparam("n", type_=sa.BigInteger),
        sa.bindparam("x", type_=sa.Float),
        sa.bindparam("d", type_=sa.Numeric(10, 3)),
        sa.bindparam("s", type_=sa.String),
        sa.literal(datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=UTC), Ts),  # of the statement
        sa.literal({"k": [1, None, "é"]}, sa.JSON),
    )
)


@pytest.mark.parametrize("on", ["session", "driver"])
async def test_each_type_converts_as_through_the_session(db: Database, on: str) -> None:
    """Parameters and results of every kind of column the service stores, converted by the
    processors the types give through SQLAlchemy's public API: the same values as the
    session's own execution of the statement returns (as it converts them)."""
    assert isinstance(_TYPED.stmt, sa.Select)
    params = {
        "at": datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "doc": {"a": [1, 2.5, "x"], "b": {"c": None, "d": True}},
        "flag": True,
        "n": 2**40,
        "x": 0.125,
        "d": Decimal("12.345"),
        "s": "naïve ✓",
    }
    async with db.read() as session:
        expected = tuple((await session.execute(_TYPED.stmt, params)).one())
    if on == "session":
        async with db.read() as session:
            got = await _TYPED.first(session, params)
    else:
        async with db.driver_write() as tx:
            got = await _TYPED.first(tx, params)
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert got[0] == params["at"] and got[1] == params["doc"] and got[5] == Decimal("12.345")
