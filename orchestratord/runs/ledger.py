"""The run ledger in SQL: reserve a step's worst case atomically, settle it to actual usage."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, Protocol, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.budgets import (
    COST_MARGIN,
    METERED,
    Ledger,
    Limits,
    Metered,
    Reservation,
    fits,
)
from orchestrator_core.lifecycle import RunStatus
from orchestratord.db.models import Run
from orchestratord.db.prepared import Prepared
from orchestratord.tx import Tx


class Held(Protocol):
    """What a step holds of its run's budget (a ``Step`` row, or the columns of one)."""

    @property
    def run_id(self) -> str: ...
    @property
    def tokens_in_reserved(self) -> int: ...
    @property
    def tokens_out_reserved(self) -> int: ...
    @property
    def cost_reserved_usd(self) -> float: ...


class RunState(NamedTuple):
    """A run's status and end, read under its row lock."""

    status: str
    ended_at: datetime | None


def usage_of(run: Run) -> dict[str, Any]:
    """What the run's settled steps used, as the API, gates and checkpoints show it. A total
    over steps of which some have no known cost (unpriced models) is not known either:
    ``cost_usd`` is then null, and ``priced_cost_usd`` is the sum over the priced ones."""
    return {
        "tokens_in": run.tokens_in_used,
        "tokens_out": run.tokens_out_used,
        "cost_usd": run.cost_used_usd if run.unpriced_steps == 0 else None,
        "priced_cost_usd": run.cost_used_usd,
        "unpriced_steps": run.unpriced_steps,
    }


async def read_ledger(session: AsyncSession, *, run_id: str) -> Ledger:
    return (await read_account(session, run_id=run_id))[1]


async def read_account(session: AsyncSession, *, run_id: str) -> tuple[str, Ledger]:
    """The run's status and its ledger."""
    row = (
        await session.execute(
            sa.select(
                Run.status,
                Run.tokens_in_used,
                Run.tokens_out_used,
                Run.cost_used_usd,
                Run.tokens_in_reserved,
                Run.tokens_out_reserved,
                Run.cost_reserved_usd,
            ).where(Run.run_id == run_id)
        )
    ).one()
    return row[0], Ledger(*row[1:])


_RUNS = cast(sa.Table, Run.__table__)  # Core statements: no ORM bulk-update pass
_NO_LIMIT = 2**62  # stands for an unset limit, so one prepared statement serves every run


# the run's column of each ``Ledger`` field, in the ledger's order
_LEDGER = {
    "used_in": _RUNS.c.tokens_in_used,
    "used_out": _RUNS.c.tokens_out_used,
    "used_cost": _RUNS.c.cost_used_usd,
    "reserved_in": _RUNS.c.tokens_in_reserved,
    "reserved_out": _RUNS.c.tokens_out_reserved,
    "reserved_cost": _RUNS.c.cost_reserved_usd,
}
# the parameters of each metered limit (``budgets.METERED``): the step's need, the limit
_NEED_AND_LIMIT = {
    "max_tokens_in": ("tokens_in", "max_in", sa.BigInteger),
    "max_tokens_out": ("tokens_out", "max_out", sa.BigInteger),
    "max_cost_usd": ("cost", "max_cost", sa.Float),
}


def _fits(m: Metered) -> sa.ColumnElement[bool]:
    need, limit, type_ = _NEED_AND_LIMIT[m.limit]
    used, held = _LEDGER[m.used], _LEDGER[m.reserved]
    return cast(
        sa.ColumnElement[bool],
        fits(used, held, sa.bindparam(need, type_=type_), sa.bindparam(limit, type_=type_)),
    )


# the conditional UPDATE of ``reserve`` (parameters: ``reserve_params``; its row: ``reserved``):
# the run still takes steps, and the step fits each metered limit by the budget rule
RESERVE = (
    _RUNS.update()
    .where(
        _RUNS.c.run_id == sa.bindparam("b_run_id"),
        _RUNS.c.status == RunStatus.RUNNING.value,  # a run that still takes steps
        *(_fits(m) for m in METERED),
    )
    .values(
        step_count=_RUNS.c.step_count + 1,
        updated_at=sa.bindparam("b_now", type_=_RUNS.c.updated_at.type),
        **{
            _LEDGER[m.reserved].key: _LEDGER[m.reserved] + sa.bindparam(_NEED_AND_LIMIT[m.limit][0])
            for m in METERED
        },
    )
    .returning(_RUNS.c.step_count, *_LEDGER.values())
)
_RESERVE = Prepared(RESERVE)


def reserve_params(
    run_id: str, limits: Limits, reservation: Reservation, *, cost_margin: float = COST_MARGIN
) -> dict[str, Any]:
    """The parameters of ``RESERVE`` for this reservation under the run's limits; it fits
    up to ``cost_margin`` past the cost limit (negative: only with that much to spare)."""
    return {
        "b_run_id": run_id,
        "tokens_in": reservation.tokens_in,
        "tokens_out": reservation.tokens_out,
        "cost": reservation.cost_usd,
        "max_in": _NO_LIMIT if limits.max_tokens_in is None else limits.max_tokens_in,
        "max_out": _NO_LIMIT if limits.max_tokens_out is None else limits.max_tokens_out,
        "max_cost": (
            float(_NO_LIMIT) if limits.max_cost_usd is None else limits.max_cost_usd + cost_margin
        ),
        "b_now": clock.now(),
    }


def reserved(row: tuple[Any, ...]) -> tuple[int, Ledger]:
    """``RESERVE``'s row: the step's position and the run's ledger after the reservation."""
    return row[0] - 1, Ledger(*row[1:7])


async def reserve(
    tx: Tx | AsyncSession, *, run_id: str, limits: Limits, reservation: Reservation
) -> tuple[int, Ledger] | None:
    """Take the step's position and add its reservation, only if it still fits.

    One conditional UPDATE: the condition re-checks every limit inside the database, so two
    processes racing for the last tokens cannot both win, whatever they read before. Returns
    (position, the run's ledger after it), or None when it no longer fits or the run no
    longer takes steps (it ended since it was read).
    """
    row = await _RESERVE.first(tx, reserve_params(run_id, limits, reservation))
    return None if row is None else reserved(row)


_UNRESERVE = (
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(
        step_count=_RUNS.c.step_count - 1,
        tokens_in_reserved=_RUNS.c.tokens_in_reserved
        - sa.bindparam("tokens_in", type_=sa.BigInteger),
        tokens_out_reserved=_RUNS.c.tokens_out_reserved
        - sa.bindparam("tokens_out", type_=sa.BigInteger),
        cost_reserved_usd=_RUNS.c.cost_reserved_usd - sa.bindparam("cost", type_=sa.Float),
    )
)


async def unreserve(session: AsyncSession, *, run_id: str, reservation: Reservation) -> None:
    """Give back, in the same transaction, what ``reserve`` took (the position and the
    reservation): the run's row is still locked by that update, so nothing came between."""
    params = {
        "b_run_id": run_id,
        "tokens_in": reservation.tokens_in,
        "tokens_out": reservation.tokens_out,
        "cost": reservation.cost_usd,
    }
    await session.execute(_UNRESERVE, params)


async def settle(
    tx: Tx | AsyncSession,
    *,
    step: Held,
    tokens_in: int,
    tokens_out: int,
    cost_usd: float | None,
) -> RunState:
    """Release the step's reservation and charge what it used, in the caller's transaction;
    the run's status and end as that update left them (its row is locked until commit).

    A cost of ``None`` (the step's model had no price) is not known, so it is not added: the
    run counts the step in ``unpriced_steps`` and its ``cost_used_usd`` stays the sum over
    priced steps, which is what a cost budget counts (an unpriced model never runs under
    one)."""
    params = used_params(tokens_in, tokens_out, cost_usd)
    params.update(
        b_run_id=step.run_id,
        held_in=step.tokens_in_reserved,
        held_out=step.tokens_out_reserved,
        held_cost=step.cost_reserved_usd,
    )
    ((status, ended_at),) = await _SETTLE.rows(tx, params)
    return RunState(status, ended_at)


class Used(NamedTuple):
    """What a settling step used, as expressions of its statement."""

    tokens_in: Any
    tokens_out: Any
    cost_usd: Any  # 0 for an unpriced model
    unpriced: Any  # 1 for an unpriced model, else 0
    now: Any


# ``used_params``' parameters
USED_PARAMS = Used(
    sa.bindparam("used_in", type_=sa.BigInteger),
    sa.bindparam("used_out", type_=sa.BigInteger),
    sa.bindparam("used_cost", type_=sa.Float),
    sa.bindparam("unpriced", type_=sa.Integer),
    sa.bindparam("b_now", type_=_RUNS.c.updated_at.type),
)


def settled(
    held_in: Any, held_out: Any, held_cost: Any, used: Used = USED_PARAMS
) -> dict[str, Any]:
    """The values of a run's row once a step that held ``held_*`` (parameters, or columns of
    another table in the statement) has settled; what it used: ``used``, by default the
    parameters ``used_params`` gives."""
    return {
        "tokens_in_used": _RUNS.c.tokens_in_used + used.tokens_in,
        "tokens_out_used": _RUNS.c.tokens_out_used + used.tokens_out,
        "cost_used_usd": _RUNS.c.cost_used_usd + used.cost_usd,
        "unpriced_steps": _RUNS.c.unpriced_steps + used.unpriced,
        "tokens_in_reserved": _RUNS.c.tokens_in_reserved - held_in,
        "tokens_out_reserved": _RUNS.c.tokens_out_reserved - held_out,
        "cost_reserved_usd": _RUNS.c.cost_reserved_usd - held_cost,
        "updated_at": used.now,
    }


def used_params(tokens_in: int, tokens_out: int, cost_usd: float | None) -> dict[str, Any]:
    """The parameters of ``settled`` for what a step used (a cost of None: not priced)."""
    return {
        "used_in": tokens_in,
        "used_out": tokens_out,
        "used_cost": 0.0 if cost_usd is None else cost_usd,
        "unpriced": 1 if cost_usd is None else 0,
        "b_now": clock.now(),
    }


_SETTLE = Prepared(
    _RUNS.update()
    .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
    .values(
        settled(
            sa.bindparam("held_in", type_=sa.BigInteger),
            sa.bindparam("held_out", type_=sa.BigInteger),
            sa.bindparam("held_cost", type_=sa.Float),
        )
    )
    .returning(_RUNS.c.status, _RUNS.c.ended_at)
)
