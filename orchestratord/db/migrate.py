"""Alembic, run from code: ``upgrade`` at start and from ``orchestratord db upgrade``."""

from __future__ import annotations

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


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(db: Database, revision: str = "head") -> None:
    async with db.engine.begin() as conn:
        await conn.run_sync(_run, "upgrade", revision)


async def downgrade(db: Database, revision: str) -> None:
    async with db.engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision)


async def current_revision(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


def _run(sync_conn: Any, action: str, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    getattr(command, action)(cfg, revision)
