"""The submission's statements, built once as Core expressions (bound parameters) and
prepared once per dialect (``db/prepared.py``): building a select costs more Python than
SQLite takes to run it."""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import Prepared
from orchestratord.pools.slots import slot_free
from orchestratord.runs.ledger import RESERVE

RUNS = cast(sa.Table, Run.__table__)
STEPS = cast(sa.Table, Step.__table__)
RUN_COLUMNS = tuple(c.key for c in RUNS.columns)
STEP_COLUMNS = tuple(c.key for c in STEPS.columns)

# the run and the step its client_token already made, if one: one statement (a repeated
# request is rare; its step is loaded only then)
RUN_AND_TOKEN = Prepared(
    sa.select(*RUNS.columns, Step.step_id)
    .outerjoin(
        Step,
        sa.and_(Step.run_id == Run.run_id, Step.client_token == sa.bindparam("token")),
    )
    .where(Run.run_id == sa.bindparam("run_id"))
)


def _queued(**where: str) -> list[Any]:
    """Queued steps whose ``column`` equals the parameter ``param``, for each given."""
    clauses: list[Any] = [Step.status == StepStatus.QUEUED.value]
    return clauses + [getattr(Step, col) == sa.bindparam(param) for col, param in where.items()]


# a step of this priority or higher waits in the pool
AHEAD_IN_POOL = Prepared(
    sa.select(
        sa.exists().where(*_queued(pool_id="pool_id"), Step.priority_rank <= sa.bindparam("rank"))
    )
)
QUEUED_AT_PRIORITY = Prepared(
    sa.select(sa.func.count()).select_from(Step).where(*_queued(priority="priority"))
)

INSERT_STEP = Prepared(STEPS.insert())
INSERT_STEP_UNLESS_TOKEN = Prepared(
    pg_insert(STEPS)
    .on_conflict_do_nothing(index_elements=["run_id", "client_token"])
    .returning(STEPS.c.step_id)
)


# PostgreSQL: the pool's queue checked, the reservation and the insert in one statement,
# the step's position taken from the reserved run's row (no step when a step waits ahead or
# the reservation does not fit). Its one row: whether a step waits ahead, then RESERVE's
# columns (null when nothing was reserved). The step's values are its columns' names
# prefixed with ``s_``.
#
# whether a step of this priority or higher waits in the pool (none when ``q_pool`` is null)
_AHEAD = sa.select(
    sa.exists()
    .where(*_queued(pool_id="q_pool"), Step.priority_rank <= sa.bindparam("q_rank"))
    .label("ahead")
).cte("ahead")
# the reservation, unless a step waits ahead (``StartNow`` left the check to this statement),
# in a run that still takes steps and has no step of this client_token (a kept run's status
# and steps were not read; a token taken by a statement not yet committed still fails the
# insert)
_TOKEN_USED = sa.exists().where(
    STEPS.c.run_id == sa.bindparam("b_run_id"),
    STEPS.c.client_token == sa.bindparam("s_client_token"),
)
# whether the slot ``StartNow`` took is free in every process (``pools/slots.py``: the
# pool's lock, held to the statement's end; true when no slot was taken, ``q_replica`` null)
_SLOT = sa.select(
    sa.case(
        (sa.bindparam("q_replica", type_=sa.String).is_(None), sa.true()),
        else_=slot_free(
            sa.bindparam("q_slot_pool", type_=sa.String),
            sa.bindparam("q_replica", type_=sa.String),
            sa.bindparam("q_slots", type_=sa.Integer),
        ),
    ).label("slot")
).cte("slot")
_RESERVED = RESERVE.where(
    ~sa.select(_AHEAD.c.ahead).scalar_subquery(),
    sa.select(_SLOT.c.slot).scalar_subquery(),
    ~_TOKEN_USED,
).cte("reserved")
_INSERTED = (
    STEPS.insert()
    .from_select(
        list(STEPS.columns),
        sa.select(
            *(
                # asyncpg's dialect writes each parameter's type ($1::VARCHAR): no casts here (a
                # cast to VARCHAR(n) would cut a value the insert refuses)
                (_RESERVED.c.step_count - 1)
                if c.key == "position"
                else sa.bindparam(f"s_{c.key}", type_=c.type)
                for c in STEPS.columns
            )
        ),
    )
    .cte("inserted")
)
# its row: whether a step waits ahead, RESERVE's columns, then (as of the statement's start,
# for when nothing was reserved) whether the token's step exists and the run's status, and
# whether the replica's slot was free
RESERVE_AND_INSERT = Prepared(
    sa.select(
        _AHEAD.c.ahead,
        *_RESERVED.c,
        _TOKEN_USED.label("token_used"),
        sa.select(RUNS.c.status)
        .where(RUNS.c.run_id == sa.bindparam("b_run_id"))
        .scalar_subquery()
        .label("run_status"),
        _SLOT.c.slot,
    )
    .select_from(_AHEAD.join(_SLOT, sa.true()).outerjoin(_RESERVED, sa.true()))
    .add_cte(_INSERTED)
)
