"""client tokens on facts, checkpoints and runs: a retried write stores one record

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26

Each of these tables gains ``client_token`` (unique within its run, or within its flow for
runs) and ``request_hash`` (the hash of the request that wrote the row): a repeat of the
same request answers the first record, the same token with another body is refused.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_SCOPES = {"facts": "run_id", "checkpoints": "run_id", "runs": "flow_id"}


def upgrade() -> None:
    for table, scope in _SCOPES.items():
        op.add_column(table, sa.Column("client_token", sa.String(256), nullable=True))
        op.add_column(table, sa.Column("request_hash", sa.String(80), nullable=True))
        op.create_index(
            f"uq_{table}_{scope}_client_token", table, [scope, "client_token"], unique=True
        )


def downgrade() -> None:
    for table, scope in _SCOPES.items():
        op.drop_index(f"uq_{table}_{scope}_client_token", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("request_hash")
            batch.drop_column("client_token")
