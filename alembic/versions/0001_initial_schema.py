"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("run_seq", sa.BigInteger(), nullable=False),
        sa.Column("step_id", sa.String(length=40), nullable=True),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.Column("type", sa.String(length=24), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("run_id", "run_seq", name=op.f("uq_events_run_id_run_seq")),
        sa.UniqueConstraint("step_id", "seq", name=op.f("uq_events_step_id_seq")),
    )
    op.create_table(
        "flows",
        sa.Column("flow_id", sa.String(length=80), nullable=False),
        sa.Column("hash", sa.String(length=80), nullable=False),
        sa.Column("ast", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("tools", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("config", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("labels", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("flow_id", name=op.f("pk_flows")),
        sa.UniqueConstraint("hash", name=op.f("uq_flows_hash")),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("flow_id", sa.String(length=80), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("source_run_id", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("budgets", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("policy", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("pool_policy", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("fs_policy", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("cancel_on_disconnect", sa.Boolean(), nullable=True),
        sa.Column("tokens_in_used", sa.BigInteger(), nullable=False),
        sa.Column("tokens_out_used", sa.BigInteger(), nullable=False),
        sa.Column("cost_used_usd", sa.Float(), nullable=False),
        sa.Column("step_count", sa.Integer(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["flow_id"], ["flows.flow_id"], name=op.f("fk_runs_flow_id_flows")),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_flow_id"), ["flow_id"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("checkpoint_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step_id", sa.String(length=40), nullable=True),
        sa.Column("state", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("state_hash", sa.String(length=80), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_checkpoints_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("checkpoint_id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_run", ["run_id", "checkpoint_id"], unique=False)

    op.create_table(
        "facts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("fact_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=200), nullable=False),
        sa.Column("schema_uri", sa.Text(), nullable=True),
        sa.Column("data", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("emitted_by_step", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_facts_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_facts")),
        sa.UniqueConstraint("fact_id", name=op.f("uq_facts_fact_id")),
    )
    with op.batch_alter_table("facts", schema=None) as batch_op:
        batch_op.create_index("ix_facts_run_type", ["run_id", "type", "id"], unique=False)

    op.create_table(
        "steps",
        sa.Column("step_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("client_token", sa.String(length=256), nullable=False),
        sa.Column("request_hash", sa.String(length=80), nullable=False),
        sa.Column("input", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("budgets", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("placement", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("cancel_on_disconnect", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("pool_id", sa.String(length=128), nullable=True),
        sa.Column("replica_id", sa.String(length=128), nullable=True),
        sa.Column("output", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("tokens_in", sa.BigInteger(), nullable=False),
        sa.Column("tokens_out", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("provenance", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_steps_run_id_runs")),
        sa.PrimaryKeyConstraint("step_id", name=op.f("pk_steps")),
        sa.UniqueConstraint("run_id", "client_token", name=op.f("uq_steps_run_id_client_token")),
        sa.UniqueConstraint("run_id", "position", name=op.f("uq_steps_run_id_position")),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index("ix_steps_dispatch", ["status", "pool_id", "step_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index("ix_steps_dispatch")

    op.drop_table("steps")
    with op.batch_alter_table("facts", schema=None) as batch_op:
        batch_op.drop_index("ix_facts_run_type")

    op.drop_table("facts")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_run")

    op.drop_table("checkpoints")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_flow_id"))

    op.drop_table("runs")
    op.drop_table("flows")
    op.drop_table("events")
