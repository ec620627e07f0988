"""replay: which recorded step a replayed step reproduces, and how that went

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("replay_of", sa.String(40), nullable=True))
        batch.add_column(sa.Column("replay_outcome", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("replay_outcome")
        batch.drop_column("replay_of")
