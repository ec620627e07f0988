"""Database access: one engine, read sessions and write sessions.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
``BEGIN IMMEDIATE`` so two writers never deadlock on a lock upgrade; inside one process the
writes are also serialized by an asyncio lock, so they never wait on SQLite's busy loop.
PostgreSQL uses its default READ COMMITTED and row locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from orchestratord.db.inline_sqlite import inline_creator

SQLITE_BUSY_TIMEOUT_MS = 5_000


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


class Database:
    def __init__(
        self, url: str, *, echo: bool = False, pool_size: int = 10, max_overflow: int = 20
    ) -> None:
        self.url = to_async_url(url)
        self.dialect = make_url(self.url).get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            database = make_url(self.url).database
            if database and database != ":memory:":
                kwargs["async_creator"] = inline_creator(
                    database, timeout_s=SQLITE_BUSY_TIMEOUT_MS / 1000
                )
            else:
                kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        else:
            # Connections that broke are invalidated on their first error; no ping per checkout.
            # Every process holds up to pool_size + max_overflow connections: keep the sum over
            # all processes under the server's max_connections (100 by default).
            kwargs.update(pool_size=pool_size, max_overflow=max_overflow, pool_timeout=30)
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        if self.is_sqlite:
            _install_sqlite_hooks(self.engine)
        self._reader = async_sessionmaker(self.engine, expire_on_commit=False)
        self._writer = async_sessionmaker(
            self.engine.execution_options(sqlite_begin="IMMEDIATE"), expire_on_commit=False
        )
        self._write_lock: asyncio.Lock | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """One write transaction: commits on success, rolls back on error."""
        if self.is_sqlite:
            if self._write_lock is None:
                self._write_lock = asyncio.Lock()
            async with self._write_lock, self._writer() as session, session.begin():
                yield session
        else:
            async with self._writer() as session, session.begin():
                yield session

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._reader() as session:
            yield session

    async def dispose(self) -> None:
        await self.engine.dispose()


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see "begin" below).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")
