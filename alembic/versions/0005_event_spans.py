"""coalesced token events: a row of the log may hold a span of consecutive token events

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("span", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    # rows holding several events are split back into one row per event first
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, run_id, run_seq, step_id, seq, type, data, span FROM events WHERE span > 1"
        )
    ).all()
    for row in rows:
        parts = row.data.split("\n")
        conn.execute(
            sa.text("UPDATE events SET data = :d, span = 1 WHERE id = :id"),
            {"d": parts[0], "id": row.id},
        )
        conn.execute(
            sa.text(
                "INSERT INTO events (run_id, run_seq, step_id, seq, type, data, span) "
                "VALUES (:run_id, :run_seq, :step_id, :seq, :type, :data, 1)"
            ),
            [
                {
                    "run_id": row.run_id,
                    "run_seq": row.run_seq + k,
                    "step_id": row.step_id,
                    "seq": row.seq + k,
                    "type": row.type,
                    "data": part,
                }
                for k, part in enumerate(parts[1:], start=1)
            ],
        )
    with op.batch_alter_table("events") as batch:
        batch.drop_column("span")
