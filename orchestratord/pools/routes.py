"""The pools this service places steps on: health, load, identity.

Replica URLs, health details and capabilities are shown with their credentials masked
(``orchestratord.scrubbing``): a URL's user and password, secret query values, API keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from contracts.records import PoolOut
from orchestratord.api.auth import READ
from orchestratord.api.deps import orchestrator
from orchestratord.runtime import Orchestrator
from orchestratord.scrubbing import scrub_pool
from orchestratord.steps.queries import queued_counts

router = APIRouter()


@router.get("/v1/pools", dependencies=[READ], response_model=list[PoolOut], tags=["pools"])
async def list_pools(orch: Orchestrator = Depends(orchestrator)) -> list[PoolOut]:
    async with orch.db.read() as session:
        queued = await queued_counts(session)
        held = await orch.dispatcher.slots.held(session)
    return [
        scrub_pool(p.view(queued.get(p.pool_id, 0), held), orch.scrubber)
        for p in orch.pools.pools.values()
    ]


@router.get("/v1/pools/{pool_id}", dependencies=[READ], response_model=PoolOut, tags=["pools"])
async def get_pool(pool_id: str, orch: Orchestrator = Depends(orchestrator)) -> PoolOut:
    pool = orch.pools.require(pool_id)
    async with orch.db.read() as session:
        queued = await queued_counts(session)
        held = await orch.dispatcher.slots.held(session)
    return scrub_pool(pool.view(queued.get(pool_id, 0), held), orch.scrubber)
