from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from contracts.steps import LlmCallInput, StepCreate
from orchestrator_core import clock
from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import Conflict, InvalidParams, NotFound, Unsupported
from orchestrator_core.event_order import EventOrder, EventType
from orchestrator_core.lifecycle import (
    RunStatus,
    StepStatus,
    check_run_accepts_steps,
    check_step_transition,
)
from orchestrator_core.placement import PoolView, choose_pool
from orchestratord.db.models import Run, Step
from orchestratord.eventlog import make_event
from orchestratord.tx import Tx

SERVED_STEP_TYPES = ("llm_call",)


def validate_step_input(step_type: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Validate ``input`` for its type; errors name ``input.<field>``."""
    if step_type not in SERVED_STEP_TYPES:
        raise Unsupported(
            f"step type {step_type!r} is not served yet",
            details={"field": "type", "supported": list(SERVED_STEP_TYPES)},
        )
    try:
        parsed = LlmCallInput.model_validate(raw)
    except ValidationError as exc:
        errors = [
            {
                "field": ".".join(["input", *(str(p) for p in err["loc"])]),
                "message": err["msg"],
            }
            for err in exc.errors()
        ]
        first = errors[0]
        raise InvalidParams(
            first["message"], field=first["field"], details={"errors": errors}
        ) from exc
    return parsed.model_dump(mode="json", exclude_none=True)


async def submit_step(
    session: AsyncSession,
    *,
    run_id: str,
    body: StepCreate,
    pools: list[PoolView],
    default_cancel_on_disconnect: bool,
) -> tuple[Step, bool]:
    """Store a step once per (run, client_token); a repeat returns the first (created=False)."""
    run = await session.get(Run, run_id)
    if run is None:
        raise NotFound("run", run_id)
    request_hash = sha256_of(body.model_dump(mode="json", exclude={"client_token"}))
    existing = await _by_token(session, run_id, body.client_token)
    if existing is not None:
        return _same_request(existing, request_hash), False
    check_run_accepts_steps(RunStatus(run.status))
    step_input = validate_step_input(body.type, body.input)
    placement = placement_to_json(body.placement)
    effective = placement if placement is not None else run.pool_policy
    pool_id = choose_pool(effective, pools, field="placement" if placement else "pool_policy")
    cod = body.cancel_on_disconnect
    if cod is None:
        cod = run.cancel_on_disconnect
    try:
        async with session.begin_nested():
            position = (
                await session.execute(
                    sa.update(Run)
                    .where(Run.run_id == run_id)
                    .values(step_count=Run.step_count + 1, updated_at=clock.now())
                    .returning(Run.step_count)
                )
            ).scalar_one() - 1
            step = Step(
                step_id=clock.new_id("step"),
                run_id=run_id,
                position=position,
                type=body.type,
                client_token=body.client_token,
                request_hash=request_hash,
                input=step_input,
                budgets=body.budgets.model_dump() if body.budgets else None,
                placement=placement,
                cancel_on_disconnect=default_cancel_on_disconnect if cod is None else cod,
                status=StepStatus.QUEUED.value,
                cancel_requested=False,
                pool_id=pool_id,
                tokens_in=0,
                tokens_out=0,
                cost_usd=0.0,
                created_at=clock.now(),
            )
            session.add(step)
            await session.flush()
    except IntegrityError:
        existing = await _by_token(session, run_id, body.client_token)
        if existing is None:
            raise
        return _same_request(existing, request_hash), False
    return step, True


async def _by_token(session: AsyncSession, run_id: str, token: str) -> Step | None:
    return (
        await session.execute(
            sa.select(Step).where(Step.run_id == run_id, Step.client_token == token)
        )
    ).scalar_one_or_none()


def _same_request(step: Step, request_hash: str) -> Step:
    if step.request_hash != request_hash:
        raise Conflict(
            "client_token was already used in this run for a different request",
            details={"client_token": step.client_token, "step_id": step.step_id},
        )
    return step


async def get_step(session: AsyncSession, *, step_id: str, lock: bool = False) -> Step:
    stmt = sa.select(Step).where(Step.step_id == step_id)
    if lock:
        stmt = stmt.with_for_update(key_share=True)
    step = (await session.execute(stmt)).scalar_one_or_none()
    if step is None:
        raise NotFound("step", step_id)
    return step


def step_view(step: Step) -> dict[str, Any]:
    status = step.status
    if status == StepStatus.RUNNING.value and step.cancel_requested:
        status = "cancelling"
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
                "created_at",
                "started_at",
                "ended_at",
            )
        },
        "status": status,
        "usage": {
            "tokens_in": step.tokens_in,
            "tokens_out": step.tokens_out,
            "cost_usd": step.cost_usd,
        },
    }


async def cancel_step_row(tx: Tx, *, step: Step) -> None:
    """Cancel a step that never started: its whole log is ``started``, ``end{cancelled}``."""
    check_step_transition(StepStatus(step.status), StepStatus.CANCELLED)
    step.status = StepStatus.CANCELLED.value
    step.ended_at = clock.now()
    step.output = {"text": "", "token_ids": [], "stop_reason": "cancelled"}
    order = EventOrder()
    events = [
        make_event(
            step.run_id,
            step.step_id,
            order.accept(EventType.STARTED),
            "started",
            {"pool_id": step.pool_id, "replica_id": None, "engine": None},
        ),
        make_event(
            step.run_id,
            step.step_id,
            order.accept(EventType.END),
            "end",
            {"stop_reason": "cancelled", "tokens_in": 0, "tokens_out": 0, "provenance": None},
        ),
    ]
    await tx.append_events(events)


async def cancel_step(tx: Tx, *, step_id: str) -> tuple[str, bool]:
    """Returns (status to report, whether a running execution must be told)."""
    step = await get_step(tx.session, step_id=step_id, lock=True)
    status = StepStatus(step.status)
    if status.terminal:
        return step.status, False
    if status is StepStatus.QUEUED:
        await cancel_step_row(tx, step=step)
        await settle_run_after_step(tx.session, run_id=step.run_id)
        return step.status, False
    step.cancel_requested = True
    return "cancelling", True


async def claim_queued(
    session: AsyncSession, *, pool_id: str, limit: int
) -> list[tuple[str, str, int, str, dict[str, Any], int]]:
    """Lock up to ``limit`` queued steps of a pool, oldest first (SKIP LOCKED on PostgreSQL)."""
    rows = (
        await session.execute(
            sa.select(Step.step_id, Step.run_id, Step.position, Step.type, Step.input, Run.seed)
            .join(Run, Run.run_id == Step.run_id)
            .where(Step.status == StepStatus.QUEUED.value, Step.pool_id == pool_id)
            .order_by(Step.step_id)
            .limit(limit)
            .with_for_update(of=Step, skip_locked=True)
        )
    ).all()
    return [tuple(r) for r in rows]


async def mark_running(session: AsyncSession, *, step_id: str, replica_id: str) -> None:
    await session.execute(
        sa.update(Step)
        .where(Step.step_id == step_id, Step.status == StepStatus.QUEUED.value)
        .values(status=StepStatus.RUNNING.value, replica_id=replica_id, started_at=clock.now())
    )


async def queued_counts(session: AsyncSession) -> dict[str, int]:
    rows = (
        await session.execute(
            sa.select(Step.pool_id, sa.func.count())
            .where(Step.status == StepStatus.QUEUED.value)
            .group_by(Step.pool_id)
        )
    ).all()
    return {str(pool): int(n) for pool, n in rows}


async def cancel_requested_among(session: AsyncSession, *, step_ids: list[str]) -> list[str]:
    if not step_ids:
        return []
    rows = await session.execute(
        sa.select(Step.step_id).where(Step.step_id.in_(step_ids), Step.cancel_requested.is_(True))
    )
    return list(rows.scalars())


async def settle_run_after_step(session: AsyncSession, *, run_id: str) -> None:
    """A cancelling run becomes cancelled when its last live step has ended."""
    run = (
        await session.execute(
            sa.select(Run).where(Run.run_id == run_id).with_for_update(key_share=True)
        )
    ).scalar_one()
    if run.status != RunStatus.CANCELLING.value:
        return
    live = (
        await session.execute(
            sa.select(sa.func.count())
            .select_from(Step)
            .where(
                Step.run_id == run_id,
                Step.status.in_([StepStatus.QUEUED.value, StepStatus.RUNNING.value]),
            )
        )
    ).scalar_one()
    if live == 0:
        run.status = RunStatus.CANCELLED.value
        run.updated_at = clock.now()
