"""``Insert``, the last rule: reserve the step's worst case against its run, store the step.

Two ways. On PostgreSQL, when nothing has begun in the submission's transaction, one
statement that commits by itself (``fast_path``); it stores the step or says why it did
not (``Unstored``), and ``Insert`` goes on from that outcome:

    stored         -> the answer
    (a kept run)   -> ReadAgain: whatever it met, a fresh read of the run decides
    TOKEN_TAKEN    -> the token's step answers (``_taken``)
    WAITS, NO_SLOT -> the slot goes back, the step is admitted, then the general way
    NO_FIT         -> the general way, which reads the ledger again

The general way (SQLite, and whatever the one statement did not store): one conditional
UPDATE reserves (limits re-checked in the database, so concurrent submissions cannot
overshoot; ``runs/ledger.reserve``), then the step is inserted, in the submission's
transaction.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from orchestrator_core.admission import AdmissionPolicy, dropped_error
from orchestrator_core.budgets import BudgetExceeded, Ledger
from orchestrator_core.errors import Conflict
from orchestrator_core.lifecycle import RunStatus, StepStatus, check_run_accepts_steps
from orchestratord.db.models import Step
from orchestratord.runs.ledger import read_account, read_ledger, reserve, unreserve
from orchestratord.steps.queries import by_token
from orchestratord.steps.submission import fast_path
from orchestratord.steps.submission.context import ReadAgain, Submission, Submitted, build_step
from orchestratord.steps.submission.fast_path import Unstored
from orchestratord.steps.submission.rules import Admit
from orchestratord.steps.submission.statements import (
    INSERT_STEP,
    INSERT_STEP_UNLESS_TOKEN,
    STEP_COLUMNS,
)
from orchestratord.steps.transition import end_unstarted
from orchestratord.tx import Tx

_ADMIT = Admit()


class _TokenTaken(Exception):
    """The step's client_token was taken by a submission that committed meanwhile."""


class Insert:
    """Reserve the worst case against the run, then insert the step: in one statement where
    it can (see the module's docstring), else the general way."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if sub.sqlite:  # writes are serialized: the token check above cannot be raced
            step, ledger = await self._reserve_and_insert(sub)
            return Submitted(step, True, ledger, sub.run)
        if sub.verdict == "admit" and fast_path.applies(sub):
            done = await fast_path.store(sub)
            if isinstance(done, Submitted):
                return done
            if sub.kept is not None:  # waits, a repeat, or does not fit: what a read decides
                raise ReadAgain from done.error
            if done.why is Unstored.TOKEN_TAKEN:  # a submission of the token committed first
                return await self._taken(sub, done.error)
            if done.why in (Unstored.WAITS, Unstored.NO_SLOT):  # it waits, admitted
                assert sub.slot is not None
                sub.slot.release()
                sub.slot = None
                await _ADMIT.apply(sub)
            # NO_FIT: the budget did not fit the ledger the submission read: read it again
        if sub.kept is not None:  # no read, no status checked: stored by the one statement only
            raise ReadAgain
        assert not sub.queue_unchecked or sub.slot is None  # only one statement checks it
        try:
            if sub.verdict == "drop_oldest":  # a victim ended: undone with the savepoint
                async with sub.session.begin_nested():
                    step, ledger = await self._reserve_and_insert(sub)
            else:  # the insert gives way to the step that took the token (no savepoint)
                step, ledger = await self._reserve_and_insert(sub, on_conflict=True)
        except (IntegrityError, _TokenTaken) as exc:
            return await self._taken(sub, exc)
        return Submitted(step, True, ledger, sub.run)

    @staticmethod
    async def _taken(sub: Submission, exc: Exception | None) -> Submitted:
        """The client_token's step, made by a submission that committed meanwhile (else
        ``exc`` was about something else: raised again)."""
        existing = await by_token(sub.session, sub.run_id, sub.body.client_token)
        if existing is None:
            raise exc or AssertionError("the token's step was seen, then not found")
        if sub.slot is not None:  # the transaction goes on (and commits): give it back here
            sub.slot.release()
        return sub.repeat(existing)

    async def _reserve_and_insert(
        self, sub: Submission, *, on_conflict: bool = False
    ) -> tuple[Step, Ledger]:
        """The general way, in the submission's transaction."""
        run_id = sub.run_id
        ledger = sub.ledger  # current on SQLite (the write lock is ours); re-read if stale
        for attempt in range(3):
            try:
                reservation = sub.plan(ledger)
            except BudgetExceeded:
                if attempt == 0 and not sub.sqlite:
                    ledger = await read_ledger(sub.session, run_id=run_id)
                    continue
                raise
            taken = await reserve(
                sub.db, run_id=run_id, limits=sub.budget.run, reservation=reservation
            )
            if taken is not None:
                break
            status, ledger = await read_account(sub.session, run_id=run_id)
            check_run_accepts_steps(RunStatus(status))  # it ended since it was read
        else:
            raise Conflict("the run's budget kept changing while reserving; retry", retriable=True)
        position, ledger_after = taken
        if sub.verdict == "drop_oldest":
            await _drop_oldest(sub.tx, sub.ctx.admission, sub.body.priority)
        target = sub.target
        if target is not None and position != target.position:
            raise Conflict(
                "the replay run's position moved during submission; retry", retriable=True
            )
        step = build_step(sub, position=position, reservation=reservation)
        if target is not None and target.recorded is not None:
            step.replay_of = target.recorded.step_id
            step.replica_id = target.recorded.replica_id  # pinned: the dispatcher honours it
        started = sub.claim(step)
        # a Core insert of the whole row: the unit of work costs more than the insert
        held = step.__dict__  # the columns as set (build_step, the claim), past the descriptors
        row = {c: held.get(c) for c in STEP_COLUMNS}
        if sub.announce is not None:
            sub.announce(step)
        if on_conflict:  # PostgreSQL: a concurrent submission of the token committed first
            if await INSERT_STEP_UNLESS_TOKEN.first(sub.db, row) is None:
                await unreserve(sub.session, run_id=run_id, reservation=reservation)
                raise _TokenTaken
        else:
            await INSERT_STEP.rows(sub.db, row)
        sub.begin_after_commit(started)
        return step, ledger_after


async def _drop_oldest(tx: Tx, policy: AdmissionPolicy, priority: str) -> None:
    """Make room: the step that waited longest in this queue ends with QUEUE_FULL_DROP_LRU."""
    victim = (
        await tx.session.execute(
            sa.select(Step)
            .where(Step.status == StepStatus.QUEUED.value, Step.priority == priority)
            .order_by(Step.step_id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
    ).scalar_one_or_none()
    if victim is None:
        return
    error = dropped_error(priority, policy.capacity[priority])
    await end_unstarted(tx, step=victim, status=StepStatus.FAILED, error=error.body())
