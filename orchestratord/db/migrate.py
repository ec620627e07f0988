"""Alembic, run from code: ``upgrade`` at start and from ``orchestratord db upgrade``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from alembic import command
from orchestratord.db.engine import Database

ALEMBIC_DIR = Path(__file__).resolve().parents[2] / "alembic"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url)
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest revision of the scripts this package ships (read once per process)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to ``revision``; a database already at the head is only read (one query,
    not Alembic's environment: the usual start costs 1 ms instead of 15)."""
    async with db.engine.begin() as conn:
        if revision == "head" and await conn.run_sync(_current) == head_revision():
            return
        await conn.run_sync(_run, "upgrade", revision)


async def downgrade(db: Database, revision: str) -> None:
    async with db.engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision)


async def current_revision(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_current)


def _current(sync_conn: Any) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


def _run(sync_conn: Any, action: str, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    getattr(command, action)(cfg, revision)
