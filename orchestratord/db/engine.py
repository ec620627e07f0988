"""Database access: one engine, read sessions and write sessions.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
``BEGIN IMMEDIATE`` so two writers never deadlock on a lock upgrade; inside one process the
writes are also serialized by an asyncio lock, so they never wait on SQLite's busy loop.
That lock serves ``urgent`` writers (the event writer: the events of steps already running)
before waiting API transactions, so a burst of submissions cannot hold back their tokens.
The dispatcher is not urgent: claiming after the queued submissions claims them in one
transaction, where claiming between them took one transaction per step (measured: half the
steps per second). PostgreSQL uses its default READ COMMITTED and
row locks.

Transactions of the hot paths (``write_tx``) start with no session: on SQLite in a file,
begun on the process's one writer connection; on PostgreSQL, begun on asyncpg under a
connection the process keeps checked out between transactions (measured: a one-statement
transaction through a session cost 0.43 ms of CPU here, 0.13 ms on asyncpg). A session
joins the same transaction only when code asks for one. On PostgreSQL, plain SELECTs ahead
of the first write run on their own, and a last write with nothing begun before it may
commit by itself (``prepared._PgTx``): a submission that starts its step is two round trips,
not six.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import StaticPool

from orchestratord.db import json_codec
from orchestratord.db.held import HeldConnections
from orchestratord.db.inline_sqlite import InlineConnection, inline_creator, open_sqlite
from orchestratord.db.outage import install_pg_hooks
from orchestratord.db.prepared import (
    _PgTx,
    _SqliteTx,
    _Target,
    check_asyncpg_adapter,
    check_session,
    commit_on_asyncpg,
)
from orchestratord.tx import Tx

SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)


def configure_sqlite(conn: sqlite3.Connection) -> None:
    for pragma in SQLITE_PRAGMAS:
        conn.execute(pragma).close()


def to_async_url(url: str) -> str:
    """Take the URLs users write (``sqlite:///x``, ``postgresql://...``); pick async drivers."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ValueError(f"unsupported database {backend!r}: use sqlite:/// or postgresql://")
    return parsed.render_as_string(hide_password=False)


class WriteLock:
    """A mutex whose waiters are served urgent first, FIFO within each class."""

    def __init__(self) -> None:
        self._held = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._normal: deque[asyncio.Future[None]] = deque()

    @property
    def locked(self) -> bool:
        return self._held

    async def acquire(self, *, urgent: bool = False) -> None:
        if not self._held:
            self._held = True
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._urgent if urgent else self._normal
        queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed the lock as we were cancelled: pass it on
            elif fut in queue:  # (a release meanwhile dropped it, cancelled, from the queue)
                queue.remove(fut)
            raise

    def release(self) -> None:
        for queue in (self._urgent, self._normal):
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)  # handed over: the lock stays held
                    return
        self._held = False


class _WriteTx:
    """A write transaction begun with no session (``Database.write_tx``); the session that
    joins it is made when first asked for. What ``Tx`` holds: services see only ``Tx``."""

    __slots__ = ("_make", "driver", "joined")

    def __init__(self, driver: _SqliteTx | _PgTx, make: Callable[[], AsyncSession]) -> None:
        self.driver = driver
        self._make = make
        self.joined: AsyncSession | None = None

    @property
    def session(self) -> AsyncSession:
        if self.joined is None:
            if isinstance(self.driver, _PgTx):
                self.driver.check_open()
            self.joined = self._make()
        return self.joined

    @property
    def target(self) -> _Target:
        return self.joined if self.joined is not None else self.driver


# the task inside a PostgreSQL write transaction of ``Database.write_tx`` (a nested one
# takes no turn); a task it creates inherits the value, not the exemption: it is another task
_IN_PG_WRITE: ContextVar[asyncio.Task[Any] | None] = ContextVar("in_pg_write", default=None)

# JSON columns: orjson, with json.dumps for what it refuses (db/json_codec.py)
JSON_CODEC: dict[str, Any] = {
    "json_serializer": json_codec.dumps,
    "json_deserializer": json_codec.loads,
}


class Database:
    def __init__(
        self, url: str, *, echo: bool = False, pool_size: int = 20, max_overflow: int = 10
    ) -> None:
        self.url = to_async_url(url)
        self.dialect = make_url(self.url).get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo, **JSON_CODEC}
        self._driver_file: str | None = None
        self._driver: sqlite3.Connection | None = None
        if self.is_sqlite:
            database = make_url(self.url).database
            if database and database != ":memory:":
                self._driver_file = database
                kwargs["async_creator"] = inline_creator(
                    database, timeout_s=SQLITE_BUSY_TIMEOUT_MS / 1000
                )
            else:
                kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        else:
            # Connections that broke are invalidated on their first error; no ping per checkout
            # (one the server closed while idle is replaced then: asyncpg knows, db/outage.py).
            # Every process holds up to pool_size + max_overflow connections: keep the sum over
            # all processes under the server's max_connections (100 by default).
            kwargs.update(pool_size=pool_size, max_overflow=max_overflow, pool_timeout=30)
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        if self.is_sqlite:
            _install_sqlite_hooks(self.engine)
        else:  # connect failures as DatabaseUnavailable; closed pooled connections replaced
            install_pg_hooks(self.engine)
        self._reader = async_sessionmaker(self.engine, expire_on_commit=False)
        # SQLite in a file: writes go to the process's one writer connection, the driver
        # transactions' too, so a session can join a transaction begun on the driver
        self._write_engine: AsyncEngine | None = None
        if self._driver_file is not None:
            self._write_engine = create_async_engine(
                self.url,
                poolclass=StaticPool,
                async_creator=self._inline_writer,
                echo=echo,
                **JSON_CODEC,
            )
            _install_sqlite_hooks(self._write_engine)
        self._writer = async_sessionmaker(
            (self._write_engine or self.engine).execution_options(sqlite_begin="IMMEDIATE"),
            expire_on_commit=False,
        )
        self._write_lock = WriteLock()
        # PostgreSQL on asyncpg: connections held between session-less write transactions,
        # each with its asyncpg adapter
        self._pg_driver = self.dialect == "postgresql"
        check_session()  # refuses a SQLAlchemy whose internals used differ
        if self._pg_driver:
            check_asyncpg_adapter()
        self._held = HeldConnections(self.engine, max(1, pool_size // 2))
        # as many of them run at once as are kept: more would open connections (and prepare
        # their statements again) only to share the same core; a burst waits its turn, first
        # come first served (measured: 50 concurrent submissions spent 7% of the process's
        # CPU connecting and 6% preparing statements on new connections); and as few as 5 made
        # the burst's last submissions wait their turn behind round trips that the loop could
        # have overlapped (measured: 50 streams x 200 tokens, added TTFT p99 62-69 ms with 5,
        # 52-54 ms with 10)
        self._write_turns = asyncio.Semaphore(self._held.size)
        # the event writer's (``urgent``) connection, from a pool of its own: a burst of API
        # transactions holding every pooled connection cannot hold back committed tokens
        # (measured: 50 concurrent submissions held the first token of every stream until
        # the last of them had committed)
        self._urgent_held: HeldConnections | None = None
        if not self.is_sqlite:
            urgent = create_async_engine(self.url, **{**kwargs, "pool_size": 1, "max_overflow": 0})
            install_pg_hooks(urgent)
            self._urgent_held = HeldConnections(urgent, 1)
        # names this process's writes (PostgreSQL wake-ups skip what the process wrote itself)
        self.origin = uuid.uuid4().hex[:16]

    async def _inline_writer(self) -> InlineConnection:
        return InlineConnection(self._writer_connection())

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @asynccontextmanager
    async def write(self, *, urgent: bool = False) -> AsyncIterator[AsyncSession]:
        """One write transaction: commits on success, rolls back on error. ``urgent``: the
        event writer's, served first on SQLite's one write lock."""
        if self.is_sqlite:
            await self._write_lock.acquire(urgent=urgent)
            try:
                async with self._writer() as session, session.begin():
                    yield session
            finally:
                self._write_lock.release()
        elif urgent and self._pg_driver:  # on the writer's own connection
            async with self.write_tx(urgent=True) as on:
                yield on.session if isinstance(on, _WriteTx) else on
        else:
            async with self._writer() as session, session.begin():
                session.info["origin"] = self.origin
                yield session

    @property
    def on_driver(self) -> bool:
        """Transactions of prepared statements alone need no session: SQLite in a file (its
        driver runs inline) and PostgreSQL on asyncpg."""
        return self._driver_file is not None or self._pg_driver

    @asynccontextmanager
    async def driver_write(self, *, urgent: bool = False) -> AsyncIterator[Tx]:
        """A write transaction (``write_tx``) as services see it: a session joins it only if
        code asks for one; commits on success. (Its events and callbacks are the caller's:
        ``Orchestrator.tx`` publishes and runs them.)"""
        async with self.write_tx(urgent=urgent) as on:
            yield Tx(on)

    @asynccontextmanager
    async def write_tx(self, *, urgent: bool = False) -> AsyncIterator[AsyncSession | _WriteTx]:
        """A write transaction for ``Tx``: begun on the driver where ``on_driver``, a session
        joining it only when asked for (``_WriteTx``); elsewhere a session."""
        if self._driver_file is not None:
            async with self._sqlite_write_tx(urgent) as tx:
                yield tx
            return
        if self._pg_driver:
            # a turn among the process's write transactions, unless this one runs inside one
            # (its connection is held meanwhile) or is the event writer's
            task = asyncio.current_task()
            turn = not urgent and (task is None or _IN_PG_WRITE.get() is not task)
            if turn:
                await self._write_turns.acquire()
            inside = _IN_PG_WRITE.set(task)
            try:
                held = self._urgent_held if urgent else self._held
                assert held is not None  # PostgreSQL's
                conn, adapted = await held.take()
                async with self._pg_write_tx(conn, adapted, held) as tx:
                    yield tx
                return
            finally:
                _IN_PG_WRITE.reset(inside)
                if turn:
                    self._write_turns.release()
        async with self.write(urgent=urgent) as session:
            yield session

    @asynccontextmanager
    async def _sqlite_write_tx(self, urgent: bool) -> AsyncIterator[_WriteTx]:
        await self._write_lock.acquire(urgent=urgent)
        try:
            driver = self._writer_connection()
            driver.execute("BEGIN IMMEDIATE").close()
            tx = _WriteTx(_SqliteTx(driver, self.engine.dialect), self._writer)
            try:
                yield tx
                if tx.joined is not None:
                    await tx.joined.commit()  # flushes, and commits the driver's transaction
                if driver.in_transaction:
                    driver.commit()
            except BaseException:
                if tx.joined is not None:
                    await tx.joined.rollback()
                if driver.in_transaction:
                    driver.rollback()
                raise
            finally:
                if tx.joined is not None:
                    await tx.joined.close()
        finally:
            self._write_lock.release()

    @asynccontextmanager
    async def _pg_write_tx(
        self,
        conn: AsyncConnection,
        adapted: Any,
        held: HeldConnections,
    ) -> AsyncIterator[_WriteTx]:
        """Begun on asyncpg at the first statement; a session made in it is bound to the same
        connection and joins it. Committed: the connection is held for the next one; on any
        failure it goes back to the pool, which rolls back what it holds (or drops it)."""

        def session() -> AsyncSession:
            joined = self._writer(bind=conn)
            joined.info["origin"] = self.origin
            return joined

        tx = _WriteTx(_PgTx(conn, adapted, self.origin), session)
        keep = False
        try:
            yield tx
            if tx.joined is not None:
                await tx.joined.commit()  # flushes; commits what began on the session's side
            await commit_on_asyncpg(adapted, conn)
            keep = not conn.invalidated and not conn.in_transaction()
        finally:
            if tx.joined is not None:
                await tx.joined.close()
            await held.give_back(conn, adapted, keep=keep)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._reader() as session:
            yield session

    def _writer_connection(self) -> sqlite3.Connection:
        """SQLite in a file: the one connection this process writes on (writes are
        serialized by the write lock), shared by its sessions and its driver transactions."""
        assert self._driver_file is not None
        if self._driver is not None:
            try:
                _ = self._driver.in_transaction  # raises once closed: SQLAlchemy invalidated it
            except sqlite3.ProgrammingError:
                self._driver = None
        if self._driver is None:
            self._driver = open_sqlite(self._driver_file, timeout_s=SQLITE_BUSY_TIMEOUT_MS / 1000)
            configure_sqlite(self._driver)
        return self._driver

    async def dispose(self) -> None:
        await self._held.let_go()
        if self._urgent_held is not None:
            await self._urgent_held.let_go()
            await self._urgent_held.engine.dispose()
        if self._write_engine is not None:
            await self._write_engine.dispose()
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        await self.engine.dispose()


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see "begin" below).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        driver = conn.connection.driver_connection
        if isinstance(driver, InlineConnection):  # on the loop: no statement machinery
            if not driver.sqlite.in_transaction:  # else: joining one begun on the driver
                driver.sqlite.execute(f"BEGIN {mode}").close()
        else:
            conn.exec_driver_sql(f"BEGIN {mode}")
