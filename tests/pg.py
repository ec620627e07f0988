"""The PostgreSQL server of the test machine: found, or skipped with a reason (failed in CI)."""

from __future__ import annotations

import asyncio
import os
import uuid

import asyncpg
import pytest

from orchestratord.db.models import Base

PG_ADMIN_URL = os.environ.get("ORCHESTRATORD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def _probe() -> str | None:
    try:
        conn = await asyncpg.connect(_dsn(PG_ADMIN_URL), timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


_reason: list[str | None] = []


def require_postgres() -> None:
    """Skip (or, with CI=true, fail) when PostgreSQL cannot be reached."""
    if not _reason:
        _reason.append(asyncio.run(_probe()))
    problem = _reason[0]
    if problem is None:
        return
    message = f"PostgreSQL not reachable at {PG_ADMIN_URL} ({problem})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(message)


def create_database() -> str:
    """A fresh, empty database; returns its URL."""
    name = f"orch_test_{uuid.uuid4().hex[:12]}"

    async def go() -> None:
        conn = await asyncpg.connect(_dsn(PG_ADMIN_URL))
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(go())
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]

    async def go() -> None:
        conn = await asyncpg.connect(_dsn(PG_ADMIN_URL))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(go())


# Every table of the schema, children before parents; those with a serial id restart it, as a
# fresh database would.
_EMPTIED = [table.name for table in reversed(Base.metadata.sorted_tables)]
_SERIAL = [t.name for t in Base.metadata.sorted_tables if t.autoincrement_column is not None]


async def empty(url: str) -> None:
    """Every row gone and the serial ids restarted: what a test leaves behind is not seen by
    the next. DELETE, not TRUNCATE: on a handful of rows it takes a few milliseconds where
    TRUNCATE's new files take about 70."""
    conn = await asyncpg.connect(_dsn(url))
    try:
        async with conn.transaction():
            for table in _EMPTIED:
                await conn.execute(f"DELETE FROM {table}")
            for table in _SERIAL:
                await conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), 1, false)"
                )
    finally:
        await conn.close()


def empty_database(url: str) -> None:
    """:func:`empty`, from outside an event loop."""
    asyncio.run(empty(url))
