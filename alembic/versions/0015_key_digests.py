"""api keys: digests of the HMAC scheme (``h1$`` + 64 hex digits) need a wider column

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26

Keys stored before (scrypt, 64 hex digits) keep their digest and are rewritten in the new
scheme on their first use (``orchestratord.auth.guard``).
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column(
            "digest", existing_type=sa.String(64), type_=sa.String(80), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column(
            "digest", existing_type=sa.String(80), type_=sa.String(64), existing_nullable=False
        )
