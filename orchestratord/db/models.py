"""SQL tables. Changes here need an Alembic migration (tests fail on drift)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

BigIntPk = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON(none_as_null=True)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: use orchestrator_core.clock.now()")
        return value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


Ts = UtcDateTime()


class Base(DeclarativeBase):
    metadata = sa.MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


def _retry_token() -> Mapped[str | None]:
    """A client's token for a write it may retry (``orchestratord.idempotency``); not bundled."""
    return mapped_column(sa.String(256), nullable=True, info={"bundle": False})


def _request_hash() -> Mapped[str | None]:
    """The hash of the request that wrote the row under its token; not bundled."""
    return mapped_column(sa.String(80), nullable=True, info={"bundle": False})


class Flow(Base):
    __tablename__ = "flows"
    flow_id: Mapped[str] = mapped_column(sa.String(80), primary_key=True)
    hash: Mapped[str] = mapped_column(sa.String(80), unique=True)
    ast: Mapped[Any] = mapped_column(Json)
    tools: Mapped[list[dict[str, Any]]] = mapped_column(Json)
    config: Mapped[dict[str, Any]] = mapped_column(Json)
    labels: Mapped[dict[str, str]] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(Ts)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        sa.Index("uq_runs_flow_id_client_token", "flow_id", "client_token", unique=True),
    )
    run_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    flow_id: Mapped[str] = mapped_column(sa.ForeignKey("flows.flow_id"), index=True)
    mode: Mapped[str] = mapped_column(sa.String(16))
    seed: Mapped[int] = mapped_column(sa.BigInteger)
    # The creator gave the seed (else the server drew it): a seeded run's sampling steps go
    # only to engines that take a seed (orchestrator_core.placement, "Seeds").
    seed_given: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    source_run_id: Mapped[str | None] = mapped_column(sa.String(40))
    status: Mapped[str] = mapped_column(sa.String(16))
    budgets: Mapped[dict[str, Any]] = mapped_column(Json)
    policy: Mapped[dict[str, Any]] = mapped_column(Json)
    pool_policy: Mapped[Any] = mapped_column(Json)
    fs_policy: Mapped[dict[str, Any]] = mapped_column(Json)
    cancel_on_disconnect: Mapped[bool | None] = mapped_column(sa.Boolean)
    tokens_in_used: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_out_used: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cost_used_usd: Mapped[float] = mapped_column(sa.Float, default=0.0)
    tokens_in_reserved: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_out_reserved: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cost_reserved_usd: Mapped[float] = mapped_column(sa.Float, default=0.0)
    # Settled steps whose model had no price: their cost is not in cost_used_usd (unknown).
    unpriced_steps: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    price_table: Mapped[str] = mapped_column(sa.String(64))
    policy_hash: Mapped[str] = mapped_column(sa.String(80))
    step_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    # Next run-level event cursor; bumped under the row lock so cursors follow commit order.
    event_seq: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    # The interpreter's last word (``complete``) and when the run ended, for any end.
    output: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(Ts, nullable=True)
    forked_from: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Ts)
    updated_at: Mapped[datetime] = mapped_column(Ts)
    client_token: Mapped[str | None] = _retry_token()
    request_hash: Mapped[str | None] = _request_hash()


class Step(Base):
    __tablename__ = "steps"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "client_token"),
        sa.UniqueConstraint("run_id", "position"),
        sa.Index("ix_steps_dispatch", "status", "pool_id", "priority_rank", "step_id"),
        sa.Index("ix_steps_admission", "status", "priority", "step_id"),
        sa.Index("ix_steps_lease", "status", "lease_expires_at"),
    )
    step_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.run_id"))
    position: Mapped[int] = mapped_column(sa.Integer)
    type: Mapped[str] = mapped_column(sa.String(16))
    client_token: Mapped[str] = mapped_column(sa.String(256))
    request_hash: Mapped[str] = mapped_column(sa.String(80))
    input: Mapped[dict[str, Any]] = mapped_column(Json)
    budgets: Mapped[dict[str, Any] | None] = mapped_column(Json)
    placement: Mapped[Any | None] = mapped_column(Json, nullable=True)
    cancel_on_disconnect: Mapped[bool] = mapped_column(sa.Boolean)
    status: Mapped[str] = mapped_column(sa.String(16))
    priority: Mapped[str] = mapped_column(sa.String(16))
    priority_rank: Mapped[int] = mapped_column(sa.SmallInteger)
    max_tokens_granted: Mapped[int | None] = mapped_column(sa.Integer)
    budget_clamped: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    decode_seconds_granted: Mapped[float | None] = mapped_column(sa.Float)
    tokens_in_reserved: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_out_reserved: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cost_reserved_usd: Mapped[float] = mapped_column(sa.Float, default=0.0)
    policy_decision: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # Why the step went where it went: the rule, each candidate replica and its reason.
    placement_decision: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    pool_id: Mapped[str | None] = mapped_column(sa.String(128))
    replica_id: Mapped[str | None] = mapped_column(sa.String(128))
    output: Mapped[dict[str, Any] | None] = mapped_column(Json)
    tokens_in: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_out: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    # None: its model had no price, so what it cost is not known (never a silent 0)
    cost_usd: Mapped[float | None] = mapped_column(sa.Float, default=0.0)
    provenance: Mapped[dict[str, Any] | None] = mapped_column(Json)
    error: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # Replay runs: the recorded step this one reproduces, and the verdict once it has ended
    # (identical | diverged | miss | failed | cancelled).
    replay_of: Mapped[str | None] = mapped_column(sa.String(40))
    replay_outcome: Mapped[str | None] = mapped_column(sa.String(16))
    # A running step is leased to the process executing it (``<instance>#<incarnation>``)
    # until ``lease_expires_at``, which that process renews; an expired lease is reaped.
    lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(Ts)
    attempts: Mapped[int] = mapped_column(sa.SmallInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(Ts)
    started_at: Mapped[datetime | None] = mapped_column(Ts)
    ended_at: Mapped[datetime | None] = mapped_column(Ts)


class Event(Base):
    """The append-only event log: per step ``(step_id, seq)``, per run ``(run_id, run_seq)``.

    ``data`` holds the encoded JSON exactly as streamed, so it is encoded once. Read it
    through ``orchestratord.eventlog``, which expands coalesced rows into events.
    """

    __tablename__ = "events"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "run_seq"),
        sa.UniqueConstraint("step_id", "seq"),
    )
    id: Mapped[int] = mapped_column(BigIntPk, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(sa.String(40))
    run_seq: Mapped[int] = mapped_column(sa.BigInteger)
    step_id: Mapped[str | None] = mapped_column(sa.String(40))
    seq: Mapped[int | None] = mapped_column(sa.BigInteger)  # as wide as the cursors clients send
    type: Mapped[str] = mapped_column(sa.String(24))
    data: Mapped[str] = mapped_column(sa.Text)
    # How many consecutive events the row holds (token events coalesced by the writer:
    # ``seq``/``run_seq`` are the first one's, ``data`` their JSON texts joined by newlines).
    # Storage only: a bundle lists one row per event.
    span: Mapped[int] = mapped_column(
        sa.Integer, default=1, server_default="1", info={"bundle": False}
    )


class Fact(Base):
    __tablename__ = "facts"
    __table_args__ = (
        sa.Index("ix_facts_run_type", "run_id", "type", "id"),
        sa.Index("uq_facts_run_id_client_token", "run_id", "client_token", unique=True),
    )
    id: Mapped[int] = mapped_column(BigIntPk, primary_key=True, autoincrement=True)
    fact_id: Mapped[str] = mapped_column(sa.String(40), unique=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.run_id"))
    type: Mapped[str] = mapped_column(sa.String(200))
    schema_uri: Mapped[str | None] = mapped_column(sa.Text)
    data: Mapped[Any] = mapped_column(Json)
    emitted_by_step: Mapped[str | None] = mapped_column(sa.String(40))
    created_at: Mapped[datetime] = mapped_column(Ts)
    client_token: Mapped[str | None] = _retry_token()
    request_hash: Mapped[str | None] = _request_hash()


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        sa.Index("ix_checkpoints_run", "run_id", "checkpoint_id"),
        sa.Index("uq_checkpoints_run_id_client_token", "run_id", "client_token", unique=True),
    )
    checkpoint_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.run_id"))
    step_id: Mapped[str | None] = mapped_column(sa.String(40))
    state: Mapped[dict[str, Any]] = mapped_column(Json)
    state_hash: Mapped[str] = mapped_column(sa.String(80))
    # The server's side when it was taken: last fact, last step position, budget usage.
    cursors: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Ts)
    client_token: Mapped[str | None] = _retry_token()
    request_hash: Mapped[str | None] = _request_hash()


class ApiKey(Base):
    """An API key: only a digest of its secret is kept (``orchestrator_core.keys``)."""

    __tablename__ = "api_keys"
    key_id: Mapped[str] = mapped_column(sa.String(12), primary_key=True)
    name: Mapped[str | None] = mapped_column(sa.String(200))
    scope: Mapped[str] = mapped_column(sa.String(8))
    salt: Mapped[str] = mapped_column(sa.String(32))
    digest: Mapped[str] = mapped_column(sa.String(80))
    created_at: Mapped[datetime] = mapped_column(Ts)
    revoked_at: Mapped[datetime | None] = mapped_column(Ts, nullable=True)


class KeyUsage(Base):
    """Requests and tokens of one key in one minute, summed over every process."""

    __tablename__ = "key_usage"
    key_id: Mapped[str] = mapped_column(sa.String(12), primary_key=True)
    minute: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    requests: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class ReplicaState(Base):
    """An operator's word on a replica, shared by every process: draining (no new steps)."""

    __tablename__ = "replica_states"
    pool_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    replica_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    draining: Mapped[bool] = mapped_column(sa.Boolean)
    updated_at: Mapped[datetime] = mapped_column(Ts)


class PoolRow(Base):
    """A pool as data: declared by the pools file, created through the API, or provisioned.

    ``spec`` is the pool as the pools file writes it (``orchestratord.pools.config.PoolSpec``);
    ``provision`` says, for a provisioned pool, who started its engines and how to stop them.
    Every process builds its pools from these rows (``orchestratord.pools.store``)."""

    __tablename__ = "pools"
    pool_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    source: Mapped[str] = mapped_column(sa.String(16))  # file | api | provisioned
    spec: Mapped[dict[str, Any]] = mapped_column(Json)
    provision: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Ts)
    updated_at: Mapped[datetime] = mapped_column(Ts)
