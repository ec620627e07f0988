from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from orchestratord.db.engine import Database
from orchestratord.db.migrate import alembic_config, current_revision, downgrade, upgrade
from orchestratord.db.models import Base


def test_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    assert len(script.get_heads()) == 1


async def test_upgrade_downgrade_and_no_drift(db_url: str) -> None:
    db = Database(db_url)
    try:
        await downgrade(db, "base")
        assert await current_revision(db) is None
        await upgrade(db)
        assert (
            await current_revision(db)
            == ScriptDirectory.from_config(alembic_config()).get_current_head()
        )

        def diff(sync_conn: Any) -> list[Any]:
            return list(compare_metadata(MigrationContext.configure(sync_conn), Base.metadata))

        async with db.engine.connect() as conn:
            changes = await conn.run_sync(diff)
        assert changes == [], changes
    finally:
        await upgrade(db)
        await db.dispose()
