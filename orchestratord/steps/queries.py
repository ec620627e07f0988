"""Reads of steps, and the dispatcher's claim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core.budgets import Ledger
from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import Event, Run, Step
from orchestratord.db.prepared import Prepared
from orchestratord.tx import Tx

# Statements on request paths are built once (bound parameters), not per call: building a
# select costs more Python than SQLite takes to run it.
_BY_TOKEN = sa.select(Step).where(
    Step.run_id == sa.bindparam("run_id"), Step.client_token == sa.bindparam("token")
)
_BY_ID = sa.select(Step).where(Step.step_id == sa.bindparam("step_id"))
_BY_ID_LOCKED = _BY_ID.with_for_update(key_share=True)
_CANCEL_ON_DISCONNECT = sa.select(Step.cancel_on_disconnect).where(
    Step.step_id == sa.bindparam("step_id")
)


async def by_token(session: AsyncSession, run_id: str, token: str) -> Step | None:
    return (
        await session.execute(_BY_TOKEN, {"run_id": run_id, "token": token})
    ).scalar_one_or_none()


def same_request(step: Step, request_hash: str) -> Step:
    if step.request_hash != request_hash:
        raise Conflict(
            "client_token was already used in this run for a different request",
            details={"client_token": step.client_token, "step_id": step.step_id},
        )
    return step


async def get_step(session: AsyncSession, *, step_id: str, lock: bool = False) -> Step:
    stmt = _BY_ID_LOCKED if lock else _BY_ID
    step = (await session.execute(stmt, {"step_id": step_id})).scalar_one_or_none()
    if step is None:
        raise NotFound("step", step_id)
    return step


async def next_seq(session: AsyncSession, *, step_id: str) -> int:
    """The seq the step's next event takes (0 for an empty log)."""
    last = (
        await session.execute(
            sa.select(sa.func.max(Event.seq + Event.span - 1)).where(Event.step_id == step_id)
        )
    ).scalar_one()
    return 0 if last is None else int(last) + 1


async def cancel_on_disconnect(session: AsyncSession, *, step_id: str) -> bool:
    """The one column a stream needs of its step (404 when there is no such step)."""
    found = (await session.execute(_CANCEL_ON_DISCONNECT, {"step_id": step_id})).first()
    if found is None:
        raise NotFound("step", step_id)
    return bool(found[0])


async def list_steps(session: AsyncSession, *, run_id: str) -> list[Step]:
    rows = await session.execute(
        sa.select(Step).where(Step.run_id == run_id).order_by(Step.position)
    )
    return list(rows.scalars())


def shown_status(step: Step) -> str:
    """The status the API shows: a running step asked to cancel is ``cancelling``."""
    status = step.status
    if status == StepStatus.RUNNING.value and step.cancel_requested:
        return "cancelling"
    return status


def step_view(step: Step) -> dict[str, Any]:
    status = shown_status(step)
    return {
        **{
            c: getattr(step, c)
            for c in (
                "step_id",
                "run_id",
                "position",
                "type",
                "client_token",
                "cancel_requested",
                "input",
                "budgets",
                "placement",
                "pool_id",
                "replica_id",
                "output",
                "provenance",
                "error",
                "replay_of",
                "replay_outcome",
                "created_at",
                "started_at",
                "ended_at",
            )
        },
        "status": status,
        "priority": step.priority,
        "usage": {
            "tokens_in": step.tokens_in,
            "tokens_out": step.tokens_out,
            "cost_usd": step.cost_usd,
        },
        "reserved": {
            "tokens_in": step.tokens_in_reserved,
            "tokens_out": step.tokens_out_reserved,
            "cost_usd": step.cost_reserved_usd,
        },
        "max_tokens_granted": step.max_tokens_granted,
        "budget_clamped": step.budget_clamped,
        "policy_decision": step.policy_decision,
        "placement_decision": step.placement_decision,
    }


def _claim(control: bool, skip_full: bool) -> Any:
    where = [
        Step.status == StepStatus.QUEUED.value,
        Step.pool_id.is_(None) if control else Step.pool_id == sa.bindparam("pool_id"),
    ]
    if skip_full:
        full: Any = sa.bindparam("full", expanding=True)
        where.append(sa.or_(Step.replay_of.is_(None), Step.replica_id.not_in(full)))
    return (
        sa.select(Step, Run)
        .join(Run, Run.run_id == Step.run_id)
        .where(*where)
        .order_by(Step.priority_rank, Step.step_id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(of=Step, skip_locked=True)
    )


# by (control-plane lane, passing over full replicas)
_CLAIM = {(c, f): _claim(c, f) for c in (True, False) for f in (True, False)}


async def claim_queued(
    session: AsyncSession, *, pool_id: str | None, limit: int, full_replicas: Sequence[str] = ()
) -> list[tuple[Step, Run]]:
    """Lock up to ``limit`` queued steps of a pool (``None``: the steps that run in the
    control plane): interactive before batch, FIFO within a priority (SKIP LOCKED on
    PostgreSQL, so processes never claim the same step).

    Steps pinned to a replica in ``full_replicas`` (strict_replay) are passed over, so they
    wait for their replica without holding back steps that can run elsewhere."""
    stmt = _CLAIM[(pool_id is None, bool(full_replicas))]
    params: dict[str, Any] = {"limit": limit}
    if pool_id is not None:
        params["pool_id"] = pool_id
    if full_replicas:
        params["full"] = list(full_replicas)
    rows = (await session.execute(stmt, params)).all()
    return [(step, run) for step, run in rows]


# the lanes where a step is queued: pools' ids, None for the control plane's
_QUEUED_LANES = Prepared(
    sa.select(Step.pool_id).where(Step.status == StepStatus.QUEUED.value).distinct()
)


async def queued_lanes(tx: Tx) -> set[str | None]:
    """The lanes where a step is queued now (one read: on PostgreSQL no transaction)."""
    return {row[0] for row in await _QUEUED_LANES.rows(tx)}


async def queued_counts(session: AsyncSession) -> dict[str, int]:
    rows = (
        await session.execute(
            sa.select(Step.pool_id, sa.func.count())
            .where(Step.status == StepStatus.QUEUED.value)
            .group_by(Step.pool_id)
        )
    ).all()
    return {str(pool): int(n) for pool, n in rows if pool is not None}


async def cancel_requested_among(session: AsyncSession, *, step_ids: list[str]) -> list[str]:
    if not step_ids:
        return []
    rows = await session.execute(
        sa.select(Step.step_id).where(Step.step_id.in_(step_ids), Step.cancel_requested.is_(True))
    )
    return list(rows.scalars())


def ledger_of(run: Run) -> Ledger:
    return Ledger(
        used_in=run.tokens_in_used,
        used_out=run.tokens_out_used,
        used_cost=run.cost_used_usd,
        reserved_in=run.tokens_in_reserved,
        reserved_out=run.tokens_out_reserved,
        reserved_cost=run.cost_reserved_usd,
    )


async def queue_narration(session: AsyncSession, *, step_id: str) -> str | None:
    """Where a queued step waits, in words; None once it is no longer queued."""
    step = (
        await session.execute(
            sa.select(Step.status, Step.pool_id, Step.priority_rank).where(Step.step_id == step_id)
        )
    ).one_or_none()
    if step is None or step.status != StepStatus.QUEUED.value:
        return None
    lane = Step.pool_id.is_(None) if step.pool_id is None else Step.pool_id == step.pool_id
    ahead = (
        await session.execute(
            sa.select(sa.func.count())
            .select_from(Step)
            .where(
                Step.status == StepStatus.QUEUED.value,
                lane,
                sa.or_(
                    Step.priority_rank < step.priority_rank,
                    sa.and_(Step.priority_rank == step.priority_rank, Step.step_id < step_id),
                ),
            )
        )
    ).scalar_one()
    where = "a control-plane slot" if step.pool_id is None else f"a slot of pool {step.pool_id}"
    return f"waiting for {where}: position {ahead + 1} in the queue"
