"""The run ledger in SQL: reserve a step's worst case atomically, settle it to actual usage."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.budgets import Ledger, Limits, Reservation
from orchestrator_core.errors import Conflict
from orchestratord.db.models import Run, Step


async def read_ledger(session: AsyncSession, *, run_id: str) -> Ledger:
    row = (
        await session.execute(
            sa.select(
                Run.tokens_in_used,
                Run.tokens_out_used,
                Run.cost_used_usd,
                Run.tokens_in_reserved,
                Run.tokens_out_reserved,
                Run.cost_reserved_usd,
            ).where(Run.run_id == run_id)
        )
    ).one()
    return Ledger(*row)


async def reserve(
    session: AsyncSession, *, run_id: str, limits: Limits, reservation: Reservation
) -> None:
    """Add the reservation to the run, only if it still fits: one conditional UPDATE.

    The condition re-checks every limit inside the database, so two processes racing for
    the last tokens cannot both win, whatever they read before.
    """
    conditions = [Run.run_id == run_id]
    if limits.max_tokens_in is not None:
        conditions.append(
            Run.tokens_in_used + Run.tokens_in_reserved + reservation.tokens_in
            <= limits.max_tokens_in
        )
    if limits.max_tokens_out is not None:
        conditions.append(
            Run.tokens_out_used + Run.tokens_out_reserved + reservation.tokens_out
            <= limits.max_tokens_out
        )
    if limits.max_cost_usd is not None:
        conditions.append(
            Run.cost_used_usd + Run.cost_reserved_usd + reservation.cost_usd
            <= limits.max_cost_usd + 1e-9
        )
    result = await session.execute(
        sa.update(Run)
        .where(*conditions)
        .values(
            tokens_in_reserved=Run.tokens_in_reserved + reservation.tokens_in,
            tokens_out_reserved=Run.tokens_out_reserved + reservation.tokens_out,
            cost_reserved_usd=Run.cost_reserved_usd + reservation.cost_usd,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict("the run's budget changed while reserving; retry", retriable=True)


async def settle(
    session: AsyncSession,
    *,
    step: Step,
    tokens_in: int,
    tokens_out: int,
    cost_usd: float,
) -> None:
    """Release the step's reservation and charge what it used, in the caller's transaction."""
    await session.execute(
        sa.update(Run)
        .where(Run.run_id == step.run_id)
        .values(
            tokens_in_used=Run.tokens_in_used + tokens_in,
            tokens_out_used=Run.tokens_out_used + tokens_out,
            cost_used_usd=Run.cost_used_usd + cost_usd,
            tokens_in_reserved=Run.tokens_in_reserved - step.tokens_in_reserved,
            tokens_out_reserved=Run.tokens_out_reserved - step.tokens_out_reserved,
            cost_reserved_usd=Run.cost_reserved_usd - step.cost_reserved_usd,
            updated_at=clock.now(),
        )
        .execution_options(synchronize_session=False)
    )
