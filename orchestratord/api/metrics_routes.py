"""``GET /metrics``: this process's metrics in the Prometheus text format."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Depends
from fastapi.responses import Response

from orchestrator_core.lifecycle import StepStatus
from orchestratord.api.auth import READ
from orchestratord.api.deps import orchestrator
from orchestratord.db.models import Step
from orchestratord.metrics import CONTENT_TYPE, State
from orchestratord.runtime import Orchestrator

router = APIRouter(tags=["metrics"])

_QUEUED = (
    sa.select(Step.pool_id, Step.priority, sa.func.count())
    .where(Step.status == StepStatus.QUEUED.value)
    .group_by(Step.pool_id, Step.priority)
)


@router.get(
    "/metrics",
    dependencies=[READ],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
)
async def metrics(orch: Orchestrator = Depends(orchestrator)) -> Response:
    async with orch.db.read() as session:
        rows = (await session.execute(_QUEUED)).all()
    services = orch.services
    state = State(
        queued={(pool or "control", priority): int(n) for pool, priority, n in rows},
        subscribers=orch.hub.subscribers(),
        breakers={
            "engine": services.engine_breakers.snapshot(),
            "tool": services.tool_breakers.snapshot(),
        },
        replicas=[
            (pool.pool_id, r.replica_id, r.health.live, r.health.ready, r.busy, r.slots)
            for pool in orch.pools.pools.values()
            for r in pool.replicas
        ],
        reaped={
            "queued_again": orch.keeper.requeued,
            "worker_lost": orch.keeper.reaped - orch.keeper.requeued,
        },
    )
    return Response(orch.metrics.render(state), media_type=CONTENT_TYPE)
