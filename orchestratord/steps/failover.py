"""Failover: steps queued on a pool whose replicas all take no steps go elsewhere.

A pool whose every replica is unready, drained or has its circuit breaker open serves none
of its queue. Its queued steps placed ``auto`` or by affinity are placed again, by the same
rules (``orchestrator_core.placement``), over the pools as they are now, and move when
another pool may take them; their ``placement_decision`` says where they came from
(``moved_from``). Pinned steps and replayed steps (which run where their recording ran)
stay and wait. Steps that started stay where they run.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.placement import Needs, decide, placement_rule
from orchestratord.db.engine import Database
from orchestratord.db.models import Run, Step
from orchestratord.pools.registry import PoolRegistry
from orchestratord.steps.kinds import KINDS

log = logging.getLogger(__name__)

BATCH = 256  # steps moved per transaction


async def move_queued(db: Database, pools: PoolRegistry) -> int:
    """Place again the movable steps queued on pools that take no steps; how many moved."""
    views = pools.views()
    stuck = sorted(v.pool_id for v in views if not v.ready)
    if not stuck or len(stuck) == len(views):
        return 0
    moved = 0
    async with db.write() as session:
        stmt = (
            sa.select(Step, Run.pool_policy, Run.seed_given)
            .join(Run, Run.run_id == Step.run_id)
            .where(
                Step.status == StepStatus.QUEUED.value,
                Step.pool_id.in_(stuck),
                Step.replay_of.is_(None),
            )
            .order_by(Step.priority_rank, Step.step_id)
            .limit(BATCH)
        )
        if not db.is_sqlite:
            stmt = stmt.with_for_update(of=Step, skip_locked=True)
        for step, pool_policy, seeded in (await session.execute(stmt)).all():
            placement = step.placement if step.placement is not None else pool_policy
            if placement_rule(placement) == "pin":
                continue  # honoured: it waits for its pool
            kind = KINDS.get(step.type)
            llm = kind.llm_input(step.input) if kind is not None else None
            needs = Needs.of(llm, seeded=bool(seeded))  # a seeded run's sampling step: seed
            try:
                placed = decide(placement, views, field="placement", needs=needs)
            except OrchestratorError:  # nowhere else may take it now: it waits
                continue
            if placed.pool_id == step.pool_id:
                continue
            decision = placed.as_dict()
            decision["moved_from"] = step.pool_id
            log.info("step %s moved from pool %s to %s", step.step_id, step.pool_id, placed.pool_id)
            step.pool_id = placed.pool_id
            step.placement_decision = decision
            moved += 1
    return moved
