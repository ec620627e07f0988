"""An aiosqlite-compatible connection that runs sqlite3 calls inline, on the event loop.

aiosqlite sends every call to a helper thread and back. On small machines that hop costs
hundreds of microseconds, while the SQLite call itself takes a few: for this service (one
process, WAL mode, writes serialized in-process by an asyncio lock, so nothing waits on a
lock held by another connection of ours) running the call inline is an order of magnitude
faster. SQLAlchemy's aiosqlite dialect drives this object exactly as it drives aiosqlite;
only the methods that dialect uses are provided, aiosqlite's private ``_conn``, ``_tx`` and
``_connection`` among them (tests/db/test_sqlalchemy_internals.py checks the installed
SQLAlchemy reads nothing else).

The cost: a statement blocks the event loop while it runs. Statements here are short and
indexed; a second *process* writing the same file could make one wait up to the busy
timeout, which is why several processes should share PostgreSQL, not SQLite.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any


class InlineCursor:
    __slots__ = ("_cursor",)

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cursor.close()

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        if parameters is None:
            self._cursor.execute(sql)
        else:
            self._cursor.execute(sql, parameters)
        return self

    async def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> InlineCursor:
        self._cursor.executemany(sql, seq)
        return self

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(size if size is not None else self._cursor.arraysize)

    async def close(self) -> None:
        self._cursor.close()

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value


class _ImmediateQueue:
    """Stands in for aiosqlite's request queue: runs the function at once."""

    def put_nowait(self, item: tuple[asyncio.Future[Any], Callable[[], Any]]) -> None:
        future, function = item
        try:
            future.set_result(function())
        except Exception as exc:
            future.set_exception(exc)


class InlineConnection:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._connection: sqlite3.Connection | None = conn
        self._tx = _ImmediateQueue()

    @property
    def sqlite(self) -> sqlite3.Connection:
        """The sqlite3 connection itself (``prepared.py`` runs hot statements on it)."""
        return self._conn

    @property
    def isolation_level(self) -> str | None:
        return self._conn.isolation_level

    def cursor(self) -> InlineCursor:
        return InlineCursor(self._conn.cursor())

    async def commit(self) -> None:
        self._conn.commit()

    async def rollback(self) -> None:
        self._conn.rollback()

    async def close(self) -> None:
        if self._connection is not None:
            self._connection = None
            self._conn.close()

    def stop(self) -> None:
        if self._connection is not None:
            self._connection = None
            self._conn.close()

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        self._conn.create_function(*args, **kwargs)


def open_sqlite(path: str, *, timeout_s: float) -> sqlite3.Connection:
    """A connection that leaves transactions to its user (no implicit BEGIN)."""
    return sqlite3.connect(path, timeout=timeout_s, check_same_thread=False, isolation_level=None)


def inline_creator(path: str, *, timeout_s: float) -> Callable[[], Any]:
    async def connect() -> InlineConnection:
        return InlineConnection(open_sqlite(path, timeout_s=timeout_s))

    return connect
