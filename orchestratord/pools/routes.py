"""The pools this service places steps on: health, load, identity; an operator's drains.

Replica URLs, health details and capabilities are shown with their credentials masked
(``orchestratord.scrubbing``): a URL's user and password, secret query values, API keys."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends

from contracts.records import PoolOut
from orchestrator_core.errors import NotFound
from orchestratord.api.auth import ADMIN, READ
from orchestratord.api.deps import orchestrator
from orchestratord.pools.registry import Pool
from orchestratord.pools.slots import Slots
from orchestratord.runtime import Orchestrator
from orchestratord.scrubbing import scrub_pool
from orchestratord.steps.failover import move_queued
from orchestratord.steps.queries import queued_counts

router = APIRouter()


async def _views(orch: Orchestrator, pools: list[Pool]) -> list[PoolOut]:
    """The pools as shown: queues, and on PostgreSQL every process's slots and drains."""
    async with orch.db.read() as session:
        queued = await queued_counts(session)
        held = await orch.dispatcher.slots.held(session)
        drained = None if held is None else await Slots.draining(session)
    if drained is not None:
        orch.pools.saw_draining(drained)
    return [scrub_pool(p.view(queued.get(p.pool_id, 0), held), orch.scrubber) for p in pools]


@router.get("/v1/pools", dependencies=[READ], response_model=list[PoolOut], tags=["pools"])
async def list_pools(orch: Orchestrator = Depends(orchestrator)) -> list[PoolOut]:
    return await _views(orch, list(orch.pools.pools.values()))


@router.get("/v1/pools/{pool_id}", dependencies=[READ], response_model=PoolOut, tags=["pools"])
async def get_pool(pool_id: str, orch: Orchestrator = Depends(orchestrator)) -> PoolOut:
    (view,) = await _views(orch, [orch.pools.require(pool_id)])
    return view


async def _drain(orch: Orchestrator, pool_id: str, replica_id: str, on: bool) -> PoolOut:
    pool = orch.pools.require(pool_id)
    replica = pool.replica(replica_id)
    if replica is None:
        raise NotFound("replica", f"{pool_id}/{replica_id}")
    async with orch.db.write() as session:
        await orch.dispatcher.slots.set_draining(session, pool, replica_id, on)
    replica.draining = on
    if on:  # its pool may take no steps now: its queue goes elsewhere where it may
        await move_queued(orch.db, orch.pools)
    orch.dispatcher.wake()  # steps may wait for its slots, or were moved
    (view,) = await _views(orch, [pool])
    return view


def _drain_route(on: bool) -> Callable[..., Awaitable[PoolOut]]:
    async def route(
        pool_id: str, replica_id: str, orch: Orchestrator = Depends(orchestrator)
    ) -> PoolOut:
        return await _drain(orch, pool_id, replica_id, on)

    route.__name__ = "drain_replica" if on else "undrain_replica"
    return route


for _on, _action, _summary in (
    (True, "drain", "Drain a replica: no new steps in any process; its running steps finish"),
    (False, "undrain", "Undrain a replica: it takes steps again"),
):
    router.add_api_route(
        f"/v1/pools/{{pool_id}}/replicas/{{replica_id}}/{_action}",
        _drain_route(_on),
        methods=["POST"],
        dependencies=[ADMIN],
        response_model=PoolOut,
        tags=["pools"],
        summary=_summary,
    )
