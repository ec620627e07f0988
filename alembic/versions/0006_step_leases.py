"""step leases: the process running a step holds it until an expiry it renews

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(200), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("attempts", sa.SmallInteger(), nullable=False, server_default="0")
        )
        batch.create_index("ix_steps_lease", ["status", "lease_expires_at"])


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_index("ix_steps_lease")
        batch.drop_column("attempts")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
