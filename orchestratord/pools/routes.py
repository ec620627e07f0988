"""The pools this service places steps on: health, load, identity."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from contracts.records import PoolOut
from orchestratord.api.deps import orchestrator
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import queued_counts

router = APIRouter()


@router.get("/v1/pools", response_model=list[PoolOut], tags=["pools"])
async def list_pools(orch: Orchestrator = Depends(orchestrator)) -> list[PoolOut]:
    async with orch.db.read() as session:
        queued = await queued_counts(session)
    return [p.view(queued.get(p.pool_id, 0)) for p in orch.pools.pools.values()]


@router.get("/v1/pools/{pool_id}", response_model=PoolOut, tags=["pools"])
async def get_pool(pool_id: str, orch: Orchestrator = Depends(orchestrator)) -> PoolOut:
    pool = orch.pools.require(pool_id)
    async with orch.db.read() as session:
        queued = await queued_counts(session)
    return pool.view(queued.get(pool_id, 0))
