"""budgets, price tables, policy and admission

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("tokens_in_reserved", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("tokens_out_reserved", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("cost_reserved_usd", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("price_table", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("policy_hash", sa.String(80), nullable=False, server_default=""))
    with op.batch_alter_table("steps") as batch:
        batch.add_column(
            sa.Column("priority", sa.String(16), nullable=False, server_default="interactive")
        )
        batch.add_column(
            sa.Column("priority_rank", sa.SmallInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("max_tokens_granted", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("budget_clamped", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("decode_seconds_granted", sa.Float(), nullable=True))
        batch.add_column(
            sa.Column("tokens_in_reserved", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("tokens_out_reserved", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("cost_reserved_usd", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("policy_decision", sa.JSON(none_as_null=True), nullable=True))
        batch.drop_index("ix_steps_dispatch")
        batch.create_index("ix_steps_dispatch", ["status", "pool_id", "priority_rank", "step_id"])
        batch.create_index("ix_steps_admission", ["status", "priority", "step_id"])
    for table, cols in (
        (
            "runs",
            (
                "tokens_in_reserved",
                "tokens_out_reserved",
                "cost_reserved_usd",
                "price_table",
                "policy_hash",
            ),
        ),
        (
            "steps",
            (
                "priority",
                "priority_rank",
                "budget_clamped",
                "tokens_in_reserved",
                "tokens_out_reserved",
                "cost_reserved_usd",
            ),
        ),
    ):
        with op.batch_alter_table(table) as batch:
            for col in cols:
                batch.alter_column(col, server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_index("ix_steps_admission")
        batch.drop_index("ix_steps_dispatch")
        batch.create_index("ix_steps_dispatch", ["status", "pool_id", "step_id"])
        for col in (
            "policy_decision",
            "cost_reserved_usd",
            "tokens_out_reserved",
            "tokens_in_reserved",
            "decode_seconds_granted",
            "budget_clamped",
            "max_tokens_granted",
            "priority_rank",
            "priority",
        ):
            batch.drop_column(col)
    with op.batch_alter_table("runs") as batch:
        for col in (
            "policy_hash",
            "price_table",
            "cost_reserved_usd",
            "tokens_out_reserved",
            "tokens_in_reserved",
        ):
            batch.drop_column(col)
