"""API keys (scrypt digests only) and their per-minute usage, shared by every process

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(12), primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("salt", sa.String(32), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name="pk_api_keys"),
    )
    op.create_table(
        "key_usage",
        sa.Column("key_id", sa.String(12), nullable=False),
        sa.Column("minute", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "minute", name="pk_key_usage"),
    )


def downgrade() -> None:
    op.drop_table("key_usage")
    op.drop_table("api_keys")
