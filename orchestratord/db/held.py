"""PostgreSQL connections a process keeps checked out between its session-less write
transactions (``Database.write_tx``), each with its asyncpg adapter."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestratord.db.prepared import asyncpg_adapter


class HeldConnections:
    """At most ``size`` connections of ``engine``, kept open while idle.

    No ping when one is taken (a round trip per transaction): a connection whose server
    process died fails the transaction that finds it, and SQLAlchemy marks it invalidated.
    The others held are then let go too, as SQLAlchemy's pool lets its own go on a
    disconnect: a server restart breaks them all, and one transaction fails, not one per
    connection held."""

    def __init__(self, engine: AsyncEngine, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, not {size}")
        self.engine = engine
        self.size = size
        self._idle: list[tuple[AsyncConnection, Any]] = []

    def __len__(self) -> int:
        return len(self._idle)

    async def take(self) -> tuple[AsyncConnection, Any]:
        """A held connection, else a new one from the pool; with its asyncpg adapter
        (``RuntimeError`` where SQLAlchemy's lacks what ``prepared.py`` uses of it)."""
        if self._idle:
            return self._idle.pop()
        conn = await self.engine.connect()
        try:
            return conn, asyncpg_adapter(conn)
        except BaseException:
            await conn.close()
            raise

    async def give_back(self, conn: AsyncConnection, adapted: Any, *, keep: bool) -> None:
        """Kept (its transaction committed) while fewer than ``size`` are; else back to the
        pool, which rolls back what it holds or drops it."""
        if keep and not conn.invalidated and len(self._idle) < self.size:
            self._idle.append((conn, adapted))
            return
        broken = conn.invalidated
        await conn.close()
        if broken:
            await self.let_go()

    async def let_go(self) -> None:
        """Every idle one back to the pool."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()
