"""Step leases: a running step belongs to the process executing it until its lease expires.

A claim grants the lease (``<instance>#<incarnation>``, an expiry ``lease_s`` ahead); the
process renews all its leases in one statement every third of ``lease_s``. A lease that
expired means its process is gone (or stalled past it): any process reaps the step.

Reaping: a step that committed no token, of a kind that may run again, is queued again (at
most ``max_attempts`` executions, each said in a narration); any other ends with a retriable
``WORKER_LOST`` error that keeps the text it committed and is charged what it used, and its
reservation goes back to its run. A process that restarts under the same instance name reaps
at once the steps its earlier incarnation held, without waiting for their expiry.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import NarrationEvent
from orchestrator_core import clock
from orchestrator_core.event_order import EventType
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.pricing import Price
from orchestratord.db.models import Run, Step
from orchestratord.eventlog import log_event, read_all_step_events
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.transition import end_interrupted, transition
from orchestratord.tx import Tx

WORKER_LOST = "WORKER_LOST"

PriceOf = Callable[[Step, Run], "Price | None"]


@dataclass(frozen=True)
class LeaseTerms:
    instance: str  # stable across restarts: <hostname>:<port> unless configured
    incarnation: str  # this process
    lease_s: float
    max_attempts: int

    @classmethod
    def for_process(
        cls, instance: str | None, *, port: int, lease_s: float, max_attempts: int
    ) -> LeaseTerms:
        return cls(
            instance=instance or f"{socket.gethostname()}:{port}",
            incarnation=uuid.uuid4().hex[:12],
            lease_s=lease_s,
            max_attempts=max_attempts,
        )

    @property
    def owner(self) -> str:
        return f"{self.instance}#{self.incarnation}"

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    def grant(self, step: Step) -> None:
        """Lease a step being claimed (it is moving to running in the caller's transaction)."""
        step.lease_owner = self.owner
        step.lease_expires_at = clock.now() + timedelta(seconds=self.lease_s)
        step.attempts = (step.attempts or 0) + 1


_RENEW = (
    sa.update(Step)
    .where(
        Step.lease_owner == sa.bindparam("owner"),
        Step.status == StepStatus.RUNNING.value,
        Step.step_id.in_(sa.bindparam("ids", expanding=True)),
    )
    .values(lease_expires_at=sa.bindparam("until", type_=Step.lease_expires_at.type))
    .returning(Step.step_id)
)
_RENEW_CHUNK = 4096  # step ids per statement (SQLite's limit on parameters is 32,766)


async def renew(session: AsyncSession, terms: LeaseTerms, step_ids: Sequence[str]) -> set[str]:
    """Push ``lease_s`` ahead the leases this process holds on ``step_ids`` (the steps it
    runs); the ones it still holds. A step leased to it that it does not run (its submission
    committed as its request was cancelled) is left to expire and be reaped."""
    until = clock.now() + timedelta(seconds=terms.lease_s)
    held: set[str] = set()
    for i in range(0, len(step_ids), _RENEW_CHUNK):
        rows = await session.execute(
            _RENEW,
            {"owner": terms.owner, "until": until, "ids": list(step_ids[i : i + _RENEW_CHUNK])},
            execution_options={"synchronize_session": False},
        )
        held.update(rows.scalars())
    return held


_RELEASE = (
    sa.update(Step)
    .where(
        Step.lease_owner == sa.bindparam("owner"),
        Step.status == StepStatus.RUNNING.value,
    )
    .values(lease_expires_at=sa.bindparam("now", type_=Step.lease_expires_at.type))
)


async def release(session: AsyncSession, terms: LeaseTerms) -> None:
    """Let go of every step this process holds: their leases expire now."""
    await session.execute(
        _RELEASE,
        {"owner": terms.owner, "now": clock.now() - timedelta(seconds=1)},
        execution_options={"synchronize_session": False},
    )


async def held_elsewhere(session: AsyncSession, terms: LeaseTerms, step_ids: list[str]) -> set[str]:
    """Of ``step_ids``, the steps this process no longer holds: reaped (queued again, or
    ended) or running under another process's lease."""
    if not step_ids:
        return set()
    rows = await session.execute(
        sa.select(Step.step_id, Step.status, Step.lease_owner).where(Step.step_id.in_(step_ids))
    )
    return {
        sid
        for sid, status, owner in rows.all()
        if status == StepStatus.QUEUED.value
        or (status == StepStatus.RUNNING.value and owner != terms.owner)
    }


async def expired(session: AsyncSession, *, limit: int = 50) -> list[Step]:
    """Running steps whose lease has expired (or that have none: written before leases),
    locked for reaping; steps another process is reaping are skipped."""
    stmt = (
        sa.select(Step)
        .where(
            Step.status == StepStatus.RUNNING.value,
            sa.or_(Step.lease_expires_at.is_(None), Step.lease_expires_at < clock.now()),
        )
        .order_by(Step.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list((await session.execute(stmt)).scalars())


async def held_by_earlier_self(session: AsyncSession, terms: LeaseTerms) -> list[Step]:
    """Running steps leased to an earlier incarnation of this instance that stopped renewing
    them (a sibling incarnation still alive renews every third of the lease, so its steps
    are never older than that)."""
    stale = clock.now() + timedelta(seconds=terms.lease_s - 2 * terms.renew_every_s)
    stmt = (
        sa.select(Step)
        .where(
            Step.status == StepStatus.RUNNING.value,
            Step.lease_owner.startswith(f"{terms.instance}#", autoescape=True),
            Step.lease_owner != terms.owner,
            Step.lease_expires_at < stale,
        )
        .with_for_update(skip_locked=True)
    )
    return list((await session.execute(stmt)).scalars())


async def running_steps(session: AsyncSession) -> list[Step]:
    """Every running step, locked (one process owns the database: SQLite at start)."""
    stmt = (
        sa.select(Step)
        .where(Step.status == StepStatus.RUNNING.value)
        .with_for_update(key_share=True)
    )
    return list((await session.execute(stmt)).scalars())


async def reap(tx: Tx, step: Step, terms: LeaseTerms, price_of: PriceOf) -> bool:
    """Take back a running step whose process is gone. True: it was queued again."""
    session = tx.session
    logged = await read_all_step_events(session, step.step_id)  # its end keeps them too
    streamed = any(ev.type == EventType.TOKEN.value for ev in logged)
    rerunnable = kind_of(step.type).rerunnable
    held_by = step.lease_owner or "a process before leases"
    attempts = step.attempts or 1
    if not streamed and rerunnable and attempts < terms.max_attempts:
        transition(step, StepStatus.QUEUED)
        if step.replay_of is None:
            step.replica_id = None  # placed afresh; a replay stays on its replica
        if logged:  # its log goes on where the lost execution left it
            text = (
                f"the process running this step ({held_by}) was lost before it streamed "
                f"anything; queued again for execution {attempts + 1} of {terms.max_attempts}"
            )
            seq = (logged[-1].seq or 0) + 1
            event = log_event(step.run_id, step.step_id, seq, NarrationEvent(text=text))
            await tx.append_events([event])
        return True
    why = (
        "it had streamed tokens"
        if streamed
        else "its kind does not run twice"
        if not rerunnable
        else f"it had run {attempts} times"
    )
    run = await session.get(Run, step.run_id)
    await end_interrupted(
        tx,
        step=step,
        code=WORKER_LOST,
        message=f"the process running this step ({held_by}) was lost, or kept from the "
        f"database past its lease; {why}",
        price=price_of(step, run) if run is not None else None,
        logged=logged,
    )
    return False
