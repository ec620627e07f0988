"""runs that end (output, ended_at, forked_from) and checkpoint cursors

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("output", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("forked_from", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("cursors", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("cursors")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("forked_from")
        batch.drop_column("ended_at")
        batch.drop_column("output")
