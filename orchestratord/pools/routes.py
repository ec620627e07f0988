"""The pools this service places steps on: health, load, identity; an operator's drains.

Replica URLs, health details and capabilities are shown with their credentials masked
(``orchestratord.scrubbing``): a URL's user and password, secret query values, API keys."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Response

from contracts.records import PoolOut
from orchestrator_core.errors import NotFound
from orchestratord.api.auth import ADMIN, READ
from orchestratord.api.deps import orchestrator
from orchestratord.pools.config import PoolSpec
from orchestratord.pools.provisioning.request import ProvisionRequest
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
    return [
        scrub_pool(_with_record(orch, p.view(queued.get(p.pool_id, 0), held)), orch.scrubber)
        for p in pools
    ]


def _with_record(orch: Orchestrator, view: PoolOut) -> PoolOut:
    """Where the pool comes from, as its row says."""
    record = orch.catalog.records.get(view.pool_id)
    if record is None:
        return view
    return view.model_copy(update={"source": record.source, "provision": record.provision})


@router.get("/v1/pools", dependencies=[READ], response_model=list[PoolOut], tags=["pools"])
async def list_pools(orch: Orchestrator = Depends(orchestrator)) -> list[PoolOut]:
    return await _views(orch, list(orch.pools.pools.values()))


@router.get("/v1/pools/{pool_id}", dependencies=[READ], response_model=PoolOut, tags=["pools"])
async def get_pool(pool_id: str, orch: Orchestrator = Depends(orchestrator)) -> PoolOut:
    (view,) = await _views(orch, [orch.pools.require(pool_id)])
    return view


async def _made(orch: Orchestrator, pool: Pool, created: bool, response: Response) -> PoolOut:
    """A pool made (201), or found as the same request made it before (200)."""
    if not created:
        response.status_code = 200
    (view,) = await _views(orch, [pool])
    return view


@router.post(
    "/v1/pools",
    dependencies=[ADMIN],
    response_model=PoolOut,
    status_code=201,
    tags=["pools"],
    summary="Create a pool (its body as the pools file writes one); every process serves it",
    responses={200: {"description": "The same pool existed: nothing changed"}},
)
async def create_pool(
    spec: PoolSpec, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> PoolOut:
    return await _made(orch, *await orch.catalog.create(spec, "api"), response)


@router.post(
    "/v1/pools/provision",
    dependencies=[ADMIN],
    response_model=PoolOut,
    status_code=201,
    tags=["pools"],
    summary="Start engines on this host and serve them as a pool once healthy",
    responses={200: {"description": "The same request made this pool already"}},
)
async def provision_pool(
    body: ProvisionRequest, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> PoolOut:
    return await _made(orch, *await orch.provisioning.provision(body), response)


@router.delete(
    "/v1/pools/{pool_id}",
    dependencies=[ADMIN],
    status_code=204,
    tags=["pools"],
    summary="Remove a pool no step runs or waits on; a provisioned pool's engines stop",
)
async def delete_pool(pool_id: str, orch: Orchestrator = Depends(orchestrator)) -> Response:
    await orch.provisioning.delete(pool_id)
    return Response(status_code=204)


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
