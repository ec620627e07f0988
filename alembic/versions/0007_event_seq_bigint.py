"""events.seq is 64-bit, as run_seq is: a step stream's Last-Event-ID (up to 2^53-1) is
compared with it, and a 32-bit column refused the comparison on PostgreSQL

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.alter_column(
            "seq", existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True
        )


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.alter_column(
            "seq", existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True
        )
