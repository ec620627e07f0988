"""The one-statement path (PostgreSQL): a step stored by one statement that commits by
itself, with no BEGIN and no COMMIT of its own.

When nothing has begun in the submission's transaction (its reads ran on their own: a
record step that starts now, or a control step), the pool's queue check that ``StartNow``
left here, the reservation against the run and the insert of the step are one statement
(``statements.RESERVE_AND_INSERT``): four round trips fewer than the general way. It stores
the step, or writes nothing and says why (``Unstored``): what ``Insert`` does then is its
choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sqlalchemy.exc import IntegrityError

from orchestrator_core.admission import PRIORITY_RANK
from orchestrator_core.budgets import COST_MARGIN, UNREAD_COST_MARGIN, BudgetExceeded, Ledger
from orchestrator_core.errors import NotFound
from orchestrator_core.lifecycle import RunStatus, check_run_accepts_steps
from orchestratord.db.prepared import can_run_alone, nothing_written
from orchestratord.runs.ledger import reserve_params, reserved
from orchestratord.steps.submission.context import Submission, Submitted, build_step
from orchestratord.steps.submission.statements import (
    AHEAD_IN_POOL,
    RESERVE_AND_INSERT,
    STEP_COLUMNS,
)


def applies(sub: Submission) -> bool:
    """The step will be stored by one statement that commits by itself (``Insert``)."""
    return not sub.sqlite and sub.target is None and can_run_alone(sub.db)


class Unstored(Enum):
    """Why the one statement stored nothing (it wrote nothing either)."""

    WAITS = "a step of its priority or higher waits in its pool (StartNow took a slot)"
    NO_SLOT = "the slot StartNow took is held in another process (the replica is full)"
    TOKEN_TAKEN = "the client_token's step exists, or its insert conflicted with one"
    NO_FIT = "the reservation does not fit the ledger the submission read"
    LEDGER_UNREAD = "a kept run's ledger shaped the plan or refused it: a read decides"


@dataclass(frozen=True)
class NotStored:
    why: Unstored
    error: IntegrityError | None = None  # TOKEN_TAKEN by a conflicting insert: its error


async def store(sub: Submission) -> Submitted | NotStored:
    """Reserve and insert in one statement run alone, with the ledger the submission read.
    A run that ended since it was read (or kept) is refused as a read would refuse it."""
    unchecked, sub.queue_unchecked = sub.queue_unchecked, False
    rank = PRIORITY_RANK[sub.body.priority]
    try:
        reservation = sub.plan(sub.ledger)
        if sub.kept is not None and reservation != sub.plan(Ledger()):
            return NotStored(Unstored.LEDGER_UNREAD)  # what the ledger holds now decides
    except BudgetExceeded:  # read again; the queue first, as StartNow would have
        if sub.kept is not None:
            return NotStored(Unstored.LEDGER_UNREAD)
        ahead = {"pool_id": sub.pool_id, "rank": rank}
        if unchecked and (await AHEAD_IN_POOL.rows(sub.db, ahead))[0][0]:
            return NotStored(Unstored.WAITS)
        return NotStored(Unstored.NO_FIT)
    step = build_step(sub, position=-1, reservation=reservation)
    started = sub.claim(step)
    held = step.__dict__
    # a kept run's fits only with room to spare for the plan's rounding (see the margins)
    margin = COST_MARGIN if sub.kept is None else UNREAD_COST_MARGIN
    params = reserve_params(sub.run_id, sub.budget.run, reservation, cost_margin=margin)
    params.update({f"s_{c}": held.get(c) for c in STEP_COLUMNS})
    params.update(q_pool=sub.pool_id if unchecked else None, q_rank=rank)
    slot = sub.slot
    params.update(
        q_slot_pool=sub.pool_id,
        q_replica=None if slot is None else slot.replica.replica_id,
        q_slots=None if slot is None else slot.replica.slots,
    )
    if sub.announce is not None:
        sub.announce(step)
    try:
        row = await RESERVE_AND_INSERT.first(sub.db, params, alone=True)
    except IntegrityError as exc:  # a token taken by a statement not yet committed
        return NotStored(Unstored.TOKEN_TAKEN, exc)
    assert row is not None  # one row (see the statement)
    ahead, taken, token_used, status, slot_free = row[0], row[1:8], row[8], row[9], row[10]
    if ahead or taken[0] is None:  # nothing reserved, nothing inserted
        nothing_written(sub.db)
        if ahead:
            return NotStored(Unstored.WAITS)
        if not slot_free:
            return NotStored(Unstored.NO_SLOT)
        if token_used:
            return NotStored(Unstored.TOKEN_TAKEN)
        if status != RunStatus.RUNNING.value:  # ended since it was read (or kept)
            sub.ctx.runs.drop(sub.run_id)
            if status is None:
                raise NotFound("run", sub.run_id)
            check_run_accepts_steps(RunStatus(status))
        return NotStored(Unstored.NO_FIT)  # (or the run ended as the statement ran)
    step.position, ledger = reserved(taken)
    sub.ctx.runs.saw_ledger(sub.run_id, ledger)
    sub.begin_after_commit(started)
    return Submitted(step, True, ledger, sub.run)
