"""pools as data: declared by the pools file, created through the API, or provisioned

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26

Each process builds its pools from these rows, and rebuilds a pool whose row changed at its
next health refresh (``orchestratord.pools.store``).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("pool_id", sa.String(128), primary_key=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("provision", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pools")
