"""Forks: a new run that starts where a checkpoint of another run left off.

The fork is a ``record`` run of the same flow with the parent's seed, policy, budget limits,
placement, file-system policy and price table. It holds copies of the parent's facts up to
the checkpoint (its ``last_fact_id`` cursor; for a checkpoint taken before cursors were
kept, the facts appended before it) and a copy of the checkpoint, and says where it came
from in ``forked_from``. The copied facts are ``fact`` events on its stream, in order. Its
usage starts at zero; the parent is not touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import FactEvent
from contracts.runs import RunFork
from orchestrator_core import clock
from orchestrator_core.errors import InvalidParams
from orchestrator_core.lifecycle import RunStatus
from orchestratord.db.models import Checkpoint, Fact, Run
from orchestratord.eventlog import log_event
from orchestratord.facts.rows import fact_row
from orchestratord.fs.guard import FsGuard
from orchestratord.idempotency import Token
from orchestratord.runs.service import NEW_RUN_ACCOUNT, get_run
from orchestratord.tx import Tx


async def _facts_until(session: AsyncSession, checkpoint: Checkpoint) -> list[Fact]:
    stmt = sa.select(Fact).where(Fact.run_id == checkpoint.run_id)
    last = (checkpoint.cursors or {}).get("last_fact_id", ...)
    if last is None:  # the run had no fact yet
        return []
    if last is ...:  # taken before checkpoints kept cursors
        stmt = stmt.where(Fact.created_at <= checkpoint.created_at)
    else:
        anchor = sa.select(Fact.id).where(Fact.fact_id == last).scalar_subquery()
        stmt = stmt.where(Fact.id <= anchor)
    return list((await session.execute(stmt.order_by(Fact.id))).scalars())


async def fork_run(tx: Tx, *, run_id: str, body: RunFork, fs: FsGuard) -> Run:
    """The fork; its parent's ``fs_policy`` roots must still be in ``fs``'s bounds."""
    session = tx.session
    parent = await get_run(session, run_id=run_id)
    await fs.admit(parent.fs_policy)
    checkpoint = await session.get(Checkpoint, body.checkpoint_id)
    if checkpoint is None or checkpoint.run_id != run_id:
        raise InvalidParams("no checkpoint with this id in the run", field="checkpoint_id")
    now = clock.now()
    fork = Run(
        run_id=clock.new_id("run"),
        flow_id=parent.flow_id,
        mode="record",
        seed=parent.seed,
        seed_given=parent.seed_given,
        source_run_id=None,
        status=RunStatus.RUNNING.value,
        budgets=parent.budgets,
        policy=parent.policy,
        policy_hash=parent.policy_hash,
        price_table=parent.price_table,
        pool_policy=parent.pool_policy,
        fs_policy=parent.fs_policy,
        cancel_on_disconnect=parent.cancel_on_disconnect,
        **NEW_RUN_ACCOUNT,
        forked_from={"run_id": parent.run_id, "checkpoint_id": checkpoint.checkpoint_id},
        created_at=now,
        updated_at=now,
    )
    token = Token.of(body)
    if token is not None:
        token.stamp(fork)
    session.add(fork)
    await session.flush()
    copies = [
        fact_row(
            run_id=fork.run_id,
            type=f.type,
            data=f.data,
            emitted_by_step=None,
            schema_uri=f.schema_uri,
        )
        for f in await _facts_until(session, checkpoint)
    ]
    session.add_all(copies)
    session.add(
        Checkpoint(
            checkpoint_id=clock.new_id("ckpt"),
            run_id=fork.run_id,
            step_id=None,
            state=checkpoint.state,
            state_hash=checkpoint.state_hash,
            cursors={
                **(checkpoint.cursors or {}),
                "last_fact_id": copies[-1].fact_id if copies else None,
                "last_step_position": -1,
            },
            created_at=now,
        )
    )
    await session.flush()
    await tx.append_events(
        [
            log_event(
                fork.run_id,
                None,
                None,
                FactEvent(
                    fact_id=f.fact_id,
                    fact_type=f.type,
                    data=f.data,
                    schema_uri=f.schema_uri,
                    emitted_by_step=None,
                ),
            )
            for f in copies
        ]
    )
    return fork
