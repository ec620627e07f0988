"""Flows: the example resource to copy (see CONTRIBUTING.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from contracts.flows import FlowCreate, FlowCreated, FlowOut
from orchestratord.api.auth import READ, WRITE
from orchestratord.api.deps import orchestrator
from orchestratord.flows import service as repo
from orchestratord.runtime import Orchestrator

router = APIRouter(tags=["flows"])


@router.post(
    "/v1/flows",
    dependencies=[WRITE],
    status_code=201,
    response_model=FlowCreated,
    responses={200: {"model": FlowCreated, "description": "the same content was stored before"}},
)
async def create_flow(
    body: FlowCreate, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> FlowCreated:
    async def create() -> tuple[FlowCreated, bool]:
        async with orch.tx() as tx:
            flow, created = await repo.create_flow(tx.session, body=body, limits=orch.flow_limits)
            return FlowCreated.model_validate(flow, from_attributes=True), created

    # the flow's schemas are checked on a worker thread, before its transaction
    out, created = await orch.validation.offloading(create)
    if not created:
        response.status_code = 200
    return out


@router.get("/v1/flows/{flow_id}", dependencies=[READ], response_model=FlowOut)
async def get_flow(flow_id: str, orch: Orchestrator = Depends(orchestrator)) -> FlowOut:
    async with orch.db.read() as session:
        flow = await repo.get_flow(session, flow_id=flow_id)
        return FlowOut.model_validate(flow, from_attributes=True)


@router.get("/v1/flows:by-hash/{content_hash}", dependencies=[READ], response_model=FlowOut)
async def get_flow_by_hash(
    content_hash: str, orch: Orchestrator = Depends(orchestrator)
) -> FlowOut:
    async with orch.db.read() as session:
        flow = await repo.get_flow_by_hash(session, content_hash=content_hash)
        return FlowOut.model_validate(flow, from_attributes=True)
