"""replica slots held across processes (PostgreSQL), and each step's placement decision

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

On PostgreSQL a replica's slot is held by a step whose row says it runs there. Claims read
those rows through two functions that first take a per-pool advisory lock, held to the end
of the transaction, each statement in them on a snapshot taken after the lock (plpgsql,
VOLATILE, READ COMMITTED): two processes never both take a replica's last slot. SQLite has
one process, which counts its own slots: nothing to add there.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# the advisory lock's first key (its second: hashtext(pool_id)); admission's locks take the
# one-key form, a space of its own
_LOCK = "pg_advisory_xact_lock(7100, hashtext(p_pool))"

SLOTS_HELD = f"""
CREATE OR REPLACE FUNCTION orchestratord_slots_held(p_pool varchar)
RETURNS TABLE (replica_id varchar, held bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM {_LOCK};
    RETURN QUERY
        SELECT s.replica_id, count(*) FROM steps s
        WHERE s.status = 'running' AND s.pool_id = p_pool AND s.replica_id IS NOT NULL
        GROUP BY s.replica_id;
END $$
"""

SLOT_FREE = f"""
CREATE OR REPLACE FUNCTION orchestratord_slot_free(
    p_pool varchar, p_replica varchar, p_slots integer
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM {_LOCK};
    RETURN (
        SELECT count(*) FROM steps s
        WHERE s.status = 'running' AND s.pool_id = p_pool AND s.replica_id = p_replica
    ) < p_slots;
END $$
"""


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("placement_decision", sa.JSON(none_as_null=True), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SLOTS_HELD)
        op.execute(SLOT_FREE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS orchestratord_slot_free(varchar, varchar, integer)")
        op.execute("DROP FUNCTION IF EXISTS orchestratord_slots_held(varchar)")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("placement_decision")
