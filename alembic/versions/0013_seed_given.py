"""seeded runs: whether a run's creator gave its seed (else the server drew it)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26

A seeded run's steps that sample go only to engines that take a seed
(``orchestrator_core.placement``). Runs from before this revision count as not seeded: their
steps keep going wherever they went.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("seed_given", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("seed_given")
