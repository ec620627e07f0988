from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from orchestratord.db.engine import Database
from orchestratord.db.migrate import (
    SCHEMA_HEAD,
    alembic_config,
    current_revision,
    downgrade,
    upgrade,
)
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


def test_the_schema_head_the_start_checks_is_alembics_head() -> None:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head == SCHEMA_HEAD, (
        f"alembic/versions ends at {head}: set SCHEMA_HEAD in orchestratord/db/migrate.py to it"
    )


async def test_a_database_behind_the_head_is_migrated_at_start(db_url: str) -> None:
    db = Database(db_url)
    try:
        await downgrade(db, "0008")
        await upgrade(db)
        assert await current_revision(db) == SCHEMA_HEAD
    finally:
        await db.dispose()


def test_a_start_at_the_head_does_not_import_alembic(tmp_path: Path) -> None:
    """The start reads the version row itself: Alembic's import is most of a start's CPU."""
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    program = (
        "import asyncio, sys\n"
        "from orchestratord.db.engine import Database\n"
        "from orchestratord.db.migrate import upgrade\n"
        "async def main():\n"
        f"    db = Database({url!r})\n"
        "    await upgrade(db)\n"
        "    await db.dispose()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))\n"
    )
    first = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "alembic" in first.stdout  # a new file is migrated by Alembic
    again = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "[]"
