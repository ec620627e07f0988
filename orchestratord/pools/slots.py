"""Replica slots, held across processes.

A replica takes at most ``slots`` requests at a time, whichever process sends them.

* SQLite serves one process: the process's own count (``Replica.busy``) is the replica's.
* PostgreSQL may serve several processes on one database. A slot is held by a step whose row
  says it runs on that replica (``status = 'running'``): it is taken by the claim's
  transaction, given back by the step's end, and by its lease's reaping when its process
  died. A claim counts those rows through ``orchestratord_slots_held`` (alembic 0010), which
  first takes the pool's advisory lock, held to the end of the claim's transaction, and
  counts on a snapshot taken after it: two processes never both take a replica's last slot.
  A step that starts in its submission's one statement asks ``orchestratord_slot_free`` for
  its replica in that statement (``steps/submission/statements.py``).

A replica an operator drains (``replica_states``) takes no new step in any process: the
drain is written under the pool's lock, and both functions read it under that lock.

Locks are taken in one order: a pool's slot lock before an admission lock or a run's row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import ReplicaState, Step

if TYPE_CHECKING:
    from orchestratord.pools.registry import Pool

_HELD_UNDER_LOCK = sa.text(
    "SELECT replica_id, held, draining FROM orchestratord_slots_held(:pool_id)"
)
_POOL_LOCK = sa.text("SELECT pg_advisory_xact_lock(7100, hashtext(:pool_id))")
_DRAINING = sa.select(ReplicaState.pool_id, ReplicaState.replica_id).where(
    ReplicaState.draining.is_(True)
)
_HELD_NOW = (
    sa.select(Step.pool_id, Step.replica_id, sa.func.count())
    .where(
        Step.status == StepStatus.RUNNING.value,
        Step.pool_id.is_not(None),
        Step.replica_id.is_not(None),
    )
    .group_by(Step.pool_id, Step.replica_id)
)

# ``orchestratord_slot_free(pool, replica, slots)``: whether the replica has a slot, the
# pool's lock taken (for the one-statement submission)
slot_free = sa.func.orchestratord_slot_free


class Slots:
    """Where a process learns the slots other processes hold."""

    def __init__(self, *, shared: bool) -> None:
        self.shared = shared

    async def look(self, session: AsyncSession, pool: Pool) -> None:
        """Before taking slots of ``pool`` in ``session``'s transaction: on PostgreSQL, the
        pool's lock (held to the transaction's end), and what the other processes hold."""
        if not self.shared:
            return
        rows = (await session.execute(_HELD_UNDER_LOCK, {"pool_id": pool.pool_id})).all()
        pool.saw_held({str(replica): int(n) for replica, n, _ in rows})
        pool.saw_draining({str(replica) for replica, _, draining in rows if draining})

    async def held(self, session: AsyncSession) -> dict[tuple[str, str], int] | None:
        """Slots held now per (pool, replica), every process counted (no lock: a view);
        None on SQLite, where this process's own count is the whole."""
        if not self.shared:
            return None
        rows = (await session.execute(_HELD_NOW)).all()
        return {(str(pool), str(replica)): int(n) for pool, replica, n in rows}

    @staticmethod
    async def draining(session: AsyncSession) -> set[tuple[str, str]]:
        """The (pool, replica) pairs an operator drained."""
        return {(str(p), str(r)) for p, r in (await session.execute(_DRAINING)).all()}

    async def set_draining(self, session: AsyncSession, pool: Pool, replica: str, on: bool) -> None:
        """Drain (``on``) or undrain a replica, in ``session``'s transaction. On PostgreSQL
        under the pool's lock: once this commits, no process claims a step there."""
        if self.shared:
            await session.execute(_POOL_LOCK, {"pool_id": pool.pool_id})
        row = {"pool_id": pool.pool_id, "replica_id": replica}
        state = await session.get(ReplicaState, (pool.pool_id, replica))
        if state is None:
            session.add(ReplicaState(**row, draining=on, updated_at=clock.now()))
        else:
            state.draining, state.updated_at = on, clock.now()
