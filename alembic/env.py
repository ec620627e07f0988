"""Alembic environment: runs on a connection handed over by orchestratord, or on a URL."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from alembic import context
from orchestratord.db.engine import to_async_url
from orchestratord.db.models import Base

target_metadata = Base.metadata
config = context.config


def _do_run(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_from_url(url: str) -> None:
    engine = create_async_engine(to_async_url(url))
    async with engine.begin() as conn:
        await conn.run_sync(_do_run)
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    _do_run(connection)
else:
    asyncio.run(
        _run_from_url(config.get_main_option("sqlalchemy.url") or "sqlite:///orchestratord.db")
    )
