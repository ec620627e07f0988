"""replicas an operator drains: no new steps, running ones finish, in every process

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26

A drained replica has a row here (``draining`` true). On PostgreSQL the drain is written
under the pool's slot lock (0010), and the two slot functions read it under that lock: once
a drain commits, no process claims a step on that replica. The functions now also say
which replicas are draining (``orchestratord_slots_held``) and refuse a draining replica's
slot (``orchestratord_slot_free``).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import sqlalchemy as sa

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_EARLIER = "0010_shared_slots_placement_decisions.py"
_LOCK = "pg_advisory_xact_lock(7100, hashtext(p_pool))"

SLOTS_HELD = f"""
CREATE FUNCTION orchestratord_slots_held(p_pool varchar)
RETURNS TABLE (replica_id varchar, held bigint, draining boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM {_LOCK};
    RETURN QUERY
        SELECT coalesce(h.replica_id, d.replica_id), coalesce(h.held, 0::bigint),
               coalesce(d.draining, false)
        FROM (
            SELECT s.replica_id, count(*) AS held FROM steps s
            WHERE s.status = 'running' AND s.pool_id = p_pool AND s.replica_id IS NOT NULL
            GROUP BY s.replica_id
        ) h
        FULL JOIN (
            SELECT r.replica_id, r.draining FROM replica_states r
            WHERE r.pool_id = p_pool AND r.draining
        ) d ON h.replica_id = d.replica_id;
END $$
"""

SLOT_FREE = f"""
CREATE OR REPLACE FUNCTION orchestratord_slot_free(
    p_pool varchar, p_replica varchar, p_slots integer
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM {_LOCK};
    RETURN NOT EXISTS (
        SELECT 1 FROM replica_states r
        WHERE r.pool_id = p_pool AND r.replica_id = p_replica AND r.draining
    ) AND (
        SELECT count(*) FROM steps s
        WHERE s.status = 'running' AND s.pool_id = p_pool AND s.replica_id = p_replica
    ) < p_slots;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "replica_states",
        sa.Column("pool_id", sa.String(128), primary_key=True),
        sa.Column("replica_id", sa.String(128), primary_key=True),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION orchestratord_slots_held(varchar)")  # its rows change
        op.execute(SLOTS_HELD)
        op.execute(SLOT_FREE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # the functions as 0010 made them
        earlier = runpy.run_path(str(Path(__file__).with_name(_EARLIER)))
        op.execute("DROP FUNCTION orchestratord_slots_held(varchar)")
        op.execute(earlier["SLOTS_HELD"])
        op.execute(earlier["SLOT_FREE"])
    op.drop_table("replica_states")
