"""unpriced models: a step's cost may be unknown (null), and a run counts such steps

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.alter_column("cost_usd", existing_type=sa.Float(), nullable=True)
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("unpriced_steps", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    # The earlier schema cannot say "not known": such a step's cost becomes 0 there, and its
    # provenance (price.source "unpriced") still tells what it was.
    op.execute(sa.text("UPDATE steps SET cost_usd = 0 WHERE cost_usd IS NULL"))
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("unpriced_steps")
    with op.batch_alter_table("steps") as batch:
        batch.alter_column("cost_usd", existing_type=sa.Float(), nullable=False)
