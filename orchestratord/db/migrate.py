"""Alembic, run from code: ``upgrade`` at start and from ``orchestratord db upgrade``.

Alembic is imported only when a migration runs or a revision is asked for: a start against a
database already at the head reads its version row and goes on (importing Alembic, with the
Mako and Pygments it brings, was 45% of a server's start: 1 s of CPU here).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from orchestratord.db.engine import Database

if TYPE_CHECKING:
    from alembic.config import Config

ALEMBIC_DIR = Path(__file__).resolve().parents[2] / "alembic"
# The newest script in alembic/versions (tests/db/test_migrations.py holds it to Alembic's
# head): a database whose one version row says this needs nothing.
SCHEMA_HEAD = "0015"
_VERSION = sa.table("alembic_version", sa.column("version_num"))


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url)
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest revision of the scripts this package ships (read once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to ``revision``; a database already at the head is only read (one query,
    not Alembic's environment)."""
    async with db.engine.begin() as conn:
        if revision == "head" and await conn.run_sync(_at_head):
            return
        await conn.run_sync(_run, "upgrade", revision)


async def downgrade(db: Database, revision: str) -> None:
    async with db.engine.begin() as conn:
        await conn.run_sync(_run, "downgrade", revision)


async def current_revision(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(_current)


def _at_head(sync_conn: sa.Connection) -> bool:
    if not sa.inspect(sync_conn).has_table("alembic_version"):
        return False
    return list(sync_conn.execute(sa.select(_VERSION.c.version_num)).scalars()) == [SCHEMA_HEAD]


def _current(sync_conn: Any) -> str | None:
    from alembic.runtime.migration import MigrationContext

    current: str | None = MigrationContext.configure(sync_conn).get_current_revision()
    return current


def _run(sync_conn: Any, action: str, revision: str) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    getattr(command, action)(cfg, revision)
